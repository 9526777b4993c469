"""evolution: how much the offline evolution loops improve three canonical agents, what each spent in item
rollouts to get there, and how fast the genealogy of a long lineage reads.

Setup, in a dedicated database (bench_evolution, dropped afterwards), offline (no provider key: the
offline chat model answers, the offline embedder indexes): one fresh workspace per mode, each with the
demo corpus ingested (knowledge.demo.seed) and the 7 canonical agents seeded (evals.agents.seed_agents).
The modes get a workspace each so that neither reuses the other's results: a version's results on an
item are reused within a workflow, and every workspace has its own workflows.

1. GP (genetic programming): on each of `--agents` (Research Analyst, Content Strategist, Bug Triage
   Assistant: their base versions answer in prose where the golden sets expect JSON fields, and only
   the Research Analyst searches the knowledge base, so their sets leave room; base fitness 18-24),
   an evolution run of `--generations` x `--population` (5 x 8) with `--seed`, started by
   evolution.services.evolution_start and driven in-process by durable.inprocess.run_until_settled
   (the same claims and checkpoints as workers; one run at a time on this 2-core machine). The
   benchmark measures search quality and rollouts, not throughput: wall times are reported for
   information only. Per generation: best / average / worst fitness, evaluations (full eval runs),
   item rollouts, cache hits, wall time; per run the lift of the best version over the base, both
   measured by the same eval (EvolutionRun.base_fitness, best_fitness: on the train split when the set
   carries a held-out claim), and the held-out result (EvolutionRun.report): train / validation / test
   fitness of base and best, the lift on the test split (which nothing in the search read) with its 95%
   interval and paired test, and the train-test gap.
2. Reflective (GEPA-style) on the same agents with the same budget (generations x population
   proposals), and the item rollouts each mode spent to reach its best: the run's cumulative rollouts
   (Generation.stats["run_rollouts"]) at the first generation whose run best is the final best, and
   the rollouts reflective spent to reach GP's lift the same way. A generation is the grain (the
   target is read there), so these are the rollouts at the end of that generation; for information
   the same counts at the grain of the eval run that reached it (eval_ledger). On held-out items (the
   headline when both runs carry the claim) each version the run held as its best is scored on the test
   split after the run, and the rollouts counted are the run's when it first held one as good as GP's
   best there (Generation.stats["run_best_changes"]: GP changes its best at the end of a generation,
   after validating it; the reflective mode as an accepted candidate is validated), even if a later
   best of the run scores lower on test.
3. Genealogy: two lineages of depth `--depth` (1,000), each version the child of the previous
   (workflows.services.workflow_version_create with parents=): one linear, one with 10 crossovers
   (every 100 versions) that each merge back a 9-version side branch started 20 versions earlier, so
   the older ancestors are reached along paths of several lengths; then workflows.selectors
   version_ancestors(deepest) and version_descendants(root) of each, median and p95 over `--repeats`
   calls, with the (version, depth) rows the recursive query walked (EXPLAIN ANALYZE).

Targets: GP lifts each agent's fitness on the test split by at least +10% (on the whole set for a set
without a held-out claim, said in the target); reflective reaches GP's lift with at most a
third of GP's rollouts; each genealogy query under 20 ms (median and p95) at depth 1,000.

    make bench NAME=evolution
    python -m bench evolution [--generations 5] [--population 8] [--seed 0] [--agents "A,B,C"]
                              [--depth 1000] [--repeats 50]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import time

from bench import common

NAME = "evolution"
BENCH_DB = "bench_evolution"
MODES = ("gp", "reflective")
DEFAULT_AGENTS = ("Research Analyst", "Content Strategist", "Bug Triage Assistant")
TARGET_LIFT = 0.10
TARGET_ROLLOUT_SHARE = 1 / 3
TARGET_GENEALOGY_MS = 20.0
TEST_TOLERANCE = 1e-4  # fitness points: a test score this close to the one to reach reaches it (rounding)
CROSSOVERS = 10  # crossovers along the main line of the genealogy, evenly spaced
BRANCH_LENGTH = 9  # versions of the side branch each crossover merges back
BRANCH_START = 20  # versions back on the main line where the side branch starts


# ----------------------------------------------------------------------------------------------- setup


def force_offline() -> None:
    """Before Django is set up: no provider key, the offline chat model and embedder."""
    os.environ["OPENAI_API_KEY"] = ""
    os.environ["LLM_PROVIDER"] = "offline"
    os.environ["EMBEDDING_PROVIDER"] = "offline"
    os.environ.pop("EMBEDDING_MODEL", None)


def check_offline() -> str:
    """The provider the canonical agents' models resolve to; refuses anything but the offline one."""
    from evals.agents import model_tiers
    from llm.names import resolve_model
    from llm.providers import OFFLINE_PROVIDER

    for model in model_tiers().values():
        provider = resolve_model(model).provider
        if provider != OFFLINE_PROVIDER:
            raise SystemExit(f"{model} resolves to {provider!r}: this benchmark runs offline only")
    return OFFLINE_PROVIDER


