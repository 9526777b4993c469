from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durable import steps, store, turns
from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from durable.services import run_start

pytestmark = pytest.mark.django_db


def _checkpoints(run):
    return list(StepCheckpoint.objects.filter(run=run).order_by("seq").values_list("name", "status", "attempt"))


def test_replay_answers_completed_steps_from_checkpoints():
    from tests.durable import workflows

    workflows.CALLS.clear()
    run = run_start(workflow="tests.queued")
    run = run_until_settled(run.id)
    assert run.status == "completed"
    # each queued step ran once although the workflow was replayed three times
    assert workflows.CALLS == [("add", 1, 2), ("add", 3, 10)]


def test_inline_retry_with_backoff_then_success(tmp_path):
    counter = tmp_path / "count"
    run = run_until_settled(run_start(workflow="tests.retrying",
                                      input={"counter": str(counter), "failures": 2}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 3
    assert _checkpoints(run) == [("flaky", "completed", 3)]


def test_queued_retry_exhausted_fails_the_run_with_the_error(tmp_path):
    counter = tmp_path / "count"
    run = run_until_settled(run_start(workflow="tests.retrying", input={
        "counter": str(counter), "failures": 5, "retries": 2, "queue": "steps"}).id)
    assert run.status == "failed"
    error = decode(run.error)
    assert error["type"] == "StepFailed"
    assert "flaky failure 3" in error["message"]
    assert _checkpoints(run) == [("flaky", "failed", 3)]
    assert counter.read_text() == "3"


def test_fan_wait_all_returns_results_in_order():
    run = run_until_settled(run_start(workflow="tests.fan", input={"n": 25}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == sum(i * i for i in range(25))
    groups = set(StepCheckpoint.objects.filter(run=run).values_list("parallel_group", flat=True))
    assert groups == {0}


@pytest.mark.parametrize("mode", ["wait_all", "fail_fast"])
def test_fan_failure_fails_the_run(mode):
    run = run_until_settled(run_start(workflow="tests.fan_failing", input={"mode": mode}).id)
    assert run.status == "failed"
    assert "nope" in decode(run.error)["message"]


def test_fan_return_exceptions_puts_failures_in_place():
    run = run_until_settled(run_start(workflow="tests.fan_failing", input={"return_exceptions": True}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == [9, "StepFailed: nope"]


def test_a_return_value_that_is_not_json_fails_the_run_clearly():
    run = run_until_settled(run_start(workflow="tests.not_json", input={}).id)
    assert run.status == "failed"
    assert "not JSON-serialisable" in decode(run.error)["message"]


def test_join_barrier_wakes_the_run_only_when_the_fan_settles():
    run = run_start(workflow="tests.fan", input={"n": 4})
    turns.execute_turn(run.id)
    steps.execute_steps(run.id, [0, 1])
    assert DurableRun.objects.get(pk=run.id).wake_pending is False
    assert store.fan_has_pending(run.id, 0) is True
    steps.execute_steps(run.id, [2, 3])
    assert store.fan_has_pending(run.id, 0) is False
    assert DurableRun.objects.get(pk=run.id).wake_pending is True


def test_a_step_is_never_settled_twice():
    run = run_start(workflow="tests.queued")
    turns.execute_turn(run.id)
    first = steps.execute_steps(run.id, [0])
    second = steps.execute_steps(run.id, [0])  # a redelivered message
    assert first == {"claimed": 1, "settled": 1, "skipped": 0}
    assert second == {"claimed": 0, "settled": 0, "skipped": 0}
    # a late settle from a worker whose attempt was superseded changes nothing
    step = StepCheckpoint.objects.get(run_id=run.id, seq=0)
    assert store.steps_settle(run.id, [(step.id, 99, "completed", '"late"', "", None, None)]) == []
    assert decode(StepCheckpoint.objects.get(run_id=run.id, seq=0).output) == 3


def test_settle_does_not_rewrite_the_input():
    run = run_start(workflow="tests.queued")
    turns.execute_turn(run.id)
    before = StepCheckpoint.objects.get(run_id=run.id, seq=0).input
    with CaptureQueriesContext(connection) as captured:
        steps.execute_steps(run.id, [0])
    settles = [q["sql"] for q in captured if q["sql"].lstrip().startswith("UPDATE durable_stepcheckpoint AS cp")
               and "v.status" in q["sql"]]
    assert len(settles) == 1
    set_clause = settles[0].split("FROM (VALUES")[0]
    assert "input" not in set_clause  # the result lands without rewriting (or re-sending) the step's input
    assert StepCheckpoint.objects.get(run_id=run.id, seq=0).input == before


def test_non_deterministic_replay_fails_naming_both_steps(tmp_path):
    flag = tmp_path / "flag"
    run = run_start(workflow="tests.nondeterministic", input={"flag": str(flag)})
    assert turns.execute_turn(run.id).outcome == "suspended"  # wrote step "a", then slept
    flag.write_text("changed")
    run = run_until_settled(run.id)
    assert run.status == "failed"
    message = decode(run.error)["message"]
    assert "'a'" in message and "'b'" in message and "seq 0" in message


def test_recorded_values_and_attributes_replay_identically():
    run = run_until_settled(run_start(workflow="tests.values", input={"customer": "acme", "amount": 42}).id)
    assert run.status == "completed"
    first = decode(run.output)
    # replay the same run from its checkpoints: every recorded value comes back unchanged
    DurableRun.objects.filter(pk=run.id).update(status="suspended", wake_pending=True, output="")
    run = run_until_settled(run.id)
    assert decode(run.output) == first
    assert dict(run.attributes.values_list("key", "value_num")) == {"customer": None, "amount": 42.0}


def test_unknown_workflow_is_refused_at_start():
    from durable.errors import UnknownWorkflow

    with pytest.raises(UnknownWorkflow):
        run_start(workflow="nope.missing")


def test_start_is_idempotent_on_the_run_id():
    first = run_start(workflow="tests.sequence", input={"steps": 1}, run_id="order-1")
    second = run_start(workflow="tests.sequence", input={"steps": 99}, run_id="order-1")
    assert first.pk == second.pk == "order-1"
    assert decode(DurableRun.objects.get(pk="order-1").input) == {"steps": 1}


def test_a_step_put_off_waits_on_a_timer_without_spending_its_retries(tmp_path):
    counter = tmp_path / "count"
    # put off for a minute each time, so the first try's wait outlasts any machine's pace; the test then
    # brings each wait's end forward itself
    run = run_start(workflow="tests.throttled", input={"counter": str(counter), "times": 2, "after": 60})
    run_until_settled(run.id, max_wait=0.01)  # the first try is put off: the run waits, nothing failed
    step = StepCheckpoint.objects.get(run=run, name="call")
    assert step.status == "pending" and step.wake_at is not None
    assert decode(step.error)["message"] == "busy: try 1"
    for _ in range(3):
        due = timezone.now() - timedelta(seconds=1)
        StepCheckpoint.objects.filter(pk=step.pk, status="pending").update(wake_at=due)
        run = run_until_settled(run.id, max_wait=5)
        if run.status == "completed":
            break
    assert run.status == "completed", run.error
    # retries=0, yet two deferrals did not fail it; the step saw how often it was put off
    assert decode(run.output) == {"runs": 3, "deferrals": 2}


def test_a_step_put_off_for_too_long_fails_with_its_last_reason(tmp_path, settings):
    settings.DURABLE_STEP_MAX_DEFER_SECONDS = 1.0
    counter = tmp_path / "count"
    run = run_until_settled(run_start(workflow="tests.throttled", input={
        "counter": str(counter), "times": 1000, "after": 0.3}).id, max_wait=5)
    assert run.status == "failed"
    message = decode(run.error)["message"]
    assert "DURABLE_STEP_MAX_DEFER_SECONDS" in message and "busy: try" in message
