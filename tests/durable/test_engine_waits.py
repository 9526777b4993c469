import time

import pytest

from durable import store, turns
from durable.codec import decode
from durable.errors import InvalidRunState
from durable.inprocess import run_until_settled
from durable.models import BufferedEvent, BufferedSignal, DurableRun, SignalWaiter
from durable.services import event_publish, run_start, signal_send

pytestmark = pytest.mark.django_db


def test_signal_delivered_to_a_waiting_run():
    run = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    assert run.status == "suspended"
    assert SignalWaiter.objects.filter(run=run, key="approve").exists()
    assert signal_send(run_id=run.id, name="approve", payload={"by": "ana"}) == "delivered"
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output) == {"before": 1, "payload": {"by": "ana"}}
    assert not SignalWaiter.objects.filter(run=run).exists()


def test_signal_sent_before_the_wait_is_buffered_and_consumed():
    run = run_start(workflow="tests.signal", input={})
    assert signal_send(run_id=run.id, name="approve", payload="early") == "buffered"
    assert BufferedSignal.objects.filter(run=run).count() == 1
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output)["payload"] == "early"
    assert BufferedSignal.objects.filter(run=run).count() == 0


def test_signal_timeout_returns_the_default():
    run = run_until_settled(run_start(workflow="tests.signal", input={"timeout": 0.2}).id, max_wait=5)
    assert run.status == "completed"
    assert decode(run.output)["payload"] == "timed-out"
    # a signal arriving after the timeout is buffered, not lost, and cannot change the result
    with pytest.raises(InvalidRunState):
        signal_send(run_id=run.id, name="approve", payload="late")


def test_event_reaches_only_matching_waiters_and_buffers_otherwise():
    first = run_until_settled(run_start(workflow="tests.event", input={"order": 1}).id)
    second = run_until_settled(run_start(workflow="tests.event", input={"order": 2}).id)
    assert event_publish(name="order.paid", payload={"order": 1, "amount": 5}) == 1
    assert run_until_settled(first.id).status == "completed"
    assert run_until_settled(second.id).status == "suspended"
    assert event_publish(name="order.paid", payload={"order": 3}) == 0
    assert BufferedEvent.objects.filter(name="order.paid").count() == 1
    late = run_until_settled(run_start(workflow="tests.event", input={"order": 3}).id)
    assert late.status == "completed"
    assert decode(late.output) == {"order": 3}


def test_sleep_suspends_without_holding_a_worker_and_resumes_when_due():
    from durable import tick

    run = run_start(workflow="tests.sleep", input={"seconds": 0.3})
    result = turns.execute_turn(run.id)
    assert result.outcome == "suspended" and result.wake_at is not None
    run = DurableRun.objects.get(pk=run.id)
    assert run.status == "suspended" and run.locked_by == ""
    assert tick.resume_due_timers() == 0
    time.sleep(0.35)
    assert tick.resume_due_timers() == 1
    assert DurableRun.objects.get(pk=run.id).wake_pending is True
    assert run_until_settled(run.id).status == "completed"


def test_children_and_child_fans_complete_the_parent():
    run = run_until_settled(run_start(workflow="tests.parent", input={}).id)
    assert run.status == "completed", run.error
    assert decode(run.output) == {"one": {"child": 2}, "many": [{"child": 0}, {"child": 2}, {"child": 4}]}
    assert DurableRun.objects.filter(parent=run).count() == 4


def test_a_wake_during_a_turn_is_not_lost():
    run = run_start(workflow="tests.signal", input={})
    claimed = store.raw_cursor()
    claimed.execute(store.CLAIM_SQL, ("someone-else", 30.0, run.id))
    assert claimed.fetchone() is not None
    # a wake arrives while that turn holds the lease: it is only flagged...
    assert store.run_wake(run.id) is True
    assert DurableRun.objects.get(pk=run.id).wake_pending is True
    # ...and the turn sees the flag when it releases the run, so it asks for the next turn itself
    result = turns._release(run.id, "someone-else", None)
    assert result.redispatched is True


def test_events_never_cross_namespaces():
    ours = run_until_settled(run_start(workflow="tests.event", input={"order": 7}, namespace="ws-1").id)
    theirs = run_until_settled(run_start(workflow="tests.event", input={"order": 7}, namespace="ws-2").id)
    assert event_publish(name="order.paid", payload={"order": 7}, namespace="ws-2") == 1
    assert run_until_settled(theirs.id).status == "completed"
    assert run_until_settled(ours.id).status == "suspended"
    # a buffered event of one namespace is not taken by a run of another
    assert event_publish(name="order.shipped", payload={"order": 8}, namespace="ws-2") == 0
    late = run_until_settled(run_start(workflow="tests.event_shipped", input={"order": 8}, namespace="ws-1").id)
    assert late.status == "suspended"
    assert BufferedEvent.objects.get(name="order.shipped").namespace == "ws-2"
