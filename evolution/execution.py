"""The writes of an evolution run, each called as one durable step (or ``ctx.transaction``) by
evolution/durable_workflows.py. Breeding is deterministic: its generator is seeded from the run's
seed and the generation, and versions are content-addressed, so a step that runs again after a
crash writes nothing new and returns the same offspring.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from django.db import transaction
from django.db.models import Sum

from config import telemetry
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet
from evolution.models import EvolutionRun, Generation, Individual
from workflows.models import WorkflowInvocation, WorkflowVersion

if TYPE_CHECKING:
    from evolution.guided import StepCalls


def now() -> datetime:
    return datetime.now(UTC)


def generator(seed: int, *labels) -> random.Random:
    """The run's generator for one decision (the seed and the labels name it): the same in every replay."""
    return random.Random(":".join(str(part) for part in (seed, *labels)))


# ---------------------------------------------------------------------------------------------- the run

class EvolutionPlan(TypedDict):
    """What the loop reads of its run, from the checkpoint of its `begin` step (a run begun before splits
    were read has none of the split keys)."""

    run_id: int
    mode: str  # gp | reflective
    config: dict[str, Any]
    base_version_id: int
    golden_set_id: int
    items: list[int]  # the set's items in order
    goal: str
    started_at: str  # ISO 8601
    held_out: NotRequired[bool]
    held_out_reason: NotRequired[str]
    split_counts: NotRequired[dict[str, int]]
    splits: NotRequired[dict[str, list[int]]]  # with a held-out claim: train, validation, test
    # the reflective loop holds a better version as soon as it is found (evolution/durable_workflows.py); a run begun
    # before it did has none and replays the history it wrote
    best_as_found: NotRequired[bool]
    # the run's best is the base or a child that joined the frontier (an iterative child the paired test refused is
    # not); a run begun before has none and replays as it began
    best_from_accepted: NotRequired[bool]


def evolution_plan(run: EvolutionRun) -> EvolutionPlan:
    """What the loop needs of an evolution run that begins (durable.owners.begin calls it, the row
    locked and marked running; a paused run stays paused)."""
    items = list(GoldenItem.objects.filter(golden_set_id=run.golden_set_id).order_by("position", "id")
                 .values_list("pk", flat=True))
    return {"run_id": run.pk, "mode": run.mode, "config": run.config, "base_version_id": run.base_version_id,
            "golden_set_id": run.golden_set_id, "items": items, "goal": run.goal_text,
            "started_at": run.started_at.isoformat(), **evolution_splits(run.golden_set_id), "best_as_found": True,
            "best_from_accepted": True}


class Splits(TypedDict):
    held_out: bool
    held_out_reason: str
    split_counts: dict[str, int]
    splits: NotRequired[dict[str, list[int]]]  # with a held-out claim: the ids of each split, in the set's order


def evolution_splits(golden_set_id: int) -> Splits:
    """The splits a run reads, as its set holds them when it begins (one read: the plan and the ids agree):
    `held_out` and, when the set cannot carry a held-out claim, `held_out_reason` (evals.selectors.split_plan);
    `split_counts`; with the claim, `splits`, the ids of each split in the set's order."""
    from evals.selectors import split_items, split_plan

    ids = split_items(GoldenSet(pk=golden_set_id))
    counts = {split: len(items) for split, items in ids.items()}
    plan = split_plan(GoldenSet(pk=golden_set_id), counts=counts)
    splits: Splits = {"held_out": plan.held_out, "held_out_reason": plan.reason, "split_counts": counts}
    if plan.held_out:
        splits["splits"] = ids
    return splits


