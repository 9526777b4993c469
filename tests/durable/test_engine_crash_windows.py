"""Crash windows and races of the engine: a process dying between two commits, a second worker
running the same code, an operator acting while a turn is in flight. Each test names the
interleaving it pins down."""

import contextlib
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import tests.durable.gate_workflows as gates
from durable import context, errors, selectors, services, steps, store, tick, turns
from durable.codec import decode
from durable.errors import TurnInterrupted
from durable.inprocess import run_until_settled
from durable.models import BufferedEvent, BufferedSignal, DurableRun, RunAttribute, SignalWaiter, StepCheckpoint
from durable.services import run_cancel, run_retry, run_start, signal_send
from tests.durable.concurrency import in_thread, statement_fails_once, time_out_silent_steps_while, wait_until
from workspaces.models import Workspace


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


@pytest.mark.django_db(transaction=True)
def test_a_healthy_step_started_late_in_its_chunk_is_not_timed_out(tmp_path):
    """A step that starts ~0.7 s into its chunk still has its whole 3 s timeout: it runs once and is
    not timed out. Earlier: every step's silence clock was armed at claim and re-armed only at
    flushes between steps, skipped when the previous step took under a second, so the second step was
    timed out at 2.3 s of the 2.6 s it needs, ran twice, and its first result was thrown away."""
    evidence = tmp_path / "runs.log"
    run = run_start(workflow="tests.fan_two_slow", input={"path": str(evidence), "first": 0.7, "second": 2.6,
                                                          "timeout": 3.0})
    turns.execute_turn(run.id)
    worker, outcome = in_thread(steps.execute_steps, run.id, [0, 1])
    timed_out = time_out_silent_steps_while(worker)
    assert "error" not in outcome, outcome
    assert timed_out == 0, "a step was timed out while it ran, within its timeout, on a live worker"
    assert run_until_settled(run.id).status == "completed"
    assert evidence.read_text().split().count("start:second") == 1


@pytest.mark.django_db(transaction=True)
def test_a_finished_result_is_not_lost_while_the_next_step_of_the_chunk_heartbeats(tmp_path):
    """A step that finished at once, while the next step of its chunk heartbeats for longer than the
    timeout, is neither timed out nor run again. Earlier: its result waited in memory for the next
    flush (only between steps), nothing re-armed it, the tick timed it out, the settle at the end was
    refused and the finished step ran again."""
    evidence = tmp_path / "runs.log"
    run = run_start(workflow="tests.fast_then_beating", input={"path": str(evidence), "seconds": 4.0,
                                                               "timeout": 2.0})
    turns.execute_turn(run.id)
    worker, outcome = in_thread(steps.execute_steps, run.id, [0, 1])
    timed_out = time_out_silent_steps_while(worker)
    assert "error" not in outcome, outcome
    assert run_until_settled(run.id).status == "completed"
    assert (timed_out, evidence.read_text().split().count("start:fast")) == (0, 1)


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


