"""Evolution runs as durable runs.

``evolution.run`` improves a workflow against a golden set in one of three modes:

- ``gp`` (genetic programming, docs/evolution-defaults.md): an initial population (the base, mutants, immigrants),
  then per generation: selection (elites, then tournament winners up to half the population),
  breeding (crossover / mutation / immigrant draws), evaluation of the offspring, and survivors
  (parents and offspring ranked together, the best `population` kept).
- ``reflective`` (after GEPA): a candidate is drawn from the Pareto frontier of per-item scores (a
  version best on at least one item stays eligible, weighted by how many items it leads on),
  rewritten by the evals rewriter reading its failing items, or merged with another frontier version
  that leads on other items; the offspring is scored on a minibatch of items first and on the full
  set only when it beats its parent there.
- ``iterative``: reflective with a frontier of one: an offspring replaces its parent only when the
  paired test on the full set says it is significantly better (and only such an offspring may become the run's best).

Held-out items (evals/splits.py): when the golden set can carry a held-out claim
(evals.selectors.split_plan), the search scores individuals on the train split only ("the full
set" above is the train split, and minibatches are drawn from it); the run's best and the
convergence rule read the validation split, on which the base and each generation's top
VALIDATED_PER_GENERATION by train fitness are scored (in iterative mode, of those that may be the run's best: no child
the paired test refused; each version once; in the reflective modes each candidate
also as it joins the frontier, so the run holds a better version as soon as it is found, and a block of proposals a
stop rule cuts short still gets its row, so that a row names each best the run held); at the end the base and
the best are scored on the test split, which nothing before read, and the report
(execution.test_report, EvolutionRun.report) compares them there. A set that cannot carry the
claim is searched and selected on whole, as the report states with the plan's reason.

Every individual is scored by an eval run (a child run; results of the same version on the same
item are reused, so a genome is never paid twice, and an offspring identical to an existing version
is that version). Random choices come from generators seeded by the run's seed and the decision
(evolution.execution.generator), and breeding happens inside steps, so a resumed run makes the same
choices and repeats no evaluation. Stop rules: USD budget, evaluation cap, time limit, convergence
(the best fitness improving by less than epsilon in each of the last N generations), or the
generations done. The USD budget is checked before each evaluation too, and what is left of it is
shared among the eval runs an evaluation starts, each stopping its items once its share is spent: a
generation overshoots by at most one item invocation per lane of each eval run (`concurrency`). Breed and reflect
steps check it before each of their model calls (evolution.guided.StepCalls: the run's spend when the step began
plus the step's so far), and once it is spent breed nothing more; a step run again after its worker died is
answered from the calls it paid for. Every paid call counts, once, whatever became of its eval run or step.
An operator may pause the run (it then waits at the next generation boundary for the signal
`resume:<boundary>` that evolution_resume sends) or cancel it.
"""

from __future__ import annotations

import contextlib
import statistics
from datetime import datetime
from decimal import Decimal
from typing import cast

from django.conf import settings

from config.display import usd
from durable import Child, Context, workflow
from durable.owners import begin_row, fail_row
from evals.durable_workflows import EVAL_WORKFLOW
from evals.execution import usd_budget_spent
from evolution import execution
from evolution.models import EvolutionRun
from llm.providers import OFFLINE_PROVIDER
from workflows.durable_workflows import queued_call_options

EVOLVE_WORKFLOW = "evolution.run"
MERGE_PROBABILITY = 0.25
VALIDATED_PER_GENERATION = 3  # each generation's candidates for the run's best, by search fitness


class BudgetSpent(Exception):
    """The run's USD budget is spent: no more evaluations start."""


@workflow(EVOLVE_WORKFLOW)  # started by evolution.services.evolution_start only
def evolve(ctx: Context, input: dict) -> dict:
    """Input: {"evolution_run_id": int}."""
    run_id = int(input["evolution_run_id"])
    plan = begin_row(ctx, EvolutionRun, run_id)
    if "ended" in plan:
        return {"status": plan["ended"]}
    plan = cast(execution.EvolutionPlan, plan)  # begin's plan, once not ended
    try:
        loop = GeneticProgramming(ctx, plan) if plan["mode"] == "gp" else Reflective(ctx, plan)
        summary = loop.run()
    except Exception as exc:
        fail_row(ctx, EvolutionRun, run_id, exc)
        raise
    ctx.transaction("finish", execution.evolution_finish, run_id, summary)
    return summary


