"""Review findings for evolution runs: each test pins the behaviour a fix must bring and fails until
then (strict xfail, so the suite stays green and a fix that lands turns the xfail into an error that
asks for the marker to go).

Crashes are simulated in-process as in tests/workflows/test_review.py: a step function runs its real
body (its writes commit) and the worker then "dies" before the checkpoint (``WorkerDied``, a
BaseException); the lease is expired and the tick's recovery pass hands the run to a new turn."""

from datetime import timedelta

import pytest
from django.utils import timezone

from durable import tick
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from evolution import execution
from evolution.models import EvolutionRun, Individual
from evolution.services import evolution_start
from tests.workflows.conftest import graph, node
from workflows.models import WorkflowVersion

pytestmark = pytest.mark.django_db


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

    monkeypatch.setattr(execution, name, step)
    return deaths


def drive_through_crashes(run: EvolutionRun, *, crashes: int = 1) -> EvolutionRun:
    for _ in range(crashes + 1):
        try:
            run_until_settled(run.durable_run_id, max_wait=300)
        except WorkerDied:
            DurableRun.objects.filter(status="running").update(locked_until=timezone.now() - timedelta(hours=1))
            assert tick.recover_expired_leases() >= 1
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