@pytest.mark.django_db
def test_a_plain_retry_does_not_resurrect_the_ended_children_of_a_completed_child(tmp_path):
    """A completed child handled a failed grandchild and had its other grandchild cancelled by the
    close policy. Retrying the (later failed) parent must not run those grandchildren again:
    nobody waits for them, the completed child never replays."""
    evidence = tmp_path / "grandchild.log"
    run = run_until_settled(run_start(workflow="tests.grandparent",
                                      input={"path": str(evidence), "counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert evidence.read_text().count("ran") == 1
    grandchildren = DurableRun.objects.filter(parent__parent_id=run.id)
    before = dict(grandchildren.values_list("workflow", "status"))
    assert before == {"tests.always_fails": "failed", "tests.waits_forever": "cancelled"}
    assert run_retry(run_id=run.id)
    after = dict(grandchildren.values_list("workflow", "status"))
    assert after == before, "the retry re-opened runs that no parent waits for"
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert evidence.read_text().count("ran") == 1  # the failed grandchild's step ran again


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


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_a_step_settle_does_not_deadlock():
    """A cancel landing while a settle holds the step rows, about to wake the run, completes and so
    does the settle. Earlier: the settle locked the step rows, then the run row (its wake), while a
    cancel locked the run row, then the step rows (_end_open_work); together they deadlocked and
    Postgres aborted one."""
    run = run_start(workflow="tests.fan", input={"n": 2})
    turns.execute_turn(run.id)
    settle_waiting, cancel_locked_run = threading.Event(), threading.Event()

    def pause_before_the_wake(execute, sql, params, many, context):
        if "SET wake_pending = true" in sql and "AS busy" in sql:  # store.WAKE_SQL, inside the settle
            settle_waiting.set()
            cancel_locked_run.wait(3)
        return execute(sql, params, many, context)

    worker, outcome = in_thread(steps.execute_steps, run.id, [0, 1], wrapper=pause_before_the_wake)
    assert settle_waiting.wait(10)

    def mark_run_locked(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "SET status = 'cancelled', error" in sql:  # store.CANCEL_SQL: the run row is locked now
            cancel_locked_run.set()
        return result

    error = None
    try:
        with connection.execute_wrapper(mark_run_locked):
            assert run_cancel(run_id=run.id)
    except Exception as exc:
        error = exc
    worker.join(20)
    assert not worker.is_alive(), "the settle never finished"
    failures = [repr(e) for e in (error, outcome.get("error")) if e is not None]
    assert not failures, failures
    assert DurableRun.objects.get(pk=run.id).status == "cancelled"


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


@pytest.mark.django_db(transaction=True)
def test_a_value_postgres_cannot_store_fails_the_call_instead_of_looping_the_run_to_dead():
    """A NUL byte in an attribute value is the workflow's input, not an engine outage: the call
    raises ValueError, which the workflow catches. Earlier it became EngineWriteFailed, which the
    workflow cannot catch: each turn was interrupted and retried, and after
    DURABLE_MAX_RECOVERY_ATTEMPTS the run was 'dead' ("engine writes kept failing")."""
    run = run_start(workflow="tests.nul_attribute", input={})
    interrupted = 0
    for _ in range(10):
        try:
            turns.execute_turn(run.id)
        except TurnInterrupted:
            interrupted += 1
            DurableRun.objects.filter(pk=run.id, status="suspended").update(wake_at=timezone.now())
        if DurableRun.objects.get(pk=run.id).status in DurableRun.Status.TERMINAL:
            break
    run = DurableRun.objects.get(pk=run.id)
    assert (run.status, interrupted) == ("completed", 0), (run.status, interrupted, decode(run.error))
    assert decode(run.output) == "rejected"


@pytest.mark.django_db(transaction=True)
def test_a_refused_value_in_a_transaction_does_not_undo_the_transactions_before_it():
    """A ctx.transaction whose checkpoint Postgres refuses raises ValueError, which the workflow handles;
    the transactions the turn ran before it (open in the same commit) keep their writes: the run then
    completes and no replay does them again."""
    from workspaces.models import Workspace

    run = run_until_settled(run_start(workflow="tests.transaction_then_refused_one",
                                      input={"name": "kept by the first transaction"}).id)
    assert run.status == "completed", decode(run.error)
    assert decode(run.output) == {"kept": "kept by the first transaction", "refused": True}
    assert Workspace.objects.filter(name="kept by the first transaction").count() == 1


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


# ------------------------------------------------------------------ 10. stale turns behind the history fence
# A stale turn of a cancelled or retried run must not write into the run's new history, whatever it records
# after its stall. Each test runs a real turn in another thread (its own connection) that stalls inside a step
# while the run is cancelled / retried, then lets it go on. The keeper renews leases every lease_seconds / 3,
# so until its next renewal the stale turn's `ctx` calls are not stopped by the keeper: only the engine's
# write fencing stops them (earlier, 120e721, an inline step's checkpoint was stamped with the history fence
# instead of being fenced by the turn's lease, and these writes landed). The lease is made long here
# (`long_lease`) so the keeper's timing cannot make the tests flaky; the window exists with any lease length.


@pytest.fixture
def long_lease(settings):
    """A lease long enough that the keeper's renewals cannot stop a stale turn before the fence does."""
    settings.DURABLE_LEASE_SECONDS = 600.0


def stalled_turn(run_id: str, key: str):
    """A turn of the run, in another thread, stalled in its gate step; returns (thread, outcome, release)."""
    entered, release = gates.arm(key)
    worker, outcome = in_thread(turns.execute_turn, run_id)
    assert entered.wait(10), "the turn never reached its gate"
    return worker, outcome, release


def finish(worker, outcome, release):
    release.set()
    worker.join(20)
    assert not worker.is_alive()
    assert "error" not in outcome, outcome.get("error")
    return outcome["value"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_a_stale_turn_cannot_take_a_signal_buffered_for_the_retried_history():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.signal_after_gate", input={"gate": key})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id)
    # the retried run is not waiting yet: the signal is buffered for it
    assert services.signal_send(run_id=run.id, name="go", payload="hello") == "buffered"
    finish(worker, outcome, release)  # the stale turn goes on: its record of "gate" is unfenced...
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed", (
        f"run is {run.status}; buffered signals left: {BufferedSignal.objects.filter(run_id=run.id).count()} "
        "(the stale turn consumed the signal and recorded it under the old fence; the replay dropped that record)")
    assert decode(run.output) == "hello"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_a_cancelled_runs_stale_turn_cannot_commit_a_ctx_transaction():
    key, name = uuid.uuid4().hex, "tx-" + uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.transaction_gate", input={"gate": key, "name": name})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert finish(worker, outcome, release).outcome == "lease_lost"
    # run_cancel: "a turn still running there has its writes refused, so it can neither finish, checkpoint..."
    assert Workspace.objects.filter(name=name).count() == 0, "the cancelled run's transaction committed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_ctx_transaction_writes_exactly_once_across_a_retry_racing_a_stale_turn():
    key, name = uuid.uuid4().hex, "tx-" + uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.transaction_gate", input={"gate": key, "name": name})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id)
    finish(worker, outcome, release)
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed"
    assert Workspace.objects.filter(name=name).count() == 1, (
        "ctx.transaction's writes committed twice: the stale turn's commit (old fence) and the new history's")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_a_stale_turn_of_an_abandoned_history_cannot_set_the_new_historys_attributes():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.attributes_by_input", input={"phase": "old", "gate": key})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id, input={"phase": "new", "gate": ""}, new_input=True)
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed" and decode(run.output) == "new"
    assert RunAttribute.objects.get(run_id=run.id, key="phase").value == "new"
    finish(worker, outcome, release)  # the old history's turn goes on after the new history completed
    assert RunAttribute.objects.get(run_id=run.id, key="phase").value == "new", (
        "the abandoned history overwrote the completed new history's search attribute")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_the_timeline_of_a_completed_run_shows_only_its_own_history():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.attributes_by_input", input={"phase": "old", "gate": key})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id, input={"phase": "new", "gate": ""}, new_input=True)
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed"
    finish(worker, outcome, release)
    names = [entry.name for entry in selectors.run_timeline(run.id)]
    assert names == ["set_attributes"], f"timeline of the completed run: {names}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_a_cancelled_runs_stale_turn_cannot_take_a_buffered_event_from_the_namespace():
    key, event = uuid.uuid4().hex, "ev-" + uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.event_after_gate", input={"gate": key, "event": event})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.event_publish(name=event, payload={"n": 1}) == 0  # nobody waits: buffered
    assert finish(worker, outcome, release).outcome == "lease_lost"
    waiter = services.run_start(workflow="tests.gate.event_waiter", input={"event": event})
    waiter = run_until_settled(waiter.id, max_wait=2)
    assert waiter.status == "completed", (
        f"the live waiter is {waiter.status}; buffered events left: "
        f"{BufferedEvent.objects.filter(name=event).count()} (the cancelled run's stale turn took it)")
    assert decode(waiter.output) == {"n": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("long_lease")
def test_a_late_write_landing_inside_a_plain_retry_is_not_adopted_by_the_new_history():
    """run_retry prunes (DELETE) and then re-stamps what is left (UPDATE ... SET fence) in two statements:
    a stale turn's write between them is refused, and the new history replays only its own checkpoints.
    Earlier such an insert committed, was re-stamped with the new fence and replayed into the new
    history."""
    from django.db import connection

    from durable.context import Context, _Checkpoint
    from durable.store import REPLAY_SQL, raw_cursor

    key = uuid.uuid4().hex
    run = services.run_start(workflow="tests.gate.fail_fast_fan", input={"key": key})
    assert turns.execute_turn(run.id).outcome == "suspended"  # the fan is started
    steps.execute_steps(run.id, [0])  # item "a" fails (its first call); item "b" has not run yet
    cursor = raw_cursor()
    cursor.execute(REPLAY_SQL, (run.id,))
    snapshot = [_Checkpoint(row) for row in cursor.fetchall()]  # what a turn claimed now replays from
    assert [(cp.seq, cp.status) for cp in snapshot] == [(0, "failed"), (1, "pending")]

    def stale_turn_decides_fail_fast():
        # the turn that replayed that snapshot, stalled before recording its fail_fast choice (the run
        # was cancelled meanwhile), records it now
        ctx = Context(run_id=run.id, workflow="tests.gate.fail_fast_fan", namespace="default", priority=0,
                      checkpoints={cp.seq: cp for cp in snapshot}, tags=[], token="stale-turn", fence=0)
        ctx.all(gates.fan_items({"key": key}), mode="fail_fast")

    assert services.run_cancel(run_id=run.id)
    state = {}

    def late_write_between_prune_and_restamp(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "DELETE FROM durable_stepcheckpoint AS cp USING fan" in sql and "stale" not in state:
            worker, outcome = in_thread(stale_turn_decides_fail_fast)  # right after the prune
            worker.join(20)
            assert not worker.is_alive(), "the stale turn never finished"
            state["stale"] = outcome
        return result

    with connection.execute_wrapper(late_write_between_prune_and_restamp):
        assert services.run_retry(run_id=run.id)
    assert "stale" in state, "the retry never pruned the fan"
    assert isinstance(state["stale"].get("error"), errors.LeaseLost), state["stale"]  # refused, not adopted
    run = run_until_settled(run.id, max_wait=5)
    assert run.status == "completed", decode(run.error).get("message")
    assert decode(run.output) == [key, 2]


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


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_never_cancels_the_new_historys_children():
    """A worker that turns the new history right when the old turn applies the close policy (the
    old history's active children are cancelled) never has the new history's child cancelled: the
    policy applies inside the continue-as-new transaction, before the new history can start. Earlier
    it applied after, and could cancel the new history's child."""
    run = run_start(workflow="tests.loop_with_child", input={"n": 0})
    state = {"done": False}

    def new_history_starts_first(execute, sql, params, many, context):
        if not state["done"] and "WITH RECURSIVE tree" in sql:
            state["done"] = True  # the old turn's close policy is about to look for children
            worker, outcome = in_thread(turns.execute_turn, run.id)
            worker.join(20)
            assert not worker.is_alive(), "the new history's turn never finished"
            state["new_turn"] = outcome
        return execute(sql, params, many, context)

    with connection.execute_wrapper(new_history_starts_first):
        assert turns.execute_turn(run.id).outcome == "continued"
    assert "error" not in state["new_turn"], state["new_turn"]
    assert state["new_turn"]["value"].outcome in ("not_claimed", "suspended")
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]
    assert decode(run.output) == 1
    assert DurableRun.objects.get(pk=f"{run.id}/1.0").status == "completed"


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