class Loop:
    def __init__(self, ctx: Context, plan: execution.EvolutionPlan):
        self.ctx = ctx
        self.plan = plan
        self.run_id = plan["run_id"]
        self.config = plan["config"]
        self.base = plan["base_version_id"]
        self.items = plan["items"]
        # a run begun before splits were read has no "held_out": it searches the whole set, as it began to
        self.held_out = bool(plan.get("held_out"))
        splits = plan.get("splits") or {}
        self.search_items = splits["train"] if self.held_out else self.items
        self.validation_items = splits["validation"] if self.held_out else []
        self.test_items = splits["test"] if self.held_out else []
        # a run begun before the reflective loop held a better version as soon as it was found validates candidates
        # at the end of their block and writes no row for a block a stop rule cut short: as it began to, since its
        # history replays only so
        self.best_as_found = bool(plan.get("best_as_found"))
        # a run begun before an iterative loop kept a refused child out of the best replays holding it as it did
        self.best_from_accepted = bool(plan.get("best_from_accepted"))
        self.started = datetime.fromisoformat(plan["started_at"])
        self.scores: dict[int, dict] = {}  # measurements on the search items (train, else the whole set) by version
        self.validation: dict[int, dict] = {}  # measurements on the validation split by version (held out only)
        self.totals = {"evaluations": 0, "rollouts": 0, "cache_hits": 0, "usd": Decimal(0)}
        self.best_history: list[float] = []  # the run best's selection fitness after each generation
        # each time the run best changed: the version and the run's rollouts then, for the generation's row
        self.best_changes: list[dict] = []
        self.recorded_changes = 0  # how many of them earlier generations' rows hold
        self.made: dict[int, dict] = {}  # version -> how it was made (kind, note, parents)

    def run(self) -> dict:
        try:
            reason = self.loop()
        except BudgetSpent as spent:
            reason = str(spent)
        return self.summary(reason)

    def loop(self) -> str:
        """Search until a stop rule or the planned work ends; returns why it stopped."""
        raise NotImplementedError

    # -- scoring

    def evaluate(self, label: str, version_ids: list[int], items: list[int] | None = None) -> dict[int, dict]:
        """Score versions on the search items (the train split with a held-out claim, else the whole set; each
        version once per run) or on `items` (a minibatch of them)."""
        if items is not None:
            return self.measure(label, list(dict.fromkeys(version_ids)), items)
        wanted = list(dict.fromkeys(version_ids))
        todo = [v for v in wanted if v not in self.scores]
        measured = self.measure(label, todo, self.search_items if self.held_out else None)
        self.scores.update(measured)
        self.totals["evaluations"] += len(measured)
        return {v: self.scores[v] for v in wanted}

    def validate(self, label: str, version_ids: list[int]) -> None:
        """Score versions on the validation split (held out only), each once per run. Skipped once the budget is
        spent: the stop rules then end the run at their next check."""
        todo = [v for v in dict.fromkeys(version_ids) if v not in self.validation]
        if not self.held_out or not todo:
            return
        with contextlib.suppress(BudgetSpent):
            self.validation.update(self.measure(f"val:{label}", todo, self.validation_items))
        self.note_best()

    def note_best(self) -> None:
        """Remember the run's rollouts when its best changes (read from the generation's row: how much the run
        spent to hold each of its bests, at the grain it chose them)."""
        best = self.best()
        if not self.best_changes or self.best_changes[-1]["version_id"] != best:
            self.best_changes.append({"version_id": best, "run_rollouts": self.totals["rollouts"]})

    def measure(self, label: str, version_ids: list[int], item_ids: list[int] | None) -> dict[int, dict]:
        """An eval run of each version on `item_ids` (None: the whole set), driven as children; what each
        measured, its work and spend counted in the run's totals."""
        if not version_ids:
            return {}
        created: dict[str, int | str]
        created = self.ctx.transaction(f"evals:{label}", execution.eval_runs_create, self.run_id, version_ids,
                                       item_ids, self.budget_share(len(version_ids)))
        children = [Child(EVAL_WORKFLOW, {"eval_run_id": eval_run}, name=f"eval:{label}:{version}")
                    for version, eval_run in created.items() if isinstance(eval_run, int)]
        self.ctx.all(children, return_exceptions=True)
        measured: dict[int, dict] = {}
        for version, record in self.ctx.step(f"scores:{label}", execution.eval_scores, created).items():
            measured[int(version)] = record
            self.totals["rollouts"] += record["rollouts"]
            self.totals["cache_hits"] += record["cache_hits"]
            self.totals["usd"] += Decimal(record["usd"])
        return measured

    def bred_offspring(self, bred: dict | list) -> list[dict]:
        """A breed step's offspring, what its guided operators' model calls cost added to the run's spend.
        A checkpoint written before breed returned its cost is the list of offspring itself."""
        if isinstance(bred, list):
            return bred
        self.totals["usd"] += Decimal(bred["usd"])
        return bred["offspring"]

    def reflected_child(self, reflected: dict | None) -> dict | None:
        """A reflect step's offspring, its rewriter's cost added to the run's spend. A checkpoint written
        before reflect returned its cost is the offspring's record itself (or None)."""
        if reflected is None or "child" not in reflected:
            return reflected
        self.totals["usd"] += Decimal(reflected["usd"])
        return reflected["child"]

    def fitness(self, version: int) -> float:
        return self.scores[version]["fitness"]

    def rank(self, versions) -> list[int]:
        return sorted(dict.fromkeys(versions), key=lambda v: (-self.fitness(v), v))

    def selection_fitness(self, version: int) -> float | None:
        """What selecting the run's best and the convergence rule read: validation with a held-out claim."""
        if not self.held_out:
            return self.fitness(version)
        return self.validation[version]["fitness"] if version in self.validation else None

    def selected_on(self, *, unsplit: str) -> str:
        """What the run's best was chosen on: validation, or train when the budget ended before any validation
        (held out), else the one set the run searched (`unsplit` names it)."""
        if not self.held_out:
            return unsplit
        return "validation" if self.validation else "train"

    def eligible(self, versions) -> list[int]:
        """Of `versions`, those that may be the run's best: every scored one, unless the mode refuses some (a child
        the iterative mode's paired test kept out)."""
        return list(versions)

    def best(self) -> int:
        """The run's best: the best validation fitness with a held-out claim (the search fitness breaking ties),
        else the best search fitness; of the eligible versions."""
        if self.held_out and self.validation:
            validated = self.eligible(self.validation) or list(self.validation)
            return min(validated, key=lambda v: (-self.validation[v]["fitness"], -self.fitness(v), v))
        return self.rank(self.eligible(self.scores) or self.scores)[0]

    # -- control

    def boundary(self, label: str) -> None:
        """Where an operator's pause takes effect: wait for `resume`."""
        if self.ctx.step(f"pause:{label}", execution.pause_point, self.run_id, label):
            self.ctx.wait_for_signal(f"resume:{label}")

    def budget_share(self, count: int) -> str:
        """Each of `count` eval runs starting now may spend an equal share of what is left of the
        budget. BudgetSpent when nothing is left."""
        budget = Decimal(str(self.config["usd_budget"]))
        if usd_budget_spent(self.totals["usd"], budget):
            raise BudgetSpent(self.budget_reason())
        return f"{max(budget - self.totals['usd'], Decimal(0)) / count:f}"

    def spent(self) -> str:
        """The run's spend so far, for a breed or reflect step to check the budget against before each model call."""
        return f"{self.totals['usd']:f}"

    def budget_reason(self) -> str:
        return f"USD budget reached ({usd(self.totals['usd'])} of {usd(self.config['usd_budget'])})"

    def stop_reason(self) -> str:
        c = self.config
        if usd_budget_spent(self.totals["usd"], Decimal(str(c["usd_budget"]))):
            return self.budget_reason()
        if self.totals["evaluations"] >= c["max_evaluations"]:
            return f"evaluation cap reached ({self.totals['evaluations']})"
        elapsed = (self.ctx.now() - self.started).total_seconds()
        if elapsed >= c["time_limit_seconds"]:
            return f"time limit reached ({elapsed:.0f} s)"
        window, history = c["convergence_generations"], self.best_history
        if len(history) > window and all(history[-i] - history[-i - 1] < c["convergence_epsilon"]
                                         for i in range(1, window + 1)):
            return f"converged (best fitness gained less than {c['convergence_epsilon']} in {window} generations)"
        return ""

    def record(self, number: int, members: list[int], survivors: set[int], started: datetime) -> None:
        """The generation's row; first, with a held-out claim, its candidates for the run's best (the base in
        generation 0, and the generation's top VALIDATED_PER_GENERATION by search fitness of those `eligible`) scored on
        validation."""
        scored = [v for v in members if v in self.scores]
        self.validate(f"g{number}", ([self.base] if number == 0 else [])
                      + self.rank(self.eligible(scored))[:VALIDATED_PER_GENERATION])
        fitnesses = [self.fitness(v) for v in scored]
        self.note_best()
        best = self.best()
        previous = self.best_history[-1] if self.best_history else None
        current = self.selection_fitness(best)
        self.best_history.append(current if current is not None else self.fitness(best))
        elapsed_hours = max((self.ctx.now() - self.started).total_seconds() / 3600, 1e-9)
        stats = {
            "best": max(fitnesses) if fitnesses else None, "avg": statistics.fmean(fitnesses) if fitnesses else None,
            "worst": min(fitnesses) if fitnesses else None,
            "stddev": statistics.pstdev(fitnesses) if len(fitnesses) > 1 else 0.0,
            "best_version_id": max(members, key=lambda v: (self.fitness(v), -v)) if fitnesses else None,
            "members": len(members), "improvement": None if previous is None else self.best_history[-1] - previous,
            "run_best_version_id": best, "run_best_fitness": self.fitness(best),
            "base_fitness": self.scores[self.base]["fitness"] if self.base in self.scores else None,
            "selected_on": self.selected_on(unsplit="search set"),
            "run_best_validation_fitness": self.selection_fitness(best) if self.held_out else None,
            "base_validation_fitness": self.selection_fitness(self.base) if self.held_out else None,
            "run_evaluations": self.totals["evaluations"], "run_rollouts": self.totals["rollouts"],
            "run_cache_hits": self.totals["cache_hits"], "run_usd": f"{self.totals['usd']:f}",
            "evaluations_per_hour": round(self.totals["evaluations"] / elapsed_hours, 2),
            "run_best_changes": self.best_changes[self.recorded_changes:],
        }
        self.recorded_changes = len(self.best_changes)
        rows = []
        for version in members:
            measured, made = self.scores.get(version, {}), self.made.get(version, {})
            rows.append({"version_id": version, "fitness": measured.get("fitness"),
                         "avg_score": measured.get("avg_score"), "eval_run": measured.get("eval_run"),
                         "kind": made.get("kind", ""), "note": made.get("note", ""),
                         "survived": version in survivors})
        self.ctx.step(f"generation:{number}", execution.record_generation, self.run_id, number, rows, stats,
                      started.isoformat(), self.report_so_far(best))

    # -- the result

    def side(self, version: int) -> dict:
        """A version's fitness on each split the run has scored it on."""
        if not self.held_out:
            return {"version_id": version, "whole_set": self.scores.get(version, {}).get("fitness")}
        return {"version_id": version, "train": self.scores.get(version, {}).get("fitness"),
                "validation": self.selection_fitness(version) if version in self.scores else None, "test": None}

    def report_so_far(self, best: int) -> dict:
        """The report before the test split is scored: the claim the run can make, base and best so far."""
        return {"held_out": self.held_out, "reason": self.plan.get("held_out_reason", ""),
                "selected_on": self.selected_on(unsplit="whole set"),
                "splits": self.plan.get("split_counts") or {}, "base": self.side(self.base), "best": self.side(best),
                "test": None}

    def report(self, best: int) -> dict:
        """The generalization result: base and best scored once on the test split, which nothing before read
        (held out only), and compared there (execution.test_report). Without budget left, the report says the
        test split went unscored."""
        report = self.report_so_far(best)
        if not self.held_out:
            return report
        try:
            measured = self.measure("test", [self.base, best], self.test_items)
        except BudgetSpent as spent:
            return {**report, "test_error": f"the test split was not scored: {spent}"}
        return self.ctx.step("report", execution.test_report, report, self.test_items,
                             measured.get(self.base, {}), measured.get(best, {}))

    def summary(self, reason: str) -> dict:
        best = self.best()
        report = self.report(best)
        return {"stop_reason": reason, "best_version_id": best, "best_fitness": self.fitness(best),
                "base_fitness": self.scores[self.base]["fitness"], "generations": len(self.best_history),
                "evaluations": self.totals["evaluations"], "rollouts": self.totals["rollouts"],
                "cache_hits": self.totals["cache_hits"], "usd": f"{self.totals['usd']:f}",
                "held_out": self.held_out, "held_out_reason": report["reason"], "report": report}


