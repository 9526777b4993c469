"""Evolution runs driven in-process with the offline model: GP, reflective and iterative modes,
determinism, stop rules, pause and resume, cancel."""

from datetime import timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.utils import timezone

from durable import tick
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from evolution import execution
from evolution.models import EvolutionRun, Generation, Individual
from evolution.services import EvolutionError, evolution_cancel, evolution_pause, evolution_resume, evolution_start
from tests.builders import graph, node
from workflows.dsl import parse
from workflows.models import WorkflowVersion

pytestmark = pytest.mark.django_db

SMALL = {"population": 4, "generations": 3, "seed": 7}


def members(run) -> list[list[tuple[int, float]]]:
    return [[(i.workflow_version_id, i.fitness) for i in g.individuals.order_by("workflow_version_id")]
            for g in Generation.objects.filter(evolution_run=run).order_by("number")]


def test_an_offline_gp_run_finds_a_fitter_version_than_its_base(facts, support_set, support_base, evolve):
    run = evolve(support_base.workflow, support_set, config=SMALL)
    assert run.status == "completed", run.error
    generations = list(Generation.objects.filter(evolution_run=run).order_by("number"))
    assert [g.number for g in generations] == [0, 1, 2] and run.generations_done == 3
    assert all(g.stats["best"] >= g.stats["avg"] >= g.stats["worst"] for g in generations)
    assert run.best_fitness > run.base_fitness and run.lift > 0.1
    best = run.best_version
    assert best.operation in ("mutation", "crossover", "immigrant") and best.generation is not None
    parse(best.dsl)  # every kept version is a valid workflow
    assert run.evaluations == Individual.objects.filter(evolution_run=run).values("workflow_version").distinct() \
        .count()
    assert run.rollouts > 0 and run.stop_reason == "3 generations done"
    # each generation keeps `population` survivors, ranked with their parents
    assert all(g.individuals.filter(survived=True).count() <= 4 for g in generations)


def test_the_same_seed_makes_the_same_run_and_pays_nothing_the_second_time(facts, support_set, support_base, evolve):
    first = evolve(support_base.workflow, support_set, config=SMALL)
    second = evolve(support_base.workflow, support_set, config=SMALL)
    assert members(first) == members(second)
    assert second.best_version == first.best_version and second.best_fitness == first.best_fitness
    assert second.rollouts == 0  # every individual's results were reused: a genome is never paid twice
    other = evolve(support_base.workflow, support_set, config={**SMALL, "seed": 8})
    assert members(other) != members(first)


@pytest.mark.parametrize("config, reason", [
    ({"max_evaluations": 2}, "evaluation cap reached"),
    ({"convergence_generations": 1, "convergence_epsilon": 100.0, "generations": 5}, "converged"),
])
def test_stop_rules(facts, support_set, support_base, evolve, config, reason):
    run = evolve(support_base.workflow, support_set, config={**SMALL, **config})
    assert run.status == "completed" and run.stop_reason.startswith(reason), run.stop_reason
    assert run.generations_done < 5


def test_the_usd_budget_and_the_time_limit_stop_a_run(facts, support_set, support_base, evolve, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 1000}}
    run = evolve(support_base.workflow, support_set, config={**SMALL, "usd_budget": 0.0001})
    assert run.stop_reason.startswith("USD budget reached") and run.generations_done == 1
    settings.LLM_PRICES = {}
    from datetime import timedelta

    from django.utils import timezone

    late = evolution_start(workflow=support_base.workflow, golden_set=support_set, config={**SMALL, "seed": 3,
                                                                                            "time_limit_seconds": 60})
    EvolutionRun.objects.filter(pk=late.pk).update(started_at=timezone.now() - timedelta(hours=1))
    run_until_settled(late.durable_run_id, max_wait=120)
    late.refresh_from_db()
    assert late.stop_reason.startswith("time limit reached") and late.generations_done == 1


def test_pause_takes_effect_at_the_next_generation_and_resume_goes_on(facts, support_set, support_base):
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    evolution_pause(run=run)
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert run.status == "paused" and run.paused_at == "g1" and run.generations_done == 1
    with pytest.raises(EvolutionError):
        evolution_pause(run=run)
    evolution_resume(run=run)
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert run.status == "completed" and run.generations_done == 3 and run.paused_at == ""


def test_a_resume_before_the_boundary_is_not_kept_for_a_later_pause(facts, support_set, support_base):
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    evolution_pause(run=run)
    evolution_resume(run=run)  # before the run reached a boundary: nothing to signal
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert run.status == "completed"


def test_cancel_ends_the_run_and_its_eval_runs(facts, support_set, support_base):
    from durable import owners
    from evals.models import EvalRun

    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    evolution_pause(run=run)
    run_until_settled(run.durable_run_id, max_wait=120)
    assert evolution_cancel(run=run) and run.status == "cancelled"
    owners.reconcile()
    assert not EvalRun.objects.exclude(status__in=EvalRun.TERMINAL).exists()
    assert evolution_cancel(run=run) is False