class _Say(io.TextIOBase):
    def write(self, text: str) -> int:
        if text.strip():
            common.say(text.strip())
        return len(text)


def prepare(modes=MODES, agents=DEFAULT_AGENTS, *, stdout=None) -> dict:
    """One fresh workspace per mode, each with the demo corpus ingested and the canonical agents seeded.
    Returns {mode: {"workspace", "agents": {name: {"workflow", "golden_set"}}, ...}}."""
    from evals.agents import seed_agents
    from evals.models import GoldenSet
    from knowledge import demo
    from knowledge.models import KnowledgeSource
    from workspaces.models import Workspace

    check_offline()
    stdout = stdout or _Say()
    out = {}
    for mode in modes:
        started = time.perf_counter()
        demo.seed(stdout)  # ingests into the workspace with the slug "demo", created when missing
        workspace = demo.demo_workspace()
        # renamed, so the next mode's seed makes a fresh "demo" workspace of its own
        Workspace.objects.filter(pk=workspace.pk).update(slug=f"bench-{mode}", name=f"bench {mode}")
        workspace.refresh_from_db()
        report = seed_agents(workspace=workspace)
        sets = {s.workflow.name: s for s in GoldenSet.objects.filter(workspace=workspace, workflow__isnull=False)
                .select_related("workflow")}
        missing = [name for name in agents if name not in sets]
        if missing:
            raise SystemExit(f"no canonical agent named {', '.join(missing)}; seeded: {', '.join(sorted(sets))}")
        sources = KnowledgeSource.objects.filter(workspace=workspace)
        out[mode] = {
            "workspace": workspace,
            "agents": {name: {"workflow": sets[name].workflow, "golden_set": sets[name]} for name in agents},
            "sources": sources.count(),
            "indexed": sources.filter(ingest_status=KnowledgeSource.Status.INDEXED).count(),
            "chunks": sum(sources.values_list("chunk_count", flat=True)),
            "agents_seeded": len(report.agents),
            "seconds": round(time.perf_counter() - started, 2),
        }
    return out


# ------------------------------------------------------------------------------------------ evolution


def run_evolution(*, workflow, golden_set, mode: str, config: dict, max_wait: float = 3600.0) -> dict:
    """Start an evolution run and drive it (its eval runs and their invocations) in this process until it
    ends; returns what it measured, per generation and in total."""
    from durable.inprocess import run_until_settled
    from evolution.models import EvolutionRun, Generation
    from evolution.services import evolution_start

    started = time.perf_counter()
    run = evolution_start(workflow=workflow, golden_set=golden_set, mode=mode, config=config)
    run_until_settled(run.durable_run_id, max_wait=max_wait, max_iterations=1_000_000)
    wall = time.perf_counter() - started
    run.refresh_from_db()
    generations, previous = [], {"run_evaluations": 0, "run_rollouts": 0, "run_cache_hits": 0}
    for generation in Generation.objects.filter(evolution_run=run).order_by("number"):
        stats = generation.stats
        generations.append({
            "number": generation.number, "members": stats.get("members"),
            "best": stats.get("best"), "avg": stats.get("avg"), "worst": stats.get("worst"),
            "best_version_id": generation.best_workflow_version_id,
            "run_best": stats.get("run_best_fitness"), "run_best_version_id": stats.get("run_best_version_id"),
            "evaluations": stats.get("run_evaluations", 0) - previous["run_evaluations"],
            "rollouts": stats.get("run_rollouts", 0) - previous["run_rollouts"],
            "cache_hits": stats.get("run_cache_hits", 0) - previous["run_cache_hits"],
            "run_rollouts": stats.get("run_rollouts", 0),
            "run_best_changes": [dict(change) for change in stats.get("run_best_changes") or []],
            "wall_s": round((generation.ended_at - generation.started_at).total_seconds(), 3)
            if generation.started_at and generation.ended_at else None,
        })
        previous = stats
    # where the final best first appeared: the first generation whose run best is it
    found = next((g for g in generations if g["run_best_version_id"] == run.best_version_id), None)
    best = run.best_version
    ledger = eval_ledger(run)
    return {
        "run_id": run.pk, "mode": mode, "status": run.status, "error": run.error, "stop_reason": run.stop_reason,
        "base_version_id": run.base_version_id, "best_version_id": run.best_version_id,
        "best_operation": getattr(best, "operation", None),
        "best_commit_message": getattr(best, "commit_message", "")[:300] if best else None,
        "base_fitness": run.base_fitness, "best_fitness": run.best_fitness,
        "lift": run.lift, "held_out": run.held_out, "test_lift": run.test_lift, "report": held_out_of(run.report),
        "generations_done": run.generations_done, "evaluations": run.evaluations, "rollouts": run.rollouts,
        "cache_hits": run.cache_hits, "usd_cost": f"{run.usd_cost:f}", "wall_s": round(wall, 2),
        "generation_of_best": found["number"] if found else None,
        "rollouts_to_best": found["run_rollouts"] if found else None,
        "rollouts_to_best_by_eval_run": _ledger_reach(ledger, run.best_fitness),
        "generations": generations, "ledger": ledger,
        "completed": run.status == EvolutionRun.Status.COMPLETED,
    }