def reflect_options() -> dict:
    """The rewriter and the guided operators (evolution.guided) may ask a real model: then breeding and
    reflecting are steps of the llm queue's worker, not of a turn's. With LLM_PROVIDER=offline every model name
    resolves to the offline model (llm.names.resolve_model), whatever provider it names and whatever
    LLM_PROVIDERS configures, so no step can make an HTTP call and both stay in the turn (answered in well
    under a millisecond)."""
    return {} if settings.LLM_PROVIDER == OFFLINE_PROVIDER else queued_call_options()


class GeneticProgramming(Loop):
    def loop(self) -> str:
        c = self.config
        started = self.ctx.now()
        members = self.ctx.step("population", execution.initial_population, self.run_id)
        self.made.update({m["version_id"]: m for m in members})
        population = [m["version_id"] for m in members]
        self.evaluate("g0", population)
        population = self.rank(population)[:c["population"]]
        self.record(0, population, set(population), started)
        reason = ""
        for number in range(1, c["generations"]):
            reason = self.stop_reason()
            if reason:
                break
            self.boundary(f"g{number}")
            started = self.ctx.now()
            parents = self.select(population, number)
            bred = self.ctx.step(f"breed:{number}", execution.breed, self.run_id, number,
                                 [{"version_id": v, "eval_run": self.scores[v]["eval_run"]} for v in parents],
                                 c["population"], self.spent(), **reflect_options())
            offspring = self.bred_offspring(bred)
            for child in offspring:
                self.made.setdefault(child["version_id"], child)
            new = [child["version_id"] for child in offspring]
            self.evaluate(f"g{number}", new)
            pool = list(dict.fromkeys(population + new))
            population = self.rank(pool)[:c["population"]]
            self.record(number, pool, set(population), started)
        return reason or f"{len(self.best_history)} generations done"

    def select(self, ranked: list[int], number: int) -> list[int]:
        """The elites, then tournament winners until half the population (docs/evolution-defaults.md)."""
        c = self.config
        rng = execution.generator(c["seed"], "select", number)
        parents = list(ranked[:c["elites"]])
        while len(parents) < max(2, c["population"] // 2):
            contenders = rng.sample(ranked, min(c["tournament"], len(ranked)))
            parents.append(min(contenders, key=lambda v: (-self.fitness(v), v)))
        return parents


class Reflective(Loop):
    def __init__(self, ctx: Context, plan: execution.EvolutionPlan):
        super().__init__(ctx, plan)
        self.accepted: set[int] = {self.base}  # the base and each child that joined the frontier

    def eligible(self, versions) -> list[int]:
        if not self.best_from_accepted:
            return list(versions)
        return [v for v in versions if v in self.accepted]

    def loop(self) -> str:
        c = self.config
        iterative = self.plan["mode"] == "iterative"
        started = self.ctx.now()
        self.evaluate("base", [self.base])
        self.made[self.base] = {"kind": "base", "note": "the base version"}
        candidates = [self.base]
        self.record(0, [self.base], {self.base}, started)
        block, block_start, reason = [], self.ctx.now(), ""
        iterations = c["generations"] * c["population"]
        for iteration in range(1, iterations + 1):
            reason = self.stop_reason()
            if reason:
                break
            if (iteration - 1) % c["population"] == 0:
                self.boundary(f"i{iteration}")
            parent, merge_with = self.pick(candidates, iteration, allow_merge=not iterative)
            reflected = self.ctx.step(f"reflect:{iteration}", execution.reflect, self.run_id, iteration,
                                      {"version_id": parent, "eval_run": self.scores[parent]["eval_run"]},
                                      None if merge_with is None else
                                      {"version_id": merge_with, "eval_run": self.scores[merge_with]["eval_run"]},
                                      sorted(self.scores), self.spent(), **reflect_options())
            child = self.reflected_child(reflected)
            if child is not None and child["version_id"] not in self.scores:
                version = child["version_id"]
                self.made[version] = child
                try:
                    accepted = self.try_child(version, parent, iteration, iterative)
                except BudgetSpent as spent:
                    reason = str(spent)
                    break
                block.append(version)
                if accepted:
                    candidates = [version] if iterative else [*candidates, version]
            if iteration % c["population"] == 0 or iteration == iterations:
                self.record_block(block, candidates, block_start)
                block, block_start = [], self.ctx.now()
        if block and self.best_as_found:
            # a stop rule ended the run inside a block: its row too, so that a row names each best the run held
            self.record_block(block, candidates, block_start)
        return reason or f"{iterations} proposals made"

    def record_block(self, block: list[int], candidates: list[int], started: datetime) -> None:
        """A block of proposals as a generation's row: its scored proposals (the run's best when none was), the
        frontier as its survivors."""
        members = [v for v in block if v in self.scores] or [self.best()]
        self.record(len(self.best_history), members, set(candidates), started)

    def beats_parent_on_minibatch(self, child: int, parent: int, iteration: int) -> bool:
        """The child scored on a minibatch drawn from the search items; whether it scores more than its parent there."""
        rng = execution.generator(self.config["seed"], "minibatch", iteration)
        items = sorted(rng.sample(self.search_items, min(self.config["minibatch"], len(self.search_items))))
        quick = self.evaluate(f"mb{iteration}", [child], items=items).get(child, {})
        parent_scores = self.scores[parent]["scores"]
        before = [parent_scores.get(str(item)) or 0.0 for item in items]
        after = [(quick.get("scores") or {}).get(str(item)) or 0.0 for item in items]
        return sum(after) > sum(before)

    def try_child(self, child: int, parent: int, iteration: int, iterative: bool) -> bool:
        """Minibatch first; all the search items only when the child beats its parent there."""
        if not self.beats_parent_on_minibatch(child, parent, iteration):
            return False
        self.evaluate(f"full{iteration}", [child])
        refused = iterative and not self.significantly_better(child, parent)
        if not refused:
            self.accepted.add(child)
        self.note_best()  # read from the search set (no held-out claim, or no validation yet), the best changes here
        if refused:
            return False
        # a candidate is scored on validation as it joins the frontier (as GEPA scores each accepted candidate on
        # its validation set), so the run holds it as its best from then on, not from the end of the block
        if self.best_as_found:
            self.validate(f"i{iteration}", [child])
        return True

    def significantly_better(self, child: int, parent: int) -> bool:
        """The iterative mode's test: the paired comparison of child and parent on the search items says "better"
        (with fewer than 6 items Wilcoxon never does at alpha 0.05)."""
        from evals.stats import paired_comparison

        mine, theirs = self.scores[child]["scores"], self.scores[parent]["scores"]
        paired = [item for item in map(str, self.search_items)
                  if mine.get(item) is not None and theirs.get(item) is not None]
        return paired_comparison([theirs[i] for i in paired], [mine[i] for i in paired]).verdict == "better"

    def pick(self, candidates: list[int], iteration: int, *, allow_merge: bool) -> tuple[int, int | None]:
        """A parent from the Pareto frontier, weighted by the items it leads on; sometimes a second
        frontier version leading on other items to merge with."""
        rng = execution.generator(self.config["seed"], "pick", iteration)
        leads: dict[int, set[str]] = {v: set() for v in candidates}
        for item in map(str, self.search_items):
            scores = {v: self.scores[v]["scores"].get(item) or 0.0 for v in candidates}
            top = max(scores.values())
            for version, score in scores.items():
                if score == top:
                    leads[version].add(item)
        frontier = sorted((v for v in candidates if leads[v]), key=lambda v: (-len(leads[v]), v)) or [self.best()]
        parent = rng.choices(frontier, weights=[max(1, len(leads[v])) for v in frontier])[0]
        if allow_merge and len(frontier) > 1 and rng.random() < MERGE_PROBABILITY:
            others = [v for v in frontier if v != parent and leads[v] - leads[parent]]
            if others:
                return parent, rng.choice(others)
        return parent, None
