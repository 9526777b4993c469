"""Crash windows and races of the engine: a process dying between two commits, a second worker
running the same code, an operator acting while a turn is in flight. Each test names the
interleaving it pins down."""

import contextlib
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from durable import context, errors, steps, store, tick, turns
from durable.codec import decode
from durable.errors import TurnInterrupted
from durable.inprocess import run_until_settled
from durable.models import DurableRun, SignalWaiter, StepCheckpoint
from durable.services import run_cancel, run_retry, run_start, signal_send
from tests.durable.concurrency import in_thread, statement_fails_once, time_out_silent_steps_while, wait_until


def _status(run_id):
    return DurableRun.objects.get(pk=run_id).status


# ------------------------------------------------------------------ 1. slow queued steps in one chunk


@pytest.mark.django_db(transaction=True)
def test_queued_steps_waiting_in_a_chunk_do_not_time_out_and_finished_ones_settle_early(tmp_path):
    evidence = tmp_path / "runs.log"
    run = run_start(workflow="tests.slow_chunk", input={"path": str(evidence), "n": 3, "seconds": 0.5,
                                                        "timeout": 1.0})
    turns.execute_turn(run.id)
    worker, outcome = in_thread(steps.execute_steps, run.id, [0, 1, 2])
    seen = {"settled_early": False}

    def first_settled_before_the_last():
        states = dict(StepCheckpoint.objects.filter(run_id=run.id).values_list("seq", "status"))
        seen["settled_early"] |= states[0] == "completed" and states[2] != "completed"

    timed_out = time_out_silent_steps_while(worker, observe=first_settled_before_the_last)
    assert "error" not in outcome, outcome
    assert timed_out == 0
    assert seen["settled_early"], "the first step's result was held until the whole chunk ended"
    assert evidence.read_text().split().count("start:2") == 1
    assert run_until_settled(run.id).status == "completed"


# ------------------------------------------------------------------ 2. retrying a parent whose child ended