def evolution_finish(run_id: int, summary: dict) -> None:
    """Record the run's end. Run in a ``ctx.transaction``, so only a turn that still holds the run
    commits it: a failed or cancelled row is completed too (an operator retried its run, and the
    run is what happened)."""
    EvolutionRun.objects.filter(pk=run_id).exclude(status=EvolutionRun.Status.COMPLETED).update(
        status=EvolutionRun.Status.COMPLETED, error="", stop_reason=summary.get("stop_reason", "")[:200],
        best_version_id=summary.get("best_version_id"), best_fitness=summary.get("best_fitness"),
        base_fitness=summary.get("base_fitness"), evaluations=summary.get("evaluations", 0),
        rollouts=summary.get("rollouts", 0), cache_hits=summary.get("cache_hits", 0),
        usd_cost=Decimal(str(summary.get("usd", "0"))), report=summary.get("report") or {}, ended_at=now(),
        updated_at=now())


def pause_point(run_id: int, boundary: str) -> bool:
    """Whether an operator paused the run; if so it now waits at `boundary` for `resume:<boundary>`.
    Serialised with evolution_resume on the run's row, so a resume never falls between the check and
    the wait."""
    with transaction.atomic():
        run = EvolutionRun.objects.select_for_update().get(pk=run_id)
        if run.status != EvolutionRun.Status.PAUSED:
            return False
        run.paused_at = boundary
        run.save(update_fields=["paused_at", "updated_at"])
    return True


# ---------------------------------------------------------------------------------------------- scoring

def eval_runs_create(run_id: int, version_ids: list[int], item_ids: list[int] | None,
                     budget: str | None = None) -> dict[str, int | str]:
    """An eval run (results reused where the same version already answered the same item) for each
    version, to be driven as children of the evolution run, each allowed to spend `budget` USD.
    Called in a ``ctx.transaction``. Returns {version id: eval run id, or an error text when the
    version cannot run here}."""
    from evals.services import EvalError, eval_run_prepare

    run = EvolutionRun.objects.select_related("golden_set__workspace").get(pk=run_id)
    out: dict[str, int | str] = {}
    for version in WorkflowVersion.objects.filter(pk__in=version_ids).select_related("workflow"):
        try:
            eval_run = eval_run_prepare(golden_set=run.golden_set, version=version, reuse=True,
                                        origin=EvalRun.Origin.EVOLUTION, concurrency=run.config.get("concurrency"),
                                        item_ids=item_ids, user=run.created_by, parent_run_id=run.durable_run_id,
                                        run_usd_budget=None if budget is None else Decimal(budget))
        except EvalError as exc:
            out[str(version.pk)] = str(exc)
            continue
        out[str(version.pk)] = eval_run.pk
    return out


class Measurement(TypedDict):
    """What a version's eval run measured (eval_scores), and what it cost."""

    fitness: float
    avg_score: float
    scores: dict[str, float | None]  # item id -> score
    rollouts: int  # item invocations run now
    cache_hits: int
    usd: str  # Decimal as text
    eval_run: int | None
    error: str  # why the eval run did not complete, or ""


def eval_scores(created: dict[str, int | str]) -> dict[str, Measurement]:
    """What each version's eval run measured: fitness, average score, per-item scores, and what it
    cost (item invocations run now, cache hits, USD paid, whether or not the eval run completed)."""
    from evals.execution import eval_spent

    out: dict[str, Measurement] = {}
    for version_id, eval_run_id in created.items():
        if not isinstance(eval_run_id, int):
            out[version_id] = {"fitness": 0.0, "avg_score": 0.0, "scores": {}, "rollouts": 0, "cache_hits": 0,
                               "usd": "0", "eval_run": None, "error": eval_run_id}
            continue
        run = EvalRun.objects.get(pk=eval_run_id)
        results = GoldenResult.objects.filter(eval_run=run)
        fresh = results.filter(reused_from__isnull=True, workflow_invocation__isnull=False)
        hits = WorkflowInvocation.objects.filter(pk__in=fresh.values("workflow_invocation")) \
            .aggregate(hits=Sum("cache_hits"))["hits"] or 0
        out[version_id] = {
            "fitness": run.fitness if run.fitness is not None else 0.0,
            "avg_score": run.avg_score if run.avg_score is not None else 0.0,
            "scores": {str(item): score for item, score in results.values_list("golden_item_id", "score")},
            "rollouts": fresh.count(), "cache_hits": hits, "usd": eval_spent(run.pk),
            "eval_run": run.pk, "error": run.error if run.status != EvalRun.Status.COMPLETED else "",
        }
    return out