@pytest.mark.parametrize("mode", ["reflective", "iterative"])
def test_reflective_and_iterative_runs_improve_with_minibatches_first(facts, support_set, support_base, evolve,
                                                                      mode):
    run = evolve(support_base.workflow, support_set, mode=mode, config={"population": 3, "generations": 2,
                                                                        "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    assert run.best_fitness > run.base_fitness
    kinds = set(Individual.objects.filter(evolution_run=run).values_list("kind", flat=True))
    assert "base" in kinds and kinds & {"iterative", "prompt", "crossover"}
    # a minibatch eval run scores only its items
    from evals.models import EvalRun

    minibatches = EvalRun.objects.filter(origin="evolution", config__has_key="item_ids")
    assert minibatches.exists() and all(len(r.config["item_ids"]) == 2 for r in minibatches)


# A crash simulated in-process: a step function runs its real body (its writes commit) and the worker then
# "dies" before the checkpoint (`WorkerDied`, a BaseException); the lease is expired and the tick's recovery
# pass hands the run to a new turn.


class WorkerDied(BaseException):
    """The worker process died right after a step's side effects and before its checkpoint."""


def die_after(monkeypatch, name: str, *, when=lambda args: True, times: int = 1) -> list:
    real = getattr(execution, name)
    deaths: list = []

    def step(*args):
        result = real(*args)
        if len(deaths) < times and when(args):
            deaths.append(args)
            raise WorkerDied(name)
        return result

    # named as the function it replaces, so a queued step (breeding with a real model) resolves its path to it
    step.__module__, step.__qualname__ = real.__module__, real.__qualname__
    monkeypatch.setattr(execution, name, step)
    return deaths


def drive_through_crashes(run: EvolutionRun, *, crashes: int = 1) -> EvolutionRun:
    """Drive the run; each time the worker dies, expire the lease (a turn's) or the step's clock (a queued
    step's) and let the tick's recovery or timeout pass hand the work to a fresh worker."""
    for _ in range(crashes + 1):
        try:
            run_until_settled(run.durable_run_id, max_wait=300)
        except WorkerDied:
            past = timezone.now() - timedelta(hours=1)
            DurableRun.objects.filter(status="running").update(locked_until=past)
            StepCheckpoint.objects.filter(status="running", queue__gt="").update(timeout_at=past)
            assert tick.recover_expired_leases() + tick.time_out_silent_steps() >= 1
            continue
        break
    run.refresh_from_db()
    return run


BASE_DSL = graph("agent", node("agent", prompt="You are a helpful support agent."))


def test_a_reflect_step_run_again_after_a_crash_returns_the_same_offspring(facts, support_set, make_version,
                                                                           monkeypatch):
    """The same reflective run (same base, set, seed) on two copies of the workflow: one uninterrupted,
    one whose worker dies right after the first `reflect` step wrote its offspring. The crashed run
    must make the same choices (the module docstring: "a resumed run makes the same choices"): the
    same offspring versions, no extra orphan version left by the lost execution."""
    config = {"population": 2, "generations": 1, "seed": 1, "minibatch": 2}
    clean_base = make_version(BASE_DSL, name="clean")
    clean = evolution_start(workflow=clean_base.workflow, golden_set=support_set, mode="reflective", config=config)
    clean = drive_through_crashes(clean, crashes=0)
    assert clean.status == "completed", clean.error

    crashed_base = make_version(BASE_DSL, name="crashed")
    deaths = die_after(monkeypatch, "reflect", when=lambda args: args[1] == 1)
    crashed = evolution_start(workflow=crashed_base.workflow, golden_set=support_set, mode="reflective",
                              config=config)
    crashed = drive_through_crashes(crashed, crashes=1)
    assert deaths and crashed.status == "completed", crashed.error

    def made(run, base):
        return (sorted(WorkflowVersion.objects.filter(workflow=base.workflow).values_list("dsl_hash", flat=True)),
                sorted(Individual.objects.filter(evolution_run=run).values_list("kind", flat=True)))

    assert made(crashed, crashed_base) == made(clean, clean_base)


def test_an_evolution_is_refused_with_reasons(support_set, support_base, workspace, other_workspace, make_version):
    from evals.services import golden_set_create
    from tests.builders import graph, node

    with pytest.raises(EvolutionError) as refused:
        evolution_start(workflow=support_base.workflow, golden_set=support_set, mode="magic",
                        config={"population": 1, "nonsense": 3, "crossover_rate": 0.9, "mutation_rate": 0.5})
    assert {"mode", "config.population", "config.nonsense", "config.mutation_rate"} <= refused.value.errors.keys()
    foreign = golden_set_create(workspace=other_workspace, name="foreign", graders=[{"kind": "exact"}])
    with pytest.raises(EvolutionError) as refused:
        evolution_start(workflow=support_base.workflow, golden_set=foreign)
    assert "golden_set" in refused.value.errors
    lacking = make_version(graph("a", node("a", tools=["tavily"])), name="lacking")
    with pytest.raises(EvolutionError) as refused:
        evolution_start(workflow=lacking.workflow, golden_set=support_set)
    assert "base_version.tools" in refused.value.errors
    assert not EvolutionRun.objects.exists() and WorkflowVersion.objects.filter(generation__isnull=False).count() == 0


def test_configuration_edges():
    from evolution.conf import evolution_config

    assert evolution_config({"population": 2})[1] == {}  # elites default to fit the population
    assert evolution_config([1])[1] == {"config": ["must be an object of settings"]}
    assert "config.mutation_weights" in evolution_config({"mutation_weights": {"model": 1e308, "prompt": 1e308}})[1]
    assert "config.mutation_weights" in evolution_config({"mutation_weights": {"model": 0}})[1]


@pytest.mark.parametrize("key", ["population", "max_evaluations", "seed"])
def test_an_infinite_whole_number_setting_is_refused_naming_it(key):
    """`int(value)` in evolution_config raises OverflowError for float('inf') (what json.loads makes of
    1e400). The API's JSONField happens to refuse it first, but the service's contract is EvolutionError
    fields for every bad value (callers: admin, command, other services): it must name config.<key>."""
    from evolution.conf import evolution_config

    try:
        _config, errors = evolution_config({key: float("inf")})
    except OverflowError as exc:
        pytest.fail(f"evolution_config raised {exc!r} instead of naming config.{key}")
    assert f"config.{key}" in errors


def test_cancelling_an_evolution_before_its_eval_runs_start_frees_its_golden_set(support_set, support_base, owner,
                                                                                   api_as):
    from durable import owners, turns
    from evals.models import EvalRun

    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    turns.execute_turn(run.durable_run_id)  # generation 0's eval runs are written, their runs not begun
    eval_runs = EvalRun.objects.filter(golden_set=support_set)
    assert eval_runs.count() == 4 and set(eval_runs.values_list("status", flat=True)) == {"queued"}
    assert evolution_cancel(run=run)
    assert owners.reconcile()["evals.EvalRun"] == 4
    assert set(eval_runs.values_list("status", flat=True)) == {"cancelled"}
    item = support_set.items.first()
    changed = api_as(owner).patch(f"/api/golden-items/{item.pk}/", {"expected_output": "changed"}, format="json")
    assert changed.status_code == 200, changed.content


def test_the_reconcile_reaches_an_evolution_run_behind_any_number_of_active_ones(support_set, support_base):
    from durable import owners
    from durable.services import run_cancel

    waiting = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    cancelled = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    run_cancel(run_id=cancelled.durable_run_id, reason="from the durable admin")
    assert owners.reconcile(limit=1)["evolution.EvolutionRun"] == 1
    waiting.refresh_from_db()
    cancelled.refresh_from_db()
    assert cancelled.status == "cancelled" and waiting.status == "queued"


def test_a_failed_evolution_retried_to_its_end_is_completed_with_its_best(support_set, support_base, monkeypatch):
    from durable.services import run_retry
    from evolution import execution

    record = execution.record_generation

    def outage(*args):
        raise RuntimeError("the database said no")

    monkeypatch.setattr(execution, "record_generation", outage)
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set,
                          config={"population": 2, "generations": 1, "seed": 7})
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert run.status == "failed" and "said no" in run.error
    monkeypatch.setattr(execution, "record_generation", record)
    assert run_retry(run_id=run.durable_run_id)
    assert run_until_settled(run.durable_run_id, max_wait=120).status == "completed"
    run.refresh_from_db()
    assert run.status == "completed" and run.error == "" and run.stop_reason == "1 generations done"
    assert run.best_version_id is not None and run.best_fitness is not None and run.ended_at


def test_the_usd_budget_binds_inside_a_generation_and_counts_every_paid_call(support_set, support_base, settings):
    from evals.models import EvalRun
    from workflows.models import WorkflowInvocation

    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 1000}}
    settings.LLM_CACHE_ENABLED = False
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set,
                          config={"population": 4, "generations": 3, "seed": 7, "concurrency": 1,
                                  "usd_budget": 0.0001})
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert run.status == "completed" and run.stop_reason.startswith("USD budget reached"), run.stop_reason
    # generation 0's eval runs each had a share of what was left: each started one item, paid, and stopped
    eval_runs = EvalRun.objects.filter(golden_set=support_set)
    assert 0 < eval_runs.count() <= 4 and WorkflowInvocation.objects.count() == eval_runs.count()
    assert all(r.status == "failed" and r.error.startswith("USD budget spent") for r in eval_runs), \
        [(r.status, r.error) for r in eval_runs]
    paid = sum(WorkflowInvocation.objects.values_list("usd_cost", flat=True))
    assert paid > 0 and run.usd_cost == paid  # every paid call counts, though its eval run failed