@pytest.mark.django_db
def test_retrying_a_parent_whose_child_failed_resumes_the_child(tmp_path):
    run = run_until_settled(run_start(workflow="tests.parent_of_flaky", input={"counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 2


@pytest.mark.django_db
def test_retrying_a_cancelled_parent_resumes_its_cancelled_child():
    run = run_until_settled(run_start(workflow="tests.parent_of_waiting", input={}).id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert run_cancel(run_id=run.id)
    assert _status(child.id) == "cancelled"
    assert run_retry(run_id=run.id)
    assert run_until_settled(run.id).status == "suspended"
    assert signal_send(run_id=child.id, name="approve", payload="yes") == "delivered"
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output)["payload"] == "yes"


@pytest.mark.django_db
def test_a_parent_replaying_onto_an_ended_child_takes_its_outcome_at_once():
    run = run_until_settled(run_start(workflow="tests.child_then_check", input={"x": 1, "fail": True}).id)
    assert run.status == "failed"
    # the child completed; the parent failed after it. A plain retry keeps the child's checkpoint...
    StepCheckpoint.objects.filter(run_id=run.id, kind="child").delete()  # ...unless it was lost: then it asks again
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "failed"  # the check still fails, but the parent was never left waiting for the child
    assert StepCheckpoint.objects.get(run_id=run.id, seq=0).status == "completed"


@pytest.mark.django_db
def test_retry_with_new_input_starts_fresh_children():
    run = run_until_settled(run_start(workflow="tests.child_then_check", input={"x": 1, "fail": True}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id, input={"x": 5}, new_input=True)
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == {"child": 10}
    assert DurableRun.objects.filter(parent_id=run.id).count() == 2  # the old child is kept, a new one ran


# ------------------------------------------------------------------ 3. a death between a settle and its wake


class ProcessDied(BaseException):
    pass


@pytest.mark.django_db(transaction=True)
def test_a_worker_dying_right_after_a_settle_commits_loses_no_wake():
    run = run_start(workflow="tests.queued")
    turns.execute_turn(run.id)
    seen = {"settled": False}

    def die_after_the_settle_commits(execute, sql, params, many, context):
        if seen["settled"] and not connection.in_atomic_block:
            raise ProcessDied("the worker died right after its settle committed")
        if "output" in sql and "UPDATE" in sql and "status" in sql:
            seen["settled"] = True
        return execute(sql, params, many, context)

    with connection.execute_wrapper(die_after_the_settle_commits), contextlib.suppress(ProcessDied):
        steps.execute_steps(run.id, [0])
    assert seen["settled"]
    assert StepCheckpoint.objects.get(run_id=run.id, seq=0).status == "completed"
    # the rows alone must say the run wants a turn, so the tick's lost-wake pass sends it
    assert DurableRun.objects.get(pk=run.id).wake_pending is True
    assert run_until_settled(run.id).status == "completed"


# ------------------------------------------------------------------ 4. fail_fast replays the failure it raised


@pytest.mark.django_db
def test_fail_fast_replays_the_failure_it_first_raised():
    run = run_start(workflow="tests.fail_fast_handler", input={})
    turns.execute_turn(run.id)  # starts the fan
    steps.execute_steps(run.id, [1])  # b fails first
    turns.execute_turn(run.id)  # fail_fast raises b; the handler runs, then sleeps
    steps.execute_steps(run.id, [0])  # a fails later
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == {"handled": "b", "value": 1}


# ------------------------------------------------------------------ 5. a cancel landing during a turn


@pytest.mark.django_db
def test_a_turn_still_running_when_its_run_is_cancelled_starts_no_child():
    run = run_start(workflow="tests.cancel_then_child", input={})
    turns.execute_turn(run.id)
    assert _status(run.id) == "cancelled"
    assert not DurableRun.objects.filter(parent_id=run.id).exists()


# ------------------------------------------------------------------ 6. a slow worker of an earlier attempt


@pytest.mark.django_db(transaction=True)
def test_a_slow_worker_of_a_retried_run_cannot_settle_into_the_new_attempt(tmp_path):
    old_flag, new_flag = tmp_path / "old", tmp_path / "new"
    run = run_start(workflow="tests.gated_queued", input={"a": 1, "flag": str(old_flag)})
    turns.execute_turn(run.id)
    slow, slow_outcome = in_thread(steps.execute_steps, run.id, [0])
    wait_until(lambda: StepCheckpoint.objects.filter(run_id=run.id, status="running").exists())
    assert run_cancel(run_id=run.id)
    assert run_retry(run_id=run.id, input={"a": 100, "flag": str(new_flag)}, new_input=True)
    turns.execute_turn(run.id)
    fresh, fresh_outcome = in_thread(steps.execute_steps, run.id, [0])
    wait_until(lambda: StepCheckpoint.objects.filter(run_id=run.id, status="running").exists())
    old_flag.touch()  # the slow worker of the first attempt finishes first...
    slow.join(20)
    assert not slow.is_alive(), "the slow worker never finished"
    new_flag.touch()
    fresh.join(20)
    assert not fresh.is_alive(), "the fresh worker never finished"
    assert "error" not in slow_outcome and "error" not in fresh_outcome, (slow_outcome, fresh_outcome)
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 100  # ...and its result never lands in the new attempt


@pytest.mark.django_db(transaction=True)
def test_a_stale_turn_of_a_retried_run_cannot_checkpoint_into_the_new_history(tmp_path):
    old_flag, new_flag = tmp_path / "old", tmp_path / "new"
    run = run_start(workflow="tests.gated_inline", input={"a": 1, "flag": str(old_flag)})
    stale, outcome = in_thread(turns.execute_turn, run.id)
    wait_until(lambda: _status(run.id) == "running")
    # the stalled turn loses its lease; an operator cancels and retries with new input
    assert run_cancel(run_id=run.id)
    assert run_retry(run_id=run.id, input={"a": 100, "flag": str(new_flag)}, new_input=True)
    old_flag.touch()
    stale.join(20)
    assert not stale.is_alive(), "the stale turn never finished"
    assert "error" not in outcome, outcome
    assert outcome["value"].outcome == "lease_lost"
    new_flag.touch()
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 100


# ------------------------------------------------------------------ 7. queued steps of ended runs


@pytest.mark.django_db
def test_queued_steps_of_a_cancelled_run_are_never_dispatched_again():
    run = run_start(workflow="tests.fan", input={"n": 5})
    turns.execute_turn(run.id)
    assert run_cancel(run_id=run.id)
    StepCheckpoint.objects.filter(run_id=run.id).update(wake_at=timezone.now() - timedelta(seconds=1))
    assert tick.dispatch_due_steps() == 0
    assert set(StepCheckpoint.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"cancelled"}


@pytest.mark.django_db
def test_queued_steps_left_open_by_a_failed_run_are_cancelled():
    run = run_start(workflow="tests.fail_fast_handler", input={})
    turns.execute_turn(run.id)
    StepCheckpoint.objects.filter(run_id=run.id, seq=1).update(status="failed", error='{"message": "b"}')
    turns.execute_turn(run.id)  # fail_fast raises b while a is still queued; the handler sleeps
    time.sleep(0.02)
    assert turns.execute_turn(run.id).outcome == "completed"
    assert StepCheckpoint.objects.get(run_id=run.id, seq=0).status == "cancelled"


# ------------------------------------------------------------------ 8. engine writes that fail


@pytest.fixture
def explode_once():
    """A checkpoint named "explode" fails to insert once, as a dropped connection or a failover would."""
    with statement_fails_once("test_explode", on="INSERT", when="NEW.name = 'explode'", errcode="57P01",
                              message="simulated failover") as fired:
        yield fired


@pytest.mark.django_db(transaction=True)
def test_a_failed_engine_write_interrupts_the_turn_for_a_retry_and_workflow_code_cannot_swallow_it(explode_once):
    run = run_start(workflow="tests.swallows_errors", input={})
    with pytest.raises(TurnInterrupted):
        turns.execute_turn(run.id)
    assert explode_once()
    row = DurableRun.objects.get(pk=run.id)  # Django's connection is usable again
    assert row.status == "suspended" and row.recovery_attempts == 1 and row.wake_at is not None
    DurableRun.objects.filter(pk=run.id).update(wake_at=timezone.now())
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output) == "done"


# ------------------------------------------------------------------ 9. leases


@pytest.mark.django_db
def test_a_turn_that_makes_progress_resets_the_recovery_count():
    run = run_start(workflow="tests.signal", input={})
    DurableRun.objects.filter(pk=run.id).update(recovery_attempts=3)
    turns.execute_turn(run.id)
    assert DurableRun.objects.get(pk=run.id).recovery_attempts == 0


@pytest.mark.django_db
def test_a_turn_whose_lease_was_taken_can_neither_wait_nor_start_children():
    run = run_start(workflow="tests.parent", input={})
    cursor = store.raw_cursor()
    assert store.run_claim(cursor, run.id, "stale-turn", 30.0) is not None
    DurableRun.objects.filter(pk=run.id).update(locked_by="new-turn")  # recovered and re-claimed elsewhere
    ctx = context.Context(run_id=run.id, workflow="tests.parent", namespace="default", priority=0, checkpoints={},
                          tags=[], token="stale-turn")
    with pytest.raises(errors.LeaseLost):
        ctx.child("tests.child", {"x": 1})
    with pytest.raises(errors.LeaseLost):
        context.Context(run_id=run.id, workflow="tests.parent", namespace="default", priority=0, checkpoints={},
                        tags=[], token="stale-turn").sleep(60)
    assert not StepCheckpoint.objects.filter(run_id=run.id).exists()
    assert not DurableRun.objects.filter(parent_id=run.id).exists()


@pytest.mark.django_db
def test_a_late_step_of_an_abandoned_history_is_dropped_by_the_next_replay():
    run = run_until_settled(run_start(workflow="tests.child_then_check", input={"x": 1, "fail": True}).id)
    assert run.status == "failed"
    stale_fence = DurableRun.objects.get(pk=run.id).fence
    assert run_retry(run_id=run.id)
    # a turn of the abandoned history, still running, records its next step after the retry
    ctx = context.Context(run_id=run.id, workflow="tests.child_then_check", namespace="default", priority=0,
                          checkpoints={}, tags=[], token="stale-turn", fence=stale_fence)
    ctx._seq = 5
    ctx.step("late", lambda: "stale")
    assert StepCheckpoint.objects.filter(run_id=run.id, name="late").exists()
    run = run_until_settled(run.id)
    assert run.status == "failed"  # the check still fails; the late step was never replayed into it
    assert not StepCheckpoint.objects.filter(run_id=run.id, name="late").exists()


# ------------------------------------------------------------------ misuse, waits, continue-as-new


@pytest.mark.django_db
def test_a_wait_inside_the_workflows_own_transaction_fails_the_run_clearly():
    run = run_until_settled(run_start(workflow="tests.wait_in_atomic", input={}).id, max_wait=2)
    assert run.status == "failed"
    assert "transaction.atomic()" in decode(run.error)["message"]


@pytest.mark.django_db
def test_a_ctx_call_in_a_finally_around_a_wait_fails_the_run_clearly():
    run = run_until_settled(run_start(workflow="tests.ctx_in_finally", input={}).id)
    assert run.status == "failed"
    assert "after the turn stopped" in decode(run.error)["message"]
    assert not SignalWaiter.objects.filter(run_id=run.id).exists()


@pytest.mark.django_db
def test_wait_checkpoints_record_when_they_started():
    run = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    wait = StepCheckpoint.objects.get(run_id=run.id, kind="signal")
    assert wait.started_at is not None


@pytest.mark.django_db
def test_continue_as_new_keeps_one_history_and_gives_children_new_ids():
    run = run_until_settled(run_start(workflow="tests.loop", input={"n": 0, "until": 3}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == {"n": 3, "child": {"child": 6}}
    assert run.epoch == 3
    assert StepCheckpoint.objects.filter(run_id=run.id).count() == 2  # only the last history's step and child
    children = sorted(DurableRun.objects.filter(parent_id=run.id).values_list("id", flat=True))
    assert children == [f"{run.id}/1", f"{run.id}/1.1", f"{run.id}/2.1", f"{run.id}/3.1"]


@pytest.fixture
def heartbeat_write_fails_once():
    """The first heartbeat write fails, as under a lock timeout or a failover."""
    with statement_fails_once("test_heartbeat", on="UPDATE", when="NEW.heartbeat_progress <> OLD.heartbeat_progress",
                              errcode="55P03", message="simulated lock timeout") as fired:
        yield fired


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_cannot_be_written_does_not_fail_the_step(heartbeat_write_fails_once):
    run = run_until_settled(run_start(workflow="tests.heartbeat", input={"seconds": 0.5, "timeout": 3}).id)
    assert run.status == "completed", run.error
    step = StepCheckpoint.objects.get(run_id=run.id, seq=0)
    assert step.attempt == 1 and step.status == "completed"
    assert heartbeat_write_fails_once(), "no heartbeat write was ever refused"


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_cannot_be_written_inside_the_steps_own_transaction_leaves_it_usable(
        heartbeat_write_fails_once):
    run = run_until_settled(run_start(workflow="tests.heartbeat_in_transaction", input={}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 2  # the step's queries after the refused heartbeat ran in its transaction
    assert heartbeat_write_fails_once(), "no heartbeat write was ever refused"


@pytest.mark.django_db
def test_children_left_active_by_a_parent_declared_dead_are_cancelled():
    """The close policy applies when recovery declares a run dead, as when a turn ends it: its waiting
    child is not left an orphan."""
    run = run_until_settled(run_start(workflow="tests.parent_of_waiting", input={}).id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert child.status == "suspended"
    # the parent's worker stalls past its lease once too often: the recovery pass declares it dead
    cursor = store.raw_cursor()
    assert store.run_claim(cursor, run.id, "stalled-turn", 30.0) is not None
    DurableRun.objects.filter(pk=run.id).update(locked_until=timezone.now() - timedelta(seconds=1),
                                                recovery_attempts=99)
    assert tick.recover_expired_leases() == 1
    assert _status(run.id) == "dead"
    assert _status(child.id) == "cancelled"


@pytest.mark.django_db
def test_the_orphan_sweep_cancels_active_children_of_ended_parents():
    from durable import retention

    run = run_until_settled(run_start(workflow="tests.parent_of_waiting", input={}).id)
    child = DurableRun.objects.get(parent_id=run.id)
    # a crash right after the parent ended, before its children were cancelled
    DurableRun.objects.filter(pk=run.id).update(status="failed", locked_by="", locked_until=None)
    assert retention.retention_pass()["orphans_cancelled"] == 1
    assert _status(child.id) == "cancelled"
    assert retention.retention_pass()["orphans_cancelled"] == 0