def test_report(report: dict, test_items: list[int], base: dict, best: dict) -> dict:
    """`report` (Loop.report_so_far) completed with the test split's measurements of the base and the best
    (eval_scores records): each one's test fitness, the lift on test, the paired test over the test items both
    were graded on (evals.stats.paired_comparison, the promotion's: Wilcoxon signed-rank, and the bootstrap's
    95% interval of the mean per-item score difference), that interval relative to the base's mean score on
    test (the lift's interval: fitness is the average score's, offline and within the time and cost norms of
    docs/fitness.md), and the train-test gap of the best (train fitness - test fitness, in fitness points)."""
    from evals.conf import eval_settings
    from evals.stats import paired_comparison

    conf = eval_settings()
    a, b = base.get("scores") or {}, best.get("scores") or {}
    paired = [str(item) for item in test_items if a.get(str(item)) is not None and b.get(str(item)) is not None]
    comparison = paired_comparison([a[i] for i in paired], [b[i] for i in paired], alpha=conf.alpha,
                                   resamples=conf.bootstrap_resamples).as_dict()
    # an eval run that did not complete measured nothing of its version (eval_scores counts it 0)
    base_test, best_test = (None if record.get("error") else record.get("fitness") for record in (base, best))
    mean_a = comparison["mean_a"]

    def relative(value):
        return None if value is None or not mean_a else round(value / mean_a, 6)

    errors = "; ".join(f"{role}: {record['error']}" for role, record in (("base", base), ("best", best))
                       if record.get("error"))
    out = {**report, "base": {**report["base"], "test": base_test}, "best": {**report["best"], "test": best_test}}
    out["test"] = {
        "items": len(test_items), "paired": len(paired),
        "eval_runs": {"base": base.get("eval_run"), "best": best.get("eval_run")},
        "lift": round((best_test - base_test) / base_test, 6) if base_test and best_test is not None else None,
        "lift_low": relative(comparison["ci_low"]), "lift_high": relative(comparison["ci_high"]),
        "comparison": comparison, "item_ids": list(test_items)}
    train = report["best"].get("train")
    out["train_test_gap"] = round(train - best_test, 6) if train is not None and best_test is not None else None
    if errors:
        out["test_error"] = errors
    return out


# ---------------------------------------------------------------------------------------------- breeding

def _material(run: EvolutionRun):
    from evolution.operators import Material

    return Material(goal=run.goal_text)


def _iterative_for(run: EvolutionRun, eval_run_id: int | None):
    """The judge-guided rewrite of the evals app, bound to the parent's failures."""
    if not eval_run_id:
        return None
    from evals.rewriter import offline_proposal, target_node, worst_failures

    eval_run = EvalRun.objects.filter(pk=eval_run_id).select_related("workflow_version").first()
    if eval_run is None:
        return None
    failures = worst_failures(eval_run)

    def rewrite(dsl: dict):
        if not failures:
            return None
        version = eval_run.workflow_version
        proposal = offline_proposal(version, target_node(version, failures), failures)
        if proposal.skipped or proposal.dsl is None:
            return None
        return proposal.dsl, "; ".join(proposal.changelog)

    return rewrite


class Member(TypedDict):
    """A version bred or chosen for the run (a population's member, a reflection's child)."""

    version_id: int
    kind: str
    note: str
    created: bool  # new to the workflow (not an existing version's content)
    parents: list[int]


class Bred(TypedDict):
    """A breed step's answer: its offspring and what its guided operators' model calls cost (USD, a decimal string)."""

    offspring: list[Member]
    usd: str


class Reflected(TypedDict):
    """A reflect step's answer: its offspring (None when nothing new came out) and what its model calls cost."""

    child: Member | None
    usd: str