def held_out_of(report: dict) -> dict:
    """The run's generalization result as the tables show it: fitness of base and best on train / validation /
    test (or the whole set without a held-out claim), the test lift with its 95% interval, the paired test."""
    report = report or {}
    test = report.get("test") or {}
    comparison = test.get("comparison") or {}
    sides = {role: {key: value for key, value in (report.get(role) or {}).items() if key != "version_id"}
             for role in ("base", "best")}
    return {"held_out": report.get("held_out"), "reason": report.get("reason", ""), "splits": report.get("splits"),
            **sides, "test_lift": test.get("lift"), "test_lift_low": test.get("lift_low"),
            "test_lift_high": test.get("lift_high"), "test_items": test.get("paired"),
            "verdict": comparison.get("verdict"), "p_value": comparison.get("p_value"),
            "train_test_gap": report.get("train_test_gap"), "test_error": report.get("test_error", "")}


def eval_ledger(run) -> list[dict]:
    """The run's eval runs in the order they were created (its durable run's children): each one's
    cumulative fresh rollouts (the run's definition: item invocations run, reused results excluded) and
    its fitness when it scored the search's set (None for a minibatch, validation or test). A finer grain than
    the generation, for information: GP creates a generation's eval runs together and this orders them by creation."""
    from django.db.models import Count

    from durable.models import DurableRun
    from evals.models import EvalRun, GoldenResult

    children = DurableRun.objects.filter(parent_id=run.durable_run_id).values("pk")
    eval_runs = list(EvalRun.objects.filter(durable_run_id__in=children).order_by("pk")
                     .values_list("pk", "fitness", "config", "workflow_version_id"))
    fresh = dict(GoldenResult.objects.filter(eval_run_id__in=[pk for pk, *_ in eval_runs], reused_from__isnull=True,
                                             workflow_invocation__isnull=False)
                 .values("eval_run").annotate(n=Count("pk")).values_list("eval_run", "n"))
    # the search's own set: the whole set, or its train split when the run carries a held-out claim (minibatches,
    # validation and test eval runs score fewer items)
    searched = ((run.report or {}).get("splits") or {}).get("train") if run.held_out else None
    ledger, total = [], 0
    for pk, fitness, config, version in eval_runs:
        total += fresh.get(pk, 0)
        items = (config or {}).get("item_ids")
        full = items is None or (searched is not None and len(items) == searched)
        ledger.append({"eval_run": pk, "version_id": version, "full_set": full,
                       "fitness": fitness if full else None, "run_rollouts": total})
    return ledger


def _ledger_reach(ledger: list[dict], fitness: float | None) -> int | None:
    if fitness is None:
        return None
    return next((e["run_rollouts"] for e in ledger if e["fitness"] is not None and e["fitness"] >= fitness - 1e-6),
                None)


def rollouts_to_reach(result: dict, lift: float | None) -> int | None:
    """The run's cumulative rollouts at the first generation whose run best reaches `lift` over its
    base (None when it never does). Fitness is compared with a 1e-6 tolerance: equal fitness, reached."""
    base = result["base_fitness"]
    if lift is None or not base:
        return None
    wanted = base * (1 + lift) - 1e-6
    for generation in result["generations"]:
        if generation["run_best"] is not None and generation["run_best"] >= wanted:
            return generation["run_rollouts"]
    return None


