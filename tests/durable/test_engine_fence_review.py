"""Regression tests from an adversarial review of the history fence: a stale turn of a cancelled or
retried run must not write into the run's new history, whatever it records after its stall.

Each test runs a real turn in another thread (its own connection) that stalls inside a step while
the run is cancelled / retried, then lets it go on. The keeper renews leases every lease_seconds / 3,
so until its next renewal the stale turn's `ctx` calls are not stopped by the keeper: only the
engine's write fencing stops them (earlier, 120e721, an inline step's checkpoint was stamped with the
history fence instead of being fenced by the turn's lease, and these writes landed). The lease is
made long here so the keeper's timing cannot make the tests flaky; the window exists with any lease
length."""

import uuid

import pytest

import tests.durable.fence_review_workflows as fr
from durable import errors, selectors, services, steps, turns
from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import BufferedEvent, BufferedSignal, RunAttribute
from tests.durable.concurrency import in_thread
from workspaces.models import Workspace


@pytest.fixture(autouse=True)
def _long_lease(settings):
    settings.DURABLE_LEASE_SECONDS = 600.0


def stalled_turn(run_id: str, key: str):
    """A turn of the run, in another thread, stalled in its gate step; returns (thread, outcome, release)."""
    entered, release = fr.arm(key)
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
def test_a_stale_turn_cannot_take_a_signal_buffered_for_the_retried_history():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.signal_after_gate", input={"gate": key})
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
def test_a_cancelled_runs_stale_turn_cannot_commit_a_ctx_transaction():
    key, name = uuid.uuid4().hex, "tx-" + uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.transaction_gate", input={"gate": key, "name": name})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert finish(worker, outcome, release).outcome == "lease_lost"
    # run_cancel: "a turn still running there has its writes refused, so it can neither finish, checkpoint..."
    assert Workspace.objects.filter(name=name).count() == 0, "the cancelled run's transaction committed"


@pytest.mark.django_db(transaction=True)
def test_ctx_transaction_writes_exactly_once_across_a_retry_racing_a_stale_turn():
    key, name = uuid.uuid4().hex, "tx-" + uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.transaction_gate", input={"gate": key, "name": name})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id)
    finish(worker, outcome, release)
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed"
    assert Workspace.objects.filter(name=name).count() == 1, (
        "ctx.transaction's writes committed twice: the stale turn's commit (old fence) and the new history's")


@pytest.mark.django_db(transaction=True)
def test_a_stale_turn_of_an_abandoned_history_cannot_set_the_new_historys_attributes():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.attributes_by_input", input={"phase": "old", "gate": key})
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
def test_the_timeline_of_a_completed_run_shows_only_its_own_history():
    key = uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.attributes_by_input", input={"phase": "old", "gate": key})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.run_retry(run_id=run.id, input={"phase": "new", "gate": ""}, new_input=True)
    run = run_until_settled(run.id, max_wait=2)
    assert run.status == "completed"
    finish(worker, outcome, release)
    names = [entry.name for entry in selectors.run_timeline(run.id)]
    assert names == ["set_attributes"], f"timeline of the completed run: {names}"


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_runs_stale_turn_cannot_take_a_buffered_event_from_the_namespace():
    key, event = uuid.uuid4().hex, "ev-" + uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.event_after_gate", input={"gate": key, "event": event})
    worker, outcome, release = stalled_turn(run.id, key)
    assert services.run_cancel(run_id=run.id)
    assert services.event_publish(name=event, payload={"n": 1}) == 0  # nobody waits: buffered
    assert finish(worker, outcome, release).outcome == "lease_lost"
    waiter = services.run_start(workflow="fence_review.event_waiter", input={"event": event})
    waiter = run_until_settled(waiter.id, max_wait=2)
    assert waiter.status == "completed", (
        f"the live waiter is {waiter.status}; buffered events left: "
        f"{BufferedEvent.objects.filter(name=event).count()} (the cancelled run's stale turn took it)")
    assert decode(waiter.output) == {"n": 1}


@pytest.mark.django_db(transaction=True)
def test_a_late_write_landing_inside_a_plain_retry_is_not_adopted_by_the_new_history():
    """run_retry prunes (DELETE) and then re-stamps what is left (UPDATE ... SET fence) in two statements:
    a stale turn's write between them is refused, and the new history replays only its own checkpoints.
    Earlier such an insert committed, was re-stamped with the new fence and replayed into the new
    history."""
    from django.db import connection

    from durable.context import Context, _Checkpoint
    from durable.store import REPLAY_SQL, raw_cursor

    key = uuid.uuid4().hex
    run = services.run_start(workflow="fence_review.fail_fast_fan", input={"key": key})
    assert turns.execute_turn(run.id).outcome == "suspended"  # the fan is started
    steps.execute_steps(run.id, [0])  # item "a" fails (its first call); item "b" has not run yet
    cursor = raw_cursor()
    cursor.execute(REPLAY_SQL, (run.id,))
    snapshot = [_Checkpoint(row) for row in cursor.fetchall()]  # what a turn claimed now replays from
    assert [(cp.seq, cp.status) for cp in snapshot] == [(0, "failed"), (1, "pending")]

    def stale_turn_decides_fail_fast():
        # the turn that replayed that snapshot, stalled before recording its fail_fast choice (the run
        # was cancelled meanwhile), records it now
        ctx = Context(run_id=run.id, workflow="fence_review.fail_fast_fan", namespace="default", priority=0,
                      checkpoints={cp.seq: cp for cp in snapshot}, tags=[], token="stale-turn", fence=0)
        ctx.all(fr.fan_items({"key": key}), mode="fail_fast")

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