def _write(run: EvolutionRun, offspring, parents: list[WorkflowVersion], generation: int) -> Member:
    from workflows.services import workflow_version_create

    version, created = workflow_version_create(
        workflow=run.workflow, dsl=offspring.dsl, operation=offspring.operation, parents=tuple(parents),
        commit_message=f"evolution {run.pk}, generation {generation}: {offspring.kind}: {offspring.note}"[:2000],
        generation=generation, created_by=run.created_by)
    return {"version_id": version.pk, "kind": offspring.kind, "note": offspring.note, "created": created,
            "parents": [p.pk for p in parents]}


def initial_population(run_id: int) -> list[Member]:
    """Generation 0: the base, then mutants of the base and immigrants (docs/evolution-defaults.md), deduplicated by
    content; at most `population` distinct versions."""
    from evolution import operators

    run = EvolutionRun.objects.select_related("workflow", "base_version").get(pk=run_id)
    config, base = run.config, run.base_version
    rng = generator(config["seed"], "initial")
    members: list[Member] = [{"version_id": base.pk, "kind": "base", "note": "the base version", "created": False,
                              "parents": []}]
    seen = {base.dsl_hash}
    immigrants = round((config["population"] - 1) * config["initial_immigrants"])
    attempts = 0
    while len(members) < config["population"] and attempts < config["population"] * 6:
        attempts += 1
        if len(members) - 1 < config["population"] - 1 - immigrants:
            child = operators.mutate(base.dsl, rng, material=_material(run), weights=config.get("mutation_weights"))
        else:
            child = operators.immigrant(base.dsl, rng, material=_material(run))
        if child is None:
            continue
        record = _write(run, child, [base] if child.operation != "immigrant" else [], 0)
        version = WorkflowVersion.objects.get(pk=record["version_id"])
        if version.dsl_hash in seen:
            continue
        seen.add(version.dsl_hash)
        members.append(record)
    return members


def breed(run_id: int, generation: int, parents: list[Member], count: int, spent: str | None = None) -> Bred:
    """{"offspring": `count` offspring of the selected parents ({"version_id", "eval_run"}), "usd": what the
    guided operators' model calls cost}, one draw per child: below the crossover rate a crossover of two
    parents, below crossover + mutation a mutation, else an immigrant; an offspring identical to an
    existing version is that version. `spent`: the run's spend so far; once it and the breed's calls reach the
    run's USD budget the breed stops (its next evaluation would not start), with the offspring made until then.
    Run again after its worker died, it reuses the answers the lost attempt paid for (guided.StepCalls)."""
    from evolution import guided

    run = EvolutionRun.objects.select_related("workflow", "base_version").get(pk=run_id)
    with guided.step_calls(run, f"breed:{generation}", spent) as calls:
        offspring = _breed(run, generation, parents, count, calls)
    return {"offspring": offspring, "usd": f"{calls.usd:f}"}


def _breed(run: EvolutionRun, generation: int, parents: list[Member], count: int, calls: StepCalls) -> list[Member]:
    from evolution import operators

    config = run.config
    rng = generator(config["seed"], "breed", generation)
    versions = WorkflowVersion.objects.in_bulk([p["version_id"] for p in parents])
    pool = [(versions[p["version_id"]], p.get("eval_run")) for p in parents if p["version_id"] in versions]
    out, attempts = [], 0
    while len(out) < count and attempts < count * 6 and pool and not calls.budget_spent():
        attempts += 1
        draw = rng.random()
        if draw < config["crossover_rate"] and len(pool) >= 2:
            (a, a_eval), (b, b_eval) = rng.sample(pool, 2)
            child, parents_used = _crossover(a, a_eval, b, b_eval, rng, calls), [a, b]
        elif draw < config["crossover_rate"] + config["mutation_rate"] or len(pool) < 2:
            parent, eval_run_id = pool[rng.randrange(len(pool))]
            child = operators.mutate(parent.dsl, rng, material=_material(run), weights=config.get("mutation_weights"),
                                     iterative=_iterative_for(run, eval_run_id))
            parents_used = [parent]
        else:
            child, parents_used = _immigrant(run, rng, calls), []
        if child is None:
            continue
        out.append(_write(run, child, parents_used, generation))
    return out