def score_run_bests_on_test(result: dict, golden_set) -> None:
    """After the run, and read by nothing in it: each version the run held as its best scored on the test split
    (an eval run of its own, reusing results of the same version on the same item), so the comparison can tell
    when a mode first held a version that does as well on held-out items as GP's best. Sets "run_best_test" on
    each generation and "test" on each change of its best (None without a held-out claim)."""
    from durable.inprocess import run_until_settled
    from durable.services import run_start
    from evals.durable_workflows import EVAL_WORKFLOW
    from evals.selectors import split_items
    from evals.services import eval_run_prepare
    from workflows.models import WorkflowVersion

    test_ids = split_items(golden_set)["test"] if result["held_out"] else []
    fitness: dict[int, float | None] = {}
    for version_id in dict.fromkeys(change["version_id"] for change in _best_changes(result)):
        if test_ids and version_id not in fitness:
            eval_run = eval_run_prepare(golden_set=golden_set, version=WorkflowVersion.objects.get(pk=version_id),
                                        item_ids=test_ids)
            durable = run_start(workflow=EVAL_WORKFLOW, input={"eval_run_id": eval_run.pk},
                                run_id=f"eval-{eval_run.pk}", namespace=golden_set.workspace.namespace,
                                tags=["eval", "bench:test-split"])
            eval_run.durable_run_id = durable.pk
            eval_run.save(update_fields=["durable_run", "updated_at"])
            run_until_settled(durable.pk, max_wait=600.0, max_iterations=1_000_000)
            eval_run.refresh_from_db()
            fitness[version_id] = eval_run.fitness
    for generation in result["generations"]:
        generation["run_best_test"] = fitness.get(generation["run_best_version_id"])
        for change in generation["run_best_changes"]:
            change["test"] = fitness.get(change["version_id"])


def _best_changes(result: dict) -> list[dict]:
    """Each change of the run's best in order (every generation's run best is the last change up to its row)."""
    return [change for g in result["generations"] for change in g["run_best_changes"]]


def _reach_on_test(result: dict, wanted: float) -> int | None:
    """The run's cumulative rollouts when it first held a best scoring `wanted` on test (at the change of its best,
    Generation.stats["run_best_changes"]), even if a later best scores lower there."""
    return next((c["run_rollouts"] for c in _best_changes(result)
                 if c.get("test") is not None and c["test"] >= wanted - TEST_TOLERANCE), None)


def compare_on_test(gp: dict, reflective: dict) -> dict:
    """Reflective against GP on the held-out items: the rollouts reflective spent until its run best did as well
    on the test split as GP's best (the same lift over its base), against the rollouts GP spent until its own
    run best did. The headline comparison when both runs carry a held-out claim."""
    gp_lift = gp["test_lift"]
    if not (gp["held_out"] and reflective["held_out"]) or gp_lift is None or gp_lift <= 0:
        note = "no held-out claim" if not gp["held_out"] else "GP did not lift the test score: nothing to reach"
        return {"gp_test_lift": gp_lift, "met": False, "share_of_gp_rollouts": None, "note": note}
    gp_best_test, gp_base_test = gp["report"]["best"]["test"], gp["report"]["base"]["test"]
    gp_needed = _reach_on_test(gp, gp_best_test)
    # GP's ratio of test fitnesses, not its rounded lift (the bases score alike: the same agent, the same items)
    base_test = reflective["report"]["base"]["test"]
    needed = _reach_on_test(reflective, base_test * gp_best_test / gp_base_test) if base_test else None
    share = round(needed / gp_needed, 4) if needed is not None and gp_needed else None
    return {"gp_test_lift": gp_lift, "gp_rollouts_to_test_lift": gp_needed,
            "reflective_test_lift": reflective["test_lift"], "reflective_rollouts_to_gp_test_lift": needed,
            "share_of_gp_rollouts": share,
            "met": share is not None and share <= TARGET_ROLLOUT_SHARE + 1e-9, "note": ""}


def compare(gp: dict, reflective: dict) -> dict:
    """Reflective against GP on one agent: the rollouts reflective spent to reach GP's lift, against the
    rollouts GP spent to reach it (its best)."""
    gp_lift, gp_rollouts = gp["lift"], gp["rollouts_to_best"]
    improved = gp_lift is not None and gp_lift > 0
    needed = rollouts_to_reach(reflective, gp_lift) if improved else None
    share = round(needed / gp_rollouts, 4) if needed is not None and gp_rollouts else None
    # for information, at the eval-run grain (see eval_ledger)
    fine_gp = gp["rollouts_to_best_by_eval_run"]
    fine = _ledger_reach(reflective["ledger"], reflective["base_fitness"] * (1 + gp_lift)) if improved else None
    return {
        "gp_lift": gp_lift, "gp_rollouts_to_best": gp_rollouts, "reflective_lift": reflective["lift"],
        "reflective_rollouts_to_best": reflective["rollouts_to_best"],
        "reflective_reached_gp_lift": needed is not None, "reflective_rollouts_to_gp_lift": needed,
        "share_of_gp_rollouts": share, "met": share is not None and share <= TARGET_ROLLOUT_SHARE + 1e-9,
        "by_eval_run": {"gp_rollouts_to_best": fine_gp, "reflective_rollouts_to_gp_lift": fine,
                        "share_of_gp_rollouts": round(fine / fine_gp, 4) if fine is not None and fine_gp else None},
        "note": "" if improved else "GP did not improve on its base: nothing to reach",
    }