# ------------------------------------------------------------------------------------------ held-out items

def eval_runs_of(run):
    from evals.models import EvalRun

    return list(EvalRun.objects.filter(parent_run_id=run.durable_run_id).order_by("pk"))


def split_ids(golden_set) -> dict[str, set[int]]:
    from evals.selectors import split_items

    return {split: set(ids) for split, ids in split_items(golden_set).items()}


def test_a_held_out_run_whose_budget_ended_before_any_validation_says_its_best_was_chosen_on_train(
        held_out_set, support_base, evolve, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 1000}}
    settings.LLM_CACHE_ENABLED = False
    run = evolve(support_base.workflow, held_out_set, config={"population": 3, "generations": 2, "seed": 1,
                                                              "usd_budget": 0.0001})
    assert run.status == "completed" and run.stop_reason.startswith("USD budget reached"), run.stop_reason
    assert run.report["held_out"] is True and run.report["best"]["validation"] is None
    assert run.report["selected_on"] == "train"


@pytest.mark.parametrize("mode", ["gp", "reflective"])
def test_a_held_out_run_searches_on_train_and_reads_test_only_for_its_report(facts, held_out_set, support_base,
                                                                             evolve, mode):
    from evals.models import GoldenResult

    run = evolve(support_base.workflow, held_out_set, mode=mode,
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    assert run.report["held_out"] is True and run.report["selected_on"] == "validation"
    ids = split_ids(held_out_set)
    runs = eval_runs_of(run)
    assert all("item_ids" in r.config for r in runs)  # never the whole set
    on_test = [r for r in runs if set(r.config["item_ids"]) & ids["test"]]
    # the test split: once, for the report, after everything else; base and best, on the test items alone
    assert {r.workflow_version_id for r in on_test} == {run.base_version_id, run.best_version_id}
    assert all(set(r.config["item_ids"]) == ids["test"] for r in on_test)
    assert runs[-len(on_test):] == on_test
    assert set(GoldenResult.objects.filter(golden_item_id__in=ids["test"]).values_list("eval_run", flat=True)) \
        == {r.pk for r in on_test}
    search = [r for r in runs if r not in on_test and not set(r.config["item_ids"]) & ids["validation"]]
    assert search and all(set(r.config["item_ids"]) <= ids["train"] for r in search)
    if mode == "reflective":  # minibatches come from train too
        assert any(len(r.config["item_ids"]) == 2 for r in search)
    validated = [r for r in runs if set(r.config["item_ids"]) == ids["validation"]]
    assert run.base_version_id in {r.workflow_version_id for r in validated}
    assert len({r.workflow_version_id for r in validated}) == len(validated)  # each version once


def test_a_reflective_run_validates_each_candidate_as_it_joins_the_frontier(facts, held_out_set, support_base,
                                                                           evolve):
    """An accepted candidate is scored on validation right after its train eval run, so the run may hold it as its
    best from then on; each generation's row lists the changes of the run's best with the run's rollouts then."""
    run = evolve(support_base.workflow, held_out_set, mode="reflective",
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    ids = split_ids(held_out_set)
    runs = [r for r in eval_runs_of(run) if not set(r.config["item_ids"]) & ids["test"]]
    accepted = [(i, r) for i, r in enumerate(runs) if set(r.config["item_ids"]) == ids["train"]
                and r.workflow_version_id != run.base_version_id]
    assert accepted, "no candidate beat its parent on a minibatch: the test shows nothing"
    for index, train in accepted:
        following = runs[index + 1]
        assert following.workflow_version_id == train.workflow_version_id
        assert set(following.config["item_ids"]) == ids["validation"]
    changes = [c for g in Generation.objects.filter(evolution_run=run).order_by("number")
               for c in g.stats["run_best_changes"]]
    assert changes[0]["version_id"] == run.base_version_id and changes[-1]["version_id"] == run.best_version_id
    assert all(a["version_id"] != b["version_id"] for a, b in pairwise(changes))
    rollouts = [c["run_rollouts"] for c in changes]
    assert rollouts == sorted(rollouts) and rollouts[-1] <= run.rollouts


def rollouts_after(run) -> dict[int, int]:
    """The run's cumulative rollouts (fresh item invocations, as eval_scores counts them) after each of its eval
    runs, in the order they were created."""
    from evals.models import GoldenResult

    total, after = 0, {}
    for eval_run in eval_runs_of(run):
        total += GoldenResult.objects.filter(eval_run=eval_run, reused_from__isnull=True,
                                             workflow_invocation__isnull=False).count()
        after[eval_run.pk] = total
    return after


@pytest.mark.parametrize("golden", ["held_out_set", "support_set"])
def test_each_change_of_a_reflective_runs_best_is_recorded_with_the_rollouts_when_it_changed(
        facts, support_base, evolve, request, golden):
    """The run's best changes when the eval run that puts a version first ends: its validation eval run with a
    held-out claim, its eval run on the whole set without one. Each change a row lists carries the run's rollouts
    right then, not at the end of the block (a set too small to split has no validation to wait for)."""
    golden_set = request.getfixturevalue(golden)
    run = evolve(support_base.workflow, golden_set, mode="reflective",
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    selected = split_ids(golden_set)["validation"] if run.held_out else None
    deciding = {r.workflow_version_id: r.pk for r in eval_runs_of(run)
                if (set(r.config["item_ids"]) == selected if selected else "item_ids" not in r.config)}
    after = rollouts_after(run)
    changes = [c for g in Generation.objects.filter(evolution_run=run).order_by("number")
               for c in g.stats["run_best_changes"]]
    assert len(changes) >= 2 and changes[-1]["version_id"] == run.best_version_id
    assert [c["run_rollouts"] for c in changes] == [after[deciding[c["version_id"]]] for c in changes]


@pytest.mark.parametrize("golden", ["held_out_set", "support_set"])
def test_a_stop_rule_inside_a_reflective_block_still_writes_its_row(facts, support_base, evolve, request, golden):
    """The evaluation cap ends the run after its first accepted candidate, inside the first block of proposals: that
    block gets its row too, so the run's best (the candidate, validated as it joined the frontier, or the best on
    the whole set) is a version some row names, and the last change of the best its rows list."""
    golden_set = request.getfixturevalue(golden)
    run = evolve(support_base.workflow, golden_set, mode="reflective",
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2, "max_evaluations": 2})
    assert run.status == "completed" and run.stop_reason.startswith("evaluation cap reached"), run.stop_reason
    assert run.best_version_id != run.base_version_id
    rows = list(Generation.objects.filter(evolution_run=run).order_by("number"))
    assert run.generations_done == len(rows) == 2
    assert rows[-1].stats["run_best_version_id"] == run.best_version_id
    assert Individual.objects.filter(generation=rows[-1], workflow_version_id=run.best_version_id).exists()
    assert [c for g in rows for c in g.stats["run_best_changes"]][-1]["version_id"] == run.best_version_id


def test_a_budget_spent_inside_a_reflective_block_still_writes_its_row(facts, held_out_set, support_base, evolve,
                                                                       monkeypatch):
    """The budget runs out once the first accepted candidate is validated (the next minibatch cannot start): the
    run stops naming the budget, and the block it stopped in has its row, which names the candidate as its best."""
    from evolution.durable_workflows import BudgetSpent, Loop

    share = Loop.budget_share

    def spent_after_two_validations(self, count):
        if len(self.validation) >= 2:  # the base and the first candidate: a function of the replayed state
            raise BudgetSpent(self.budget_reason())
        return share(self, count)

    monkeypatch.setattr(Loop, "budget_share", spent_after_two_validations)
    run = evolve(support_base.workflow, held_out_set, mode="reflective",
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed" and run.stop_reason.startswith("USD budget reached"), run.stop_reason
    assert "test split was not scored" in run.report["test_error"]
    rows = list(Generation.objects.filter(evolution_run=run).order_by("number"))
    assert len(rows) == 2 and run.best_version_id != run.base_version_id
    assert rows[-1].stats["run_best_version_id"] == run.best_version_id
    assert rows[-1].stats["run_rollouts"] == run.rollouts
    assert [c for g in rows for c in g.stats["run_best_changes"]][-1]["version_id"] == run.best_version_id


def test_a_reflective_run_resumed_after_crashes_records_the_changes_of_its_best_as_an_uninterrupted_one(
        facts, held_out_set, make_version, monkeypatch):
    """The same held-out reflective run on two copies of the workflow: one uninterrupted, one whose worker dies right
    after a candidate's validation eval run was read (before its checkpoint) and again right after the generation 1
    row was written. The resumed run replays to the same changes of its best, at the same rollouts, and the same
    totals and best."""
    config = {"population": 3, "generations": 2, "seed": 1, "minibatch": 2}
    crashed_copy_replays_as_the_clean_one(held_out_set, make_version, monkeypatch, mode="reflective", config=config,
                                          dies_after_a_childs_run_on=split_ids(held_out_set)["validation"])


def best_rows(run, base) -> list[tuple]:
    """Each row's run best, rollouts and changes of the best, versions named by their DSL hash (comparable across
    two copies of a workflow)."""
    hashes = dict(WorkflowVersion.objects.filter(workflow=base.workflow).values_list("pk", "dsl_hash"))
    return [(g.number, hashes[g.stats["run_best_version_id"]], g.stats["run_rollouts"],
             [(hashes[c["version_id"]], c["run_rollouts"]) for c in g.stats["run_best_changes"]])
            for g in Generation.objects.filter(evolution_run=run).order_by("number")]


def crashed_copy_replays_as_the_clean_one(golden, make_version, monkeypatch, *, mode: str, config: dict,
                                          dies_after_a_childs_run_on: set[int]) -> None:
    """Run an evolution on one copy of the workflow uninterrupted, then on another whose worker dies right after the
    scores of a child's eval run on `dies_after_a_childs_run_on` were read (before their checkpoint) and again right
    after the generation 1 row was written; the resumed run must replay to the same rows, totals and best."""
    from evals.models import EvalRun

    clean_base = make_version(BASE_DSL, name="clean")
    clean = drive_through_crashes(evolution_start(workflow=clean_base.workflow, golden_set=golden, mode=mode,
                                                  config=config), crashes=0)
    assert clean.status == "completed", clean.error

    def a_childs_run(args):
        eval_runs = EvalRun.objects.filter(pk__in=[pk for pk in args[0].values() if isinstance(pk, int)])
        return any(set(r.config.get("item_ids") or []) == dies_after_a_childs_run_on and r.workflow_version.parent1_id
                   for r in eval_runs)

    deaths = [die_after(monkeypatch, "eval_scores", when=a_childs_run),
              die_after(monkeypatch, "record_generation", when=lambda args: args[1] == 1)]
    crashed_base = make_version(BASE_DSL, name="crashed")
    crashed = drive_through_crashes(evolution_start(workflow=crashed_base.workflow, golden_set=golden, mode=mode,
                                                    config=config), crashes=2)
    assert all(deaths) and crashed.status == "completed", crashed.error
    assert best_rows(crashed, crashed_base) == best_rows(clean, clean_base)
    assert (crashed.rollouts, crashed.evaluations, crashed.stop_reason) == \
        (clean.rollouts, clean.evaluations, clean.stop_reason)
    assert WorkflowVersion.objects.get(pk=crashed.best_version_id).dsl_hash == \
        WorkflowVersion.objects.get(pk=clean.best_version_id).dsl_hash


def try_child_as_begun_before_validation_on_acceptance(self, child, parent, iteration, iterative):
    """Reflective.try_child as the loop had it before a candidate was validated as it joined the frontier."""
    if not self.beats_parent_on_minibatch(child, parent, iteration):
        return False
    self.evaluate(f"full{iteration}", [child])
    return not iterative


def test_a_reflective_run_begun_before_validation_on_acceptance_replays_as_it_began(facts, held_out_set,
                                                                                    support_base, monkeypatch):
    """A run the earlier loop began (its plan has no "best_as_found") and whose worker died after writing the
    generation 1 row is picked up by the present loop: it replays the history as it was written and goes on the way
    it began (candidates validated at the end of their block), instead of failing on a checkpoint it does not
    expect."""
    from durable import owners
    from evolution.durable_workflows import Reflective

    owner = next(o for o in owners.registered() if o.model is EvolutionRun)
    plan = owner.plan
    later = {"best_as_found", "best_from_accepted"}  # the earlier loop's plans had neither
    monkeypatch.setattr(owner, "plan", lambda run: {k: v for k, v in plan(run).items() if k not in later})
    monkeypatch.setattr(Reflective, "try_child", try_child_as_begun_before_validation_on_acceptance)
    deaths = die_after(monkeypatch, "record_generation", when=lambda args: args[1] == 1)
    run = evolution_start(workflow=support_base.workflow, golden_set=held_out_set, mode="reflective",
                          config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    with pytest.raises(WorkerDied):
        run_until_settled(run.durable_run_id, max_wait=300)
    assert deaths
    monkeypatch.undo()  # the present loop takes the run over
    past = timezone.now() - timedelta(hours=1)
    DurableRun.objects.filter(status="running").update(locked_until=past)
    assert tick.recover_expired_leases() >= 1
    durable = run_until_settled(run.durable_run_id, max_wait=300)
    run.refresh_from_db()
    assert durable.status == "completed" and run.status == "completed", durable.error
    names = set(StepCheckpoint.objects.filter(run_id=run.durable_run_id).values_list("name", flat=True))
    assert "scores:full1" in names and not {n for n in names if n.startswith("evals:val:i")}
    assert Generation.objects.filter(evolution_run=run).order_by("number").last().stats["run_best_version_id"] \
        == run.best_version_id


def test_the_run_best_is_the_validation_best_not_the_train_best(facts, diverging_set, support_base, evolve):
    from evals.models import EvalRun

    run = evolve(support_base.workflow, diverging_set, config={"population": 4, "generations": 3, "seed": 7})
    assert run.status == "completed", run.error
    ids = split_ids(diverging_set)
    train, validation = {}, {}
    for eval_run in EvalRun.objects.filter(parent_run_id=run.durable_run_id):
        items = set(eval_run.config["item_ids"])
        if items == ids["train"]:
            train[eval_run.workflow_version_id] = eval_run.fitness
        elif items == ids["validation"]:
            validation[eval_run.workflow_version_id] = eval_run.fitness
    train_best = max(train, key=lambda v: (train[v], -v))
    assert train_best != run.best_version_id and validation[train_best] < validation[run.best_version_id]
    assert validation[run.best_version_id] == max(validation.values())
    assert run.best_fitness == train[run.best_version_id] < train[train_best]  # its train fitness, not the best's
    assert run.report["best"]["validation"] == validation[run.best_version_id]
    last = Generation.objects.filter(evolution_run=run).order_by("number").last()
    assert last.stats["run_best_version_id"] == run.best_version_id
    assert last.stats["run_best_validation_fitness"] == validation[run.best_version_id]


def test_the_report_states_train_validation_and_test_and_compares_on_test(facts, held_out_set, support_base, evolve):
    from evals.models import EvalRun, GoldenResult
    from evals.stats import paired_comparison

    run = evolve(support_base.workflow, held_out_set, config={"population": 3, "generations": 2, "seed": 1})
    assert run.status == "completed", run.error
    report, ids = run.report, split_ids(held_out_set)
    assert report["splits"] == {"train": 12, "validation": 6, "test": 6} and report["reason"] == ""
    fitness = {}
    for eval_run in EvalRun.objects.filter(parent_run_id=run.durable_run_id):
        split = next(s for s, members in ids.items() if set(eval_run.config["item_ids"]) == members)
        fitness[eval_run.workflow_version_id, split] = eval_run.fitness
    for role, version in (("base", run.base_version_id), ("best", run.best_version_id)):
        assert report[role]["version_id"] == version
        assert {split: report[role][split] for split in ids} == {split: fitness[version, split] for split in ids}
    assert (run.base_fitness, run.best_fitness) == (report["base"]["train"], report["best"]["train"])
    test = report["test"]
    base_test, best_test = fitness[run.base_version_id, "test"], fitness[run.best_version_id, "test"]
    assert test["lift"] == pytest.approx((best_test - base_test) / base_test) and test["lift"] > 0.1
    assert run.test_lift == test["lift"]

    def scores(eval_run_id):
        return dict(GoldenResult.objects.filter(eval_run_id=eval_run_id).values_list("golden_item_id", "score"))

    a, b = scores(test["eval_runs"]["base"]), scores(test["eval_runs"]["best"])
    order = test["item_ids"]
    assert set(order) == ids["test"] and test["paired"] == 6
    assert test["comparison"] == paired_comparison([a[i] for i in order], [b[i] for i in order]).as_dict()
    assert test["comparison"]["verdict"] == "better"
    assert test["lift_low"] == pytest.approx(test["comparison"]["ci_low"] / test["comparison"]["mean_a"], abs=1e-6)
    assert test["lift_low"] <= test["comparison"]["mean_diff"] / test["comparison"]["mean_a"] <= test["lift_high"]
    assert report["train_test_gap"] == pytest.approx(report["best"]["train"] - best_test)


def test_a_test_split_eval_run_that_did_not_complete_is_no_test_fitness_and_no_lift():
    """The best's eval run on the test split was cancelled after one item: the report says the split went
    unscored for it, and states no test fitness, lift or train-test gap (not a best at 0 on test, -100%)."""
    from evolution.execution import test_report

    so_far = {"held_out": True, "reason": "", "selected_on": "validation", "splits": {},
              "base": {"version_id": 1, "train": 50.0, "validation": 50.0, "test": None},
              "best": {"version_id": 2, "train": 70.0, "validation": 65.0, "test": None}, "test": None}
    base = {"fitness": 50.0, "scores": {"11": 0.5, "12": 0.5, "13": 0.5}, "eval_run": 10, "error": ""}
    best = {"fitness": 0.0, "scores": {"11": 0.9}, "eval_run": 20, "error": "cancelled by an operator"}
    report = test_report(so_far, [11, 12, 13], base, best)
    assert "cancelled by an operator" in report["test_error"]
    assert report["best"]["test"] is None and report["base"]["test"] == 50.0
    assert (report["test"]["lift"], report["train_test_gap"]) == (None, None)


def test_a_set_too_small_to_split_states_that_the_run_has_no_held_out_claim(facts, support_set, support_base,
                                                                            evolve):
    from evals.selectors import split_plan

    run = evolve(support_base.workflow, support_set, config=SMALL)
    assert run.status == "completed", run.error
    report = run.report
    assert report["held_out"] is False and run.held_out is False and report["selected_on"] == "whole set"
    assert report["reason"] == split_plan(support_set).reason and "6 items" in report["reason"]
    assert report["test"] is None and run.test_lift is None
    assert report["best"] == {"version_id": run.best_version_id, "whole_set": run.best_fitness}
    assert all("item_ids" not in r.config for r in eval_runs_of(run))  # searched and selected on the whole set


def test_a_reflect_step_counts_what_its_rewriter_model_cost(facts, support_set, support_base, evolve, settings,
                                                            openai_server):
    """The rewriter's call is spend of the evolution like its eval runs' calls: the reflect step returns it,
    so the run's USD budget binds on it too (a rewriter that found nothing new cost money all the same)."""
    import json
    from decimal import Decimal

    from evals.models import EvalRun
    from evolution import execution
    from llm.prices import cost_usd

    run = evolve(support_base.workflow, support_set, mode="reflective",
                 config={"population": 2, "generations": 1, "seed": 1, "minibatch": 2})
    base_eval = EvalRun.objects.filter(workflow_version=support_base).order_by("pk").first()
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.EVAL_REWRITER_MODEL = "gpt-4.1-mini"
    openai_server.chat_replies = [{"content": json.dumps({
        "improved_prompt": "You are a helpful support agent. Call knowledge_search before answering.",
        "confidence": 0.9, "changelog": ["look the facts up"]}),
        "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}]
    reflected = execution.reflect(run.pk, 9, {"version_id": support_base.pk, "eval_run": base_eval.pk}, None,
                                  [support_base.pk])
    assert len(openai_server.chat_payloads) == 1
    spent = cost_usd("gpt-4.1-mini", provider="openai", input_tokens=1000, output_tokens=500)
    assert spent > 0 and Decimal(reflected["usd"]) == spent
    assert reflected["child"]["version_id"] != support_base.pk and reflected["child"]["kind"] == "iterative"


# ------------------------------------------------------------------------------------------ a real model breeding

CALL_USD = Decimal("0.015")  # a guided call's 10 + 5 tokens (the local server's usage) at $1000 per million
IMMIGRANTS = {"population": 2, "generations": 2, "seed": 7, "crossover_rate": 0.0, "mutation_rate": 0.0}
GOAL = "Answer support questions from the knowledge base."


@pytest.fixture
def guided_online(settings, openai_server):
    """A real model (the local OpenAI-compatible server, priced) writes the guided offspring; the workflow's own
    nodes, and the model mutation's pool, stay on the offline model, so the server sees only breeding's calls."""
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.EVAL_REWRITER_MODEL = "gpt-4.1-mini"
    settings.EVOLUTION_MODELS = ["offline-directive-v1"]
    settings.LLM_PRICES = {"openai#gpt-4.1-mini": {"input": 1000, "output": 1000}}
    return openai_server


@pytest.fixture
def offline_base(make_version):
    return make_version(graph("agent", node("agent", prompt="You are a helpful support agent.",
                                            model="offline-directive-v1")), name="support")


def immigrant_requests(server) -> list[dict]:
    from evolution.guided import IMMIGRANT_PROMPT

    return [p for p in server.chat_payloads if p["messages"][0]["content"] == IMMIGRANT_PROMPT]


def written(prompt: str) -> dict:
    import json

    return {"content": json.dumps({"prompts": {"agent": prompt}, "rationale": "from the goal"})}


def test_a_breed_run_again_after_a_crash_reuses_the_answers_it_paid_for(facts, support_set, offline_base,
                                                                        guided_online, monkeypatch):
    """The worker dies right after the breed wrote its guided immigrants, before its checkpoint: the retried
    attempt asks the model nothing it already paid for, counts each paid call once, and breeds the same
    versions (none left behind by the lost attempt)."""
    guided_online.chat_replies = [written(f"You answer support questions, take {n}.") for n in range(1, 5)]
    deaths = die_after(monkeypatch, "breed")
    run = evolution_start(workflow=offline_base.workflow, golden_set=support_set, config=IMMIGRANTS, goal=GOAL)
    run = drive_through_crashes(run, crashes=1)
    assert deaths and run.status == "completed", run.error
    assert len(immigrant_requests(guided_online)) == 2  # one per offspring, across both attempts
    assert run.usd_cost == 2 * CALL_USD
    bred = set(WorkflowVersion.objects.filter(workflow=offline_base.workflow, generation=1)
               .values_list("pk", flat=True))
    kept = set(Individual.objects.filter(evolution_run=run, generation__number=1, kind="guided_immigrant")
               .values_list("workflow_version_id", flat=True))
    assert len(bred) == 2 and bred == kept


def test_the_usd_budget_binds_between_the_guided_calls_of_one_breed(facts, support_set, offline_base,
                                                                    guided_online, evolve):
    """Four guided immigrants to breed at $0.015 a call under a $0.04 budget: the third call reaches the budget, the
    fourth is never asked, and the run says the budget stopped it."""
    run = evolve(offline_base.workflow, support_set, goal=GOAL,
                 config={**IMMIGRANTS, "population": 4, "generations": 3, "usd_budget": 0.04})
    assert run.status == "completed", run.error
    assert len(immigrant_requests(guided_online)) == 3
    assert run.stop_reason.startswith("USD budget reached") and run.usd_cost == 3 * CALL_USD, run.stop_reason


@pytest.mark.parametrize("mode", ["gp", "reflective"])
def test_offline_a_real_model_named_for_breeding_is_answered_offline_in_the_turn(facts, support_set, support_base,
                                                                                 evolve, settings, openai_server, mode):
    """LLM_PROVIDER=offline answers every model name offline (llm/names.py), whatever provider it names: a rewriter
    and a model pool naming a configured real provider send nothing to it, and breeding stays in the turn."""
    settings.LLM_PROVIDER = "offline"
    settings.LLM_PROVIDERS = {"openai": {"base_url": openai_server.url("/v1")},
                              "local": {"base_url": openai_server.url("/v1")}}
    settings.EVAL_REWRITER_MODEL = "openai#gpt-4o-mini"
    settings.EVOLUTION_MODELS = ["local#gpt-4o-mini"]
    run = evolve(support_base.workflow, support_set, mode=mode, goal=GOAL,
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    assert openai_server.chat_payloads == []
    bred = StepCheckpoint.objects.filter(run_id=run.durable_run_id, name__regex=r"^(breed|reflect):")
    assert bred.exists() and set(bred.values_list("queue", flat=True)) == {""}
    kinds = set(Individual.objects.filter(evolution_run=run).values_list("kind", flat=True))
    assert not {kind for kind in kinds if kind.startswith("guided_")}


def test_a_reflect_step_run_again_reuses_its_rewriters_answer_and_asks_nothing_past_the_budget(
        facts, support_set, support_base, evolve, settings, openai_server):
    """The reflect step's attempt that died before its checkpoint paid the rewriter: the next attempt is answered
    from what it paid for (the same child, the same cost counted); a reflect once the budget is spent asks nothing."""
    import json

    from evals.models import EvalRun

    run = evolve(support_base.workflow, support_set, mode="reflective",
                 config={"population": 2, "generations": 1, "seed": 1, "minibatch": 2})
    base_eval = EvalRun.objects.filter(workflow_version=support_base).order_by("pk").first()
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.EVAL_REWRITER_MODEL = "gpt-4.1-mini"
    settings.LLM_PRICES = {"openai#gpt-4.1-mini": {"input": 1000, "output": 1000}}
    openai_server.chat_replies = [{"content": json.dumps({"improved_prompt": prompt, "confidence": 0.9,
                                                          "changelog": ["look the facts up"]})}
                                  for prompt in ("You are a support agent. Call knowledge_search before answering.",
                                                 "You are a support agent. Answer in one sentence.")]
    parent = {"version_id": support_base.pk, "eval_run": base_eval.pk}
    first = execution.reflect(run.pk, 9, parent, None, [support_base.pk], "0")
    again = execution.reflect(run.pk, 9, parent, None, [support_base.pk], "0")
    assert len(openai_server.chat_payloads) == 1
    assert again["child"]["version_id"] == first["child"]["version_id"] and first["child"]["kind"] == "iterative"
    assert Decimal(again["usd"]) == Decimal(first["usd"]) == CALL_USD
    spent = execution.reflect(run.pk, 10, parent, None, [support_base.pk], "10")  # the run's whole $10 budget
    assert spent == {"child": None, "usd": "0"} and len(openai_server.chat_payloads) == 1


@pytest.mark.parametrize("golden", ["held_out_set", "support_set"])
def test_an_iterative_run_never_holds_as_its_best_a_child_the_paired_test_kept_out(facts, support_base, evolve,
                                                                                   monkeypatch, request, golden):
    """In iterative mode a child replaces its parent only when the paired test says it is significantly better. A
    child scored on the whole search set and refused there is no candidate for the run's best either: neither the
    validation of a block's row nor the search fitness may make it the best."""
    import evals.stats

    refused = []

    def not_better(before, after, **kwargs):
        refused.append(len(after))
        return evals.stats.Comparison(len(after), None, None, None, None, None, 1.0, 0.05, "wilcoxon",
                                     "no significant difference")

    monkeypatch.setattr(evals.stats, "paired_comparison", not_better)
    run = evolve(support_base.workflow, request.getfixturevalue(golden), mode="iterative",
                 config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    assert run.status == "completed", run.error
    assert refused, "no child beat its parent on a minibatch: the test shows nothing"
    assert run.best_version_id == run.base_version_id
    rows = Generation.objects.filter(evolution_run=run).order_by("number")
    assert {g.stats["run_best_version_id"] for g in rows} == {run.base_version_id}


def test_an_iterative_run_begun_before_refused_children_were_kept_out_replays_as_it_began(
        facts, held_out_set, support_base, monkeypatch):
    """A run whose plan has no "best_from_accepted" holds its best as the earlier loop did (a refused child's
    validation counts), so its history replays unchanged."""
    import evals.stats
    from durable import owners

    owner = next(o for o in owners.registered() if o.model is EvolutionRun)
    plan = owner.plan
    monkeypatch.setattr(owner, "plan", lambda run: {k: v for k, v in plan(run).items() if k != "best_from_accepted"})
    monkeypatch.setattr(evals.stats, "paired_comparison", lambda before, after, **kwargs: evals.stats.Comparison(
        len(after), None, None, None, None, None, 1.0, 0.05, "wilcoxon", "no significant difference"))
    run = evolution_start(workflow=support_base.workflow, golden_set=held_out_set, mode="iterative",
                          config={"population": 3, "generations": 2, "seed": 1, "minibatch": 2})
    run_until_settled(run.durable_run_id, max_wait=300)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    assert run.best_version_id != run.base_version_id


def first_better_only(monkeypatch) -> dict[int, bool]:
    """Reflective.significantly_better saying yes to the first pair of (child, parent) scores it is asked about and
    no to any other: a function of the scores, so a replayed or repeated run gets the same answers; and every child
    beating its parent on its minibatch (the offline rewriter's children of a kept child seldom do), so that children
    after the kept one meet the paired test. Returns what it answered, by child."""
    from evolution.durable_workflows import Reflective

    verdicts: dict[tuple, bool] = {}
    asked: dict[int, bool] = {}

    def decide(self, child, parent):
        key = tuple(tuple(sorted(self.scores[v]["scores"].items())) for v in (child, parent))
        asked[child] = verdicts.setdefault(key, not verdicts)
        return asked[child]

    minibatch = Reflective.beats_parent_on_minibatch

    def beats(self, child, parent, iteration):
        minibatch(self, child, parent, iteration)  # its eval run, as a real minibatch
        return True

    monkeypatch.setattr(Reflective, "significantly_better", decide)
    monkeypatch.setattr(Reflective, "beats_parent_on_minibatch", beats)
    return asked


ITERATIVE = {"population": 3, "generations": 3, "seed": 1, "minibatch": 2}


@pytest.mark.parametrize("golden", ["held_out_set", "support_set"])
def test_an_iterative_runs_best_rows_and_report_name_only_the_base_or_children_the_paired_test_kept(
        facts, support_base, evolve, monkeypatch, request, golden):
    """One child passes the paired test, the later ones do not: the run's best, each row's run best, each change
    of the best and the report's best are the base or that child; a refused child is never scored on validation."""
    asked = first_better_only(monkeypatch)
    golden_set = request.getfixturevalue(golden)
    run = evolve(support_base.workflow, golden_set, mode="iterative", config=ITERATIVE)
    assert run.status == "completed", run.error
    kept = {v for v, yes in asked.items() if yes} | {run.base_version_id}
    refused = {v for v, yes in asked.items() if not yes}
    assert len(kept) == 2 and refused, asked
    rows = list(Generation.objects.filter(evolution_run=run).order_by("number"))
    named = {g.stats["run_best_version_id"] for g in rows} | {c["version_id"] for g in rows
                                                              for c in g.stats["run_best_changes"]}
    assert named <= kept and run.best_version_id in kept
    assert run.report["best"]["version_id"] == run.best_version_id
    if run.held_out:
        validation = split_ids(golden_set)["validation"]
        validated = {r.workflow_version_id for r in eval_runs_of(run) if set(r.config["item_ids"]) == validation}
        assert validated <= kept


def test_an_iterative_run_resumed_after_crashes_keeps_the_same_best_as_an_uninterrupted_one(
        facts, held_out_set, make_version, monkeypatch):
    """Two copies of a held-out iterative run where one child passes the paired test and later ones do not: one
    uninterrupted, one whose worker dies right after a child's train eval run was read and again right after the
    generation 1 row was written. The resumed run replays to the same rows, best and totals."""
    first_better_only(monkeypatch)
    crashed_copy_replays_as_the_clean_one(held_out_set, make_version, monkeypatch, mode="iterative", config=ITERATIVE,
                                          dies_after_a_childs_run_on=split_ids(held_out_set)["train"])


def try_child_as_begun_before_refused_children_were_kept_out(self, child, parent, iteration, iterative):
    """Reflective.try_child as the loop had it before a refused iterative child was kept out of the run's best
    (commit faec8ba): the best noted before the paired test."""
    from evals.stats import paired_comparison

    if not self.beats_parent_on_minibatch(child, parent, iteration):
        return False
    self.evaluate(f"full{iteration}", [child])
    self.note_best()
    if iterative:
        mine, theirs = self.scores[child]["scores"], self.scores[parent]["scores"]
        paired = [item for item in map(str, self.search_items)
                  if mine.get(item) is not None and theirs.get(item) is not None]
        if paired_comparison([theirs[i] for i in paired], [mine[i] for i in paired]).verdict != "better":
            return False
    if self.best_as_found:
        self.validate(f"i{iteration}", [child])
    return True


def test_an_iterative_run_the_earlier_loop_began_and_crashed_replays_under_the_present_loop(
        facts, held_out_set, make_version, monkeypatch):
    """A held-out iterative run the earlier loop began (its plan has best_as_found and no best_from_accepted), whose
    worker died after writing the generation 1 row, is taken over by the present loop: no checkpoint it does not
    expect, and the same rows and best as the earlier loop's uninterrupted run of a copy."""
    import evals.stats
    from durable import owners
    from evolution.durable_workflows import Reflective

    def no_difference(before, after, **kwargs):
        return evals.stats.Comparison(len(after), None, None, None, None, None, 1.0, 0.05, "wilcoxon",
                                      "no significant difference")

    def as_the_earlier_loop():
        owner = next(o for o in owners.registered() if o.model is EvolutionRun)
        plan = owner.plan
        monkeypatch.setattr(owner, "plan", lambda run: {k: v for k, v in plan(run).items()
                                                        if k != "best_from_accepted"})
        monkeypatch.setattr(Reflective, "try_child", try_child_as_begun_before_refused_children_were_kept_out)
        monkeypatch.setattr(Reflective, "eligible", lambda self, versions: list(versions))

    monkeypatch.setattr(evals.stats, "paired_comparison", no_difference)
    as_the_earlier_loop()
    earlier_base = make_version(BASE_DSL, name="earlier")
    earlier = drive_through_crashes(evolution_start(workflow=earlier_base.workflow, golden_set=held_out_set,
                                                    mode="iterative", config=ITERATIVE), crashes=0)
    assert earlier.status == "completed" and earlier.best_version_id != earlier.base_version_id, earlier.error

    deaths = die_after(monkeypatch, "record_generation", when=lambda args: args[1] == 1)
    taken_base = make_version(BASE_DSL, name="taken over")
    taken = evolution_start(workflow=taken_base.workflow, golden_set=held_out_set, mode="iterative",
                            config=ITERATIVE)
    with pytest.raises(WorkerDied):
        run_until_settled(taken.durable_run_id, max_wait=300)
    assert deaths
    monkeypatch.undo()  # the present loop takes the run over
    monkeypatch.setattr(evals.stats, "paired_comparison", no_difference)
    past = timezone.now() - timedelta(hours=1)
    DurableRun.objects.filter(status="running").update(locked_until=past)
    assert tick.recover_expired_leases() >= 1
    durable = run_until_settled(taken.durable_run_id, max_wait=300)
    taken.refresh_from_db()
    assert durable.status == "completed" and taken.status == "completed", durable.error
    assert best_rows(taken, taken_base) == best_rows(earlier, earlier_base)
    assert WorkflowVersion.objects.get(pk=taken.best_version_id).dsl_hash == \
        WorkflowVersion.objects.get(pk=earlier.best_version_id).dsl_hash


@pytest.mark.parametrize("mode", ["gp", "reflective"])
def test_gp_and_reflective_runs_are_the_same_with_or_without_best_from_accepted(facts, held_out_set, make_version,
                                                                                 monkeypatch, mode):
    """Only the iterative mode refuses children: a GP or reflective run whose plan has no best_from_accepted makes
    the same rows, best and totals as one whose plan has it."""
    from durable import owners

    config = {"population": 3, "generations": 2, "seed": 1, "minibatch": 2}
    now_base = make_version(BASE_DSL, name="present")
    present = drive_through_crashes(evolution_start(workflow=now_base.workflow, golden_set=held_out_set,
                                                    mode=mode, config=config), crashes=0)
    owner = next(o for o in owners.registered() if o.model is EvolutionRun)
    plan = owner.plan
    monkeypatch.setattr(owner, "plan", lambda run: {k: v for k, v in plan(run).items() if k != "best_from_accepted"})
    old_base = make_version(BASE_DSL, name="without")
    without = drive_through_crashes(evolution_start(workflow=old_base.workflow, golden_set=held_out_set,
                                                    mode=mode, config=config), crashes=0)
    assert present.status == without.status == "completed", (present.error, without.error)
    assert best_rows(present, now_base) == best_rows(without, old_base)
    assert (present.rollouts, present.evaluations, present.stop_reason) == \
        (without.rollouts, without.evaluations, without.stop_reason)


def test_a_held_out_iterative_run_whose_budget_ended_before_any_validation_holds_its_base(
        held_out_set, support_base, evolve, settings):
    """The budget ends with the base's train eval run: no validation, the base is the best, chosen on train."""
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 1000}}
    settings.LLM_CACHE_ENABLED = False
    run = evolve(support_base.workflow, held_out_set, mode="iterative", config={**ITERATIVE, "usd_budget": 0.0001})
    assert run.status == "completed" and run.stop_reason.startswith("USD budget reached"), run.stop_reason
    assert run.best_version_id == run.base_version_id
    assert run.report["selected_on"] == "train" and run.report["best"]["validation"] is None