def reflect(run_id: int, iteration: int, parent: Member, merge_with: Member | None, known: list[int],
            spent: str | None = None) -> Reflected:
    """{"child": the offspring's record or None, "usd": what the rewriter's model calls cost}: see `_reflect`.
    The cost counts in the run's spend whether or not a child came of it. `spent`: the run's spend so far, for
    its USD budget, checked before each model call; run again after its worker died, the step reuses the answers
    the lost attempt paid for (guided.StepCalls)."""
    from evolution import guided

    run = EvolutionRun.objects.select_related("workflow", "base_version").get(pk=run_id)
    with guided.step_calls(run, f"reflect:{iteration}", spent) as calls:
        child = _reflect(run, iteration, parent, merge_with, known, calls)
    return {"child": child, "usd": f"{calls.usd:f}"}


def _reflect(run: EvolutionRun, iteration: int, parent: Member, merge_with: Member | None,
             known: list[int], calls: StepCalls) -> Member | None:
    """Reflective mode's offspring of a frontier version: with `merge_with` a crossover of the two (they
    improved different items); otherwise the evals rewriter reading the parent's failing items (their
    invocations, messages and grader rationales), falling back to a prompt mutation, any mutation, then
    an immigrant when it has nothing new to this run (`known`: the versions it has scored; deciding on
    that, not on whether a version was just created, makes a re-executed step return the same child).
    None when nothing new comes out, or when the run's USD budget is spent before the rewriter is asked (the
    child would not be scored)."""
    from evals.rewriter import propose
    from evolution import operators

    rng = generator(run.config["seed"], "reflect", iteration)
    versions = WorkflowVersion.objects.in_bulk([parent["version_id"]] + ([merge_with["version_id"]]
                                                                         if merge_with else []))
    mother = versions[parent["version_id"]]
    known = set(known)

    def new(record: Member) -> bool:
        return record["version_id"] not in known

    if merge_with is not None:
        father = versions[merge_with["version_id"]]
        child = _crossover(mother, parent.get("eval_run"), father, merge_with.get("eval_run"), rng, calls)
        if child is not None:
            record = _write(run, child, [mother, father], iteration)
            if new(record):
                return record
    if calls.budget_spent():
        return None
    eval_run = EvalRun.objects.filter(pk=parent.get("eval_run")).first()
    if eval_run is not None:
        proposal = propose(eval_run=eval_run, user=run.created_by, create=False, ask=calls.ask)
        if not proposal.skipped and proposal.dsl is not None:
            offspring = operators.Offspring(dsl=proposal.dsl, operation="mutation", kind="iterative",
                                            note="; ".join(proposal.changelog))
            record = _write(run, offspring, [mother], iteration)
            if new(record):
                return record
    # nothing new from the rewriter: a prompt mutation, then any mutation kind, then an immigrant
    for kind in ["prompt"] * 6 + [None] * 6:
        child = operators.mutate(mother.dsl, rng, material=_material(run), kind=kind)
        if child is not None:
            record = _write(run, child, [mother], iteration)
            if new(record):
                return record
    record = _write(run, _immigrant(run, rng, calls), [], iteration)
    return record if new(record) else None


def _crossover(mother: WorkflowVersion, mother_eval: int | None, father: WorkflowVersion, father_eval: int | None,
               rng, calls: StepCalls | None = None):
    """With a real model (evolution.guided, asked through the step's `calls`), the parents' prompts merged given
    the items each won; else, or when the model gave nothing usable or the budget is spent, the structural
    crossover."""
    from evolution import guided, operators

    model = guided.guide_model(mother.dsl)
    if model is not None and (calls is None or not calls.budget_spent()):
        child = guided.merged_crossover(mother.dsl, father.dsl, _wins(mother_eval, father_eval), model,
                                        ask=None if calls is None else calls.ask)
        if child is not None:
            return child
    return operators.crossover(mother.dsl, father.dsl, rng)