# ------------------------------------------------------------------------------------------- genealogy


def _genealogy_dsl(index: int, branch: str = "") -> dict:
    return {"entryNodeId": "agent", "nodes": [{
        "nodeId": "agent", "description": "A version of the genealogy benchmark.",
        "systemPrompt": f"You are version {index}{branch} of the genealogy benchmark.", "modelName": "gpt-4.1-mini",
        "codeTools": [], "mcpTools": [], "handOffs": [], "handOffType": "sequential", "waitFor": [],
        "requiresApproval": False, "maxSteps": 5, "skills": []}]}


def crossover_every(depth: int) -> int:
    return max(BRANCH_START + 1, depth // CROSSOVERS)


def build_lineage(workspace, depth: int, *, crossovers: bool) -> dict:
    """A root and `depth` versions each the child of the previous. With `crossovers`, every
    crossover_every(depth) versions (100 at depth 1,000) the main line's version is a crossover of its
    predecessor and the tip of a BRANCH_LENGTH-version side branch started BRANCH_START versions
    earlier, as GP's crossovers of parents of different ages make them: the ancestors above the
    branch's start are reached along two paths of different lengths (20 and 10 generations). Returns
    the root, the deepest version and what was written."""
    from workflows.models import WorkflowVersion
    from workflows.services import workflow_create, workflow_version_create

    Op = WorkflowVersion.Operation
    shape = "crossovers" if crossovers else "linear"
    workflow = workflow_create(workspace=workspace, name=f"genealogy benchmark, {shape} ({depth})",
                               description="A lineage written by bench/evolution.py.")
    started = time.perf_counter()
    root, _ = workflow_version_create(workflow=workflow, dsl=_genealogy_dsl(0), operation=Op.INIT)
    chain, merged, side, every = [root], 0, 0, crossover_every(depth)
    for index in range(1, depth + 1):
        previous = chain[-1]
        if crossovers and index % every == 0:
            tip = chain[index - BRANCH_START]
            for step in range(BRANCH_LENGTH):
                tip, _ = workflow_version_create(workflow=workflow, dsl=_genealogy_dsl(index, f"b{step}"),
                                                 operation=Op.MUTATION, parents=(tip,), generation=index)
                side += 1
            version, _ = workflow_version_create(workflow=workflow, dsl=_genealogy_dsl(index), operation=Op.CROSSOVER,
                                                 parents=(previous, tip), generation=index)
            merged += 1
        else:
            version, _ = workflow_version_create(workflow=workflow, dsl=_genealogy_dsl(index), operation=Op.MUTATION,
                                                 parents=(previous,), generation=index)
        chain.append(version)
    return {"workflow": workflow, "root": root, "deepest": chain[-1], "versions": len(chain) + side,
            "main_line": len(chain), "side_versions": side, "crossovers": merged,
            "build_s": round(time.perf_counter() - started, 2)}


def _time(call, repeats: int, warmup: int = 3) -> tuple[dict, list]:
    for _ in range(warmup):
        rows = call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        rows = call()
        samples.append(time.perf_counter() - started)
    return common.summary_ms(samples), rows


def _explain(version_id: int, direction: str) -> str:
    """EXPLAIN ANALYZE of the selectors' recursive lineage query ("" once they no longer have one)."""
    from django.db import connection

    from workflows import selectors
    from workflows.models import WorkflowVersion

    sql, join = getattr(selectors, "_LINEAGE_SQL", None), getattr(selectors, direction, None)
    if not sql or not join:
        return ""
    with connection.cursor() as cursor:
        return common.explain(cursor, sql.format(table=WorkflowVersion._meta.db_table, join=join), [version_id, 10_000])


def time_lineage(lineage: dict, repeats: int) -> dict:
    """version_ancestors(deepest) and version_descendants(root) of a built lineage, timed, with the
    rows each returns and the (version, depth) rows its recursion walked (EXPLAIN ANALYZE)."""
    from workflows import selectors

    root, deepest = lineage["root"].pk, lineage["deepest"].pk
    queries = {}
    for name, call, start, direction in (
            ("version_ancestors(deepest)", lambda: selectors.version_ancestors(deepest), deepest, "_UP"),
            ("version_descendants(root)", lambda: selectors.version_descendants(root), root, "_DOWN")):
        timing, rows = _time(call, repeats)
        plan = _explain(start, direction)
        # the (version, depth) rows the recursion produced before GROUP BY keeps each version's nearest
        walked = re.search(r"Recursive Union.*?actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", plan)
        queries[name] = {**timing, "rows": len(rows), "max_depth": max((d for _, d in rows), default=0),
                         "paths_walked": int(walked.group(1)) if walked else None,
                         "met": timing["median_ms"] < TARGET_GENEALOGY_MS and timing["p95_ms"] < TARGET_GENEALOGY_MS,
                         "explain": plan}
    return {key: lineage[key] for key in ("versions", "main_line", "side_versions", "crossovers", "build_s")} \
        | {"queries": queries}


def genealogy(workspace, *, depth: int, repeats: int) -> dict:
    """Two lineages of depth `depth` (linear, and with crossovers: see build_lineage), each timed."""
    shapes = {}
    for shape in ("linear", "crossovers"):
        lineage = build_lineage(workspace, depth, crossovers=shape == "crossovers")
        shapes[shape] = {"load_average_before": [round(x, 2) for x in os.getloadavg()],
                         **time_lineage(lineage, repeats)}
    return {"depth": depth, "repeats": repeats, "lineages": shapes}


# --------------------------------------------------------------------------------------------- report


def _pct(value):
    return None if value is None else round(100 * value, 2)


def targets_of(results: dict) -> dict:
    targets = {}
    for agent, modes in results["agents"].items():
        gp = modes.get("gp")
        if gp:
            # the headline is the lift on the held-out test split; a set without one has only its search-set lift
            lift, where = (gp["test_lift"], "test split") if gp["held_out"] else (gp["lift"], "whole set, no held-out")
            targets[f"gp_lift:{agent}"] = {
                "target": f"GP lift on {agent} ({where}) >= +{TARGET_LIFT:.0%}", "measured": _pct(lift), "unit": "%",
                "met": lift is not None and lift >= TARGET_LIFT}
        # on the test split when both runs hold a held-out claim (the reading), else on the searched set
        held = modes.get("test_comparison")
        comparison, where = (held, "test lift") if held and held.get("note") != "no held-out claim" \
            else (modes.get("comparison"), "lift on the searched set")
        if comparison:
            targets[f"reflective_rollouts:{agent}"] = {
                "target": f"reflective reaches GP's {where} on {agent} with <= 1/3 of GP's rollouts",
                "measured": comparison["share_of_gp_rollouts"], "unit": "of GP's rollouts", "met": comparison["met"]}
    tree = results.get("genealogy") or {}
    for shape, lineage in tree.get("lineages", {}).items():
        for name, query in lineage["queries"].items():
            targets[f"genealogy:{shape}:{name}"] = {
                "target": f"{name}, {shape} lineage of depth {tree['depth']:,}: median and p95 < "
                          f"{TARGET_GENEALOGY_MS:g} ms", "measured": query["p95_ms"], "unit": "ms (p95)",
                "met": query["met"]}
    return targets


def report(results: dict) -> None:
    """The tables (results as main() writes them)."""
    p = results["parameters"]
    setup = results.get("setup") or {}
    if setup:
        common.print_table("setup: one fresh workspace per mode (demo corpus ingested, canonical agents seeded)",
                           ["mode", "sources indexed", "chunks", "agents", "golden items", "seconds"],
                           [[mode, f"{s['indexed']}/{s['sources']}", s["chunks"], s["agents_seeded"],
                             ", ".join(f"{a}: {n}" for a, n in s["items"].items()), s["seconds"]]
                            for mode, s in setup.items()])
    for agent, modes in results["agents"].items():
        for mode in MODES:
            run = modes.get(mode)
            if not run:
                continue
            common.print_table(
                f"{agent}, {mode}: {p['generations']} generations x population {p['population']}, seed {p['seed']}, "
                f"in-process (fitness 0-100; rollouts = item invocations run, reused results excluded)",
                ["gen", "members", "best", "avg", "worst", "run best", "evaluations", "rollouts", "cum. rollouts",
                 "cache hits", "wall (s)"],
                [[g["number"], g["members"], g["best"], g["avg"], g["worst"], g["run_best"], g["evaluations"],
                  g["rollouts"], g["run_rollouts"], g["cache_hits"], g["wall_s"]] for g in run["generations"]])
            if mode == "reflective":
                print("  (reflective: generation 0 is the base; each later one a block of `population` proposals, "
                      "its members the proposals scored on the full set, or the run's best when none was; its "
                      "rollouts include the minibatches)")
    rows = []
    for agent, modes in results["agents"].items():
        for mode in MODES:
            run = modes.get(mode)
            if run:
                rows.append([agent, mode, run["status"], run["base_fitness"], run["best_fitness"], _pct(run["lift"]),
                             run["evaluations"], run["rollouts"], run["generation_of_best"], run["rollouts_to_best"],
                             run["cache_hits"], run["wall_s"], run["best_operation"], run["stop_reason"]])
    held = []
    for agent, modes in results["agents"].items():
        for mode in MODES:
            run = modes.get(mode)
            if not run:
                continue
            r = run["report"]
            if not r.get("held_out"):
                held.append([agent, mode, "no", r["base"].get("whole_set"), "-", "-", r["best"].get("whole_set"), "-",
                             "-", "-", "-", "-", "-", r["reason"] or "-"])
                continue
            low, high = _pct(r["test_lift_low"]), _pct(r["test_lift_high"])
            interval = "-" if low is None else f"{low} .. {high}"
            held.append([agent, mode, "yes", r["base"].get("train"), r["base"].get("validation"), r["base"].get("test"),
                         r["best"].get("train"), r["best"].get("validation"), r["best"].get("test"),
                         _pct(r["test_lift"]), interval, f"{r['verdict']} (p {common.fmt(r['p_value'], 4)}, "
                         f"{r['test_items']} items)", r["train_test_gap"], r["test_error"] or "-"])
    common.print_table("held-out result: searched on train, best selected on validation, base and best scored once "
                       "on test (fitness 0-100; the lift's interval is the paired bootstrap's, relative to the base's "
                       "test score)",
                       ["agent", "mode", "held out", "base train", "base val.", "base test", "best train", "best val.",
                        "best test", "test lift %", "95% interval %", "paired test", "train-test gap", "note"], held)
    common.print_table("runs: the best version over the base on the items the search scored (train when held out)",
                       ["agent", "mode", "status", "base", "best", "lift %", "evaluations", "rollouts",
                        "best in gen", "rollouts to best", "cache hits", "wall (s)", "best made by", "stop reason"],
                       rows)
    comparisons = [[agent, _pct(c["gp_lift"]), c["gp_rollouts_to_best"], _pct(c["reflective_lift"]),
                    c["reflective_rollouts_to_best"], c["reflective_rollouts_to_gp_lift"], c["share_of_gp_rollouts"],
                    common.verdict(c["met"]), c["by_eval_run"]["gp_rollouts_to_best"],
                    c["by_eval_run"]["reflective_rollouts_to_gp_lift"], c["by_eval_run"]["share_of_gp_rollouts"]]
                   for agent, modes in results["agents"].items() if (c := modes.get("comparison"))]
    if comparisons:
        common.print_table("reflective vs GP: rollouts to reach GP's lift (target: <= 1/3 of GP's rollouts to its "
                           "best)",
                           ["agent", "GP lift %", "GP rollouts to best", "reflective lift %",
                            "reflective rollouts to its best", "reflective rollouts to GP's lift", "share of GP's",
                            "verdict", "(info) by eval run: GP to best", "reflective to GP's lift", "share"],
                           comparisons)
        print("  (rollouts are cumulative at the end of the generation where the fitness was first reached, as "
              "Generation.stats records them; the last three columns count up to the eval run that reached it, "
              "in the order the eval runs were created)")
    held = [[agent, _pct(c["gp_test_lift"]), c.get("gp_rollouts_to_test_lift"), _pct(c.get("reflective_test_lift")),
             c.get("reflective_rollouts_to_gp_test_lift"), c["share_of_gp_rollouts"], common.verdict(c["met"]),
             c["note"] or "-"]
            for agent, modes in results["agents"].items() if (c := modes.get("test_comparison"))]
    if held:
        common.print_table("reflective vs GP on held-out items: rollouts until the run best did as well on the test "
                           "split as GP's best (target: <= 1/3 of GP's rollouts until its run best did)",
                           ["agent", "GP test lift %", "GP rollouts to it", "reflective test lift %",
                            "reflective rollouts to GP's test lift", "share of GP's", "verdict", "note"], held)
        print("  (each version a run held as its best is scored on the test split after the run, by the benchmark: "
              "nothing in the search reads it; rollouts are the run's own, cumulative when it began to hold it)")
    tree = results.get("genealogy")
    if tree:
        common.print_table(
            f"genealogy: version_ancestors(deepest) and version_descendants(root) at depth {tree['depth']:,}, "
            f"{tree['repeats']} calls each (ms)",
            ["lineage", "versions", "built (s)", "load avg", "query", "rows", "max depth (nearest path)",
             "(version, depth) rows walked", "median", "p95", "min", "max", "target", "verdict"],
            [[f"{shape}" + (f": {t['crossovers']} crossovers merging {t['side_versions']} side versions"
                            if t["crossovers"] else ""), t["versions"], t["build_s"], t["load_average_before"][0],
              name, q["rows"], q["max_depth"], q["paths_walked"], q["median_ms"], q["p95_ms"], q["min_ms"],
              q["max_ms"], f"< {TARGET_GENEALOGY_MS:g}", common.verdict(q["met"])]
             for shape, t in tree["lineages"].items() for name, q in t["queries"].items()])
    targets = results.get("targets") or {}
    if targets:
        common.print_table("targets", ["target", "measured", "verdict"],
                           [[t["target"], f"{common.fmt(t['measured'])} {t['unit']}", common.verdict(t["met"])]
                            for t in targets.values()])


# ----------------------------------------------------------------------------------------------- main


def measure(prepared: dict, *, agents, generations: int, population: int, seed: int, depth: int,
            repeats: int) -> dict:
    """Every measurement on prepared workspaces (see prepare): both modes on each agent, then the
    genealogy (skipped with depth 0). Returns the results as main() writes them, but for the machine and
    the setup."""
    config = {"generations": generations, "population": population, "seed": seed}
    results: dict = {"parameters": {**config, "agents": list(agents), "modes": [m for m in MODES if m in prepared],
                                    "depth": depth, "repeats": repeats, "provider": check_offline(),
                                    "driven": "in-process (durable.inprocess.run_until_settled), one run at a time: "
                                              "search quality and rollouts, not throughput",
                                    "crossover_every": crossover_every(depth), "branch_length": BRANCH_LENGTH,
                                    "branch_start": BRANCH_START},
                     "agents": {}}
    for agent in agents:
        modes = results["agents"][agent] = {}
        for mode in MODES:
            if mode not in prepared:
                continue
            entry = prepared[mode]["agents"][agent]
            common.say(f"{agent}: {mode}, {generations} x {population}, seed {seed}")
            modes[mode] = run_evolution(workflow=entry["workflow"], golden_set=entry["golden_set"], mode=mode,
                                        config=config)
            run = modes[mode]
            common.say(f"{agent}: {mode} {run['status']} in {run['wall_s']} s: base {run['base_fitness']}, "
                       f"best {run['best_fitness']}, {run['rollouts']} rollouts")
            score_run_bests_on_test(run, entry["golden_set"])
        if "gp" in modes and "reflective" in modes:
            modes["comparison"] = compare(modes["gp"], modes["reflective"])
            modes["test_comparison"] = compare_on_test(modes["gp"], modes["reflective"])
    if depth:
        common.say(f"genealogy: building a lineage of depth {depth:,}")
        results["genealogy"] = genealogy(prepared[next(iter(prepared))]["workspace"], depth=depth, repeats=repeats)
    results["targets"] = targets_of(results)
    return results


def setup_of(prepared: dict) -> dict:
    from evals.models import GoldenItem

    return {mode: {"workspace": p["workspace"].slug, "sources": p["sources"], "indexed": p["indexed"],
                   "chunks": p["chunks"], "agents_seeded": p["agents_seeded"], "seconds": p["seconds"],
                   "items": {name: GoldenItem.objects.filter(golden_set=a["golden_set"]).count()
                             for name, a in p["agents"].items()}}
            for mode, p in prepared.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench evolution")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agents", default=",".join(DEFAULT_AGENTS),
                        help="comma-separated names of canonical agents (evals/agents/*.yaml)")
    parser.add_argument("--depth", type=int, default=1000, help="depth of the genealogy's main line (0: skip)")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls of each genealogy query")
    args = parser.parse_args()
    agents = [name.strip() for name in args.agents.split(",") if name.strip()]

    common.say(f"creating database {BENCH_DB}")
    common.create_database(BENCH_DB)
    try:
        return _run(args, agents)
    finally:
        common.close_django()
        common.drop_database(BENCH_DB)
        common.say("benchmark database dropped")


def _run(args, agents: list[str]) -> int:
    force_offline()
    common.setup_django(BENCH_DB)
    from django.conf import settings
    from django.db import connection

    settings.DURABLE_DISPATCH_ENABLED = False  # driven in-process: nothing for a worker
    connection.ensure_connection()
    info = common.machine_info(connection.connection)
    common.say("seeding: the demo corpus and the canonical agents, one workspace per mode")
    prepared = prepare(MODES, agents)
    results = {"benchmark": NAME, "machine": info, "setup": setup_of(prepared)}
    results.update(measure(prepared, agents=agents, generations=args.generations, population=args.population,
                           seed=args.seed, depth=args.depth, repeats=args.repeats))
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report(results)
    common.write_results(NAME, results)
    failed = [f"{agent} {mode}: {run['status']} {run['error']}" for agent, modes in results["agents"].items()
              for mode, run in modes.items() if mode in MODES and not run["completed"]]
    for line in failed:
        common.say(f"run did not complete: {line}")
    return 1 if failed else 0