def _immigrant(run: EvolutionRun, rng, calls: StepCalls):
    """With a real model (asked through the step's `calls`) and a goal, the base's prompts written afresh from
    the goal; else, or when the budget is spent, a structural immigrant."""
    from evolution import guided, operators

    base = run.base_version.dsl
    model = guided.guide_model(base)
    if model is not None and run.goal_text.strip() and not calls.budget_spent():
        child = guided.written_immigrant(base, run.goal_text, model, ask=calls.ask)
        if child is not None:
            return child
    return operators.immigrant(base, rng, material=_material(run))


def _wins(eval_a: int | None, eval_b: int | None) -> dict[str, list]:
    """The inputs of the items one eval run scored higher than the other ({"a": ..., "b": ...})."""
    scores: dict[int, dict[str, float]] = {}
    inputs: dict[int, object] = {}
    rows = GoldenResult.objects.filter(eval_run_id__in=[e for e in (eval_a, eval_b) if e], score__isnull=False)
    for eval_run_id, item_id, score, item_input in rows.values_list("eval_run_id", "golden_item_id", "score",
                                                                  "golden_item__input").order_by("golden_item_id"):
        scores.setdefault(item_id, {})["a" if eval_run_id == eval_a else "b"] = score
        inputs[item_id] = item_input
    wins: dict[str, list] = {"a": [], "b": []}
    for item_id, pair in scores.items():
        if len(pair) == 2 and pair["a"] != pair["b"]:
            wins["a" if pair["a"] > pair["b"] else "b"].append(inputs[item_id])
    return wins


# ---------------------------------------------------------------------------------------------- records

def record_generation(run_id: int, number: int, members: list[dict], stats: dict, started_at: str,
                      report: dict | None = None) -> None:
    """The generation, its individuals (fitness, how each was made, whether it survived) and the run's
    running totals and report so far. Idempotent."""
    with transaction.atomic():
        generation, _ = Generation.objects.update_or_create(
            evolution_run_id=run_id, number=number,
            defaults={"best_workflow_version_id": stats.get("best_version_id"), "stats": stats,
                      "started_at": datetime.fromisoformat(started_at), "ended_at": now()})
        for member in members:
            Individual.objects.update_or_create(
                generation=generation, workflow_version_id=member["version_id"],
                defaults={"evolution_run_id": run_id, "eval_run_id": member.get("eval_run"),
                          "kind": member.get("kind", "")[:30], "note": member.get("note", "")[:2000],
                          "fitness": member.get("fitness"), "avg_score": member.get("avg_score"),
                          "survived": bool(member.get("survived"))})
        EvolutionRun.objects.filter(pk=run_id).update(
            generations_done=number + 1, best_version_id=stats.get("run_best_version_id"),
            best_fitness=stats.get("run_best_fitness"), base_fitness=stats.get("base_fitness"),
            evaluations=stats.get("run_evaluations", 0), rollouts=stats.get("run_rollouts", 0),
            cache_hits=stats.get("run_cache_hits", 0), usd_cost=Decimal(str(stats.get("run_usd", "0"))),
            **({"report": report} if report is not None else {}), updated_at=now())
    _trace_generation(run_id, number, stats, datetime.fromisoformat(started_at))


def _trace_generation(run_id: int, number: int, stats: dict, started: datetime) -> None:
    """A generation's span, as its row is written (its evaluations' eval runs ran in the same trace)."""
    if not telemetry.tracing():
        return
    attributes = {"lineage.evolution_run.id": run_id, "lineage.generation.number": number,
                  "lineage.generation.members": stats.get("members", 0),
                  "lineage.evaluations": stats.get("run_evaluations", 0),
                  "lineage.usd_cost": float(Decimal(str(stats.get("run_usd", "0"))))}
    for name in ("best", "avg", "worst", "run_best_fitness"):
        if isinstance(stats.get(name), int | float):
            attributes[f"lineage.fitness.{name}"] = float(stats[name])
    telemetry.record_span(f"evolution_generation {number}", key=f"evolution_run:{run_id}:generation:{number}",
                          start=started, attributes=attributes)
