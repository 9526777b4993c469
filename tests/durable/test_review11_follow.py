"""Review of 7449895: the worker that ran a turn starting a ctx.child runs the child's first turn next,
with no message. Each test names the interleaving it attacks; a failing test is a finding."""

import pytest
from django.db import OperationalError

from config.logging import log_context_fields, log_context_update
from durable import store, turns, workflow
from durable.errors import Suspend, TurnInterrupted
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.services import run_cancel, run_start
from durable.settings import durable_settings

SEEN: list = []


@workflow("review11.circular")
def circular(ctx, input):
    """Returns a value JSON cannot encode (a circular reference: ValueError, not TypeError)."""
    value: dict = {}
    value["self"] = value
    return value


@workflow("review11.parent_of_circular")
def parent_of_circular(ctx, input):
    return ctx.child("review11.circular", {})


@workflow("review11.child_twice")
def child_twice(ctx, input):
    """Swallows the suspension of its first ctx.child and starts another."""
    try:
        ctx.child("tests.child", {"x": 1}, name="one")
    except BaseException:  # noqa: BLE001 - the misuse under test
        pass
    return ctx.child("tests.child", {"x": 2}, name="two")


def _cancel_self(run_id):
    run_cancel(run_id=run_id, reason="cancelled while its turn ran")
    return True


@workflow("review11.cancelled_then_child")
def cancelled_then_child(ctx, input):
    ctx.step("cancel", _cancel_self, ctx.run_id)
    return ctx.child("tests.child", {"x": 1})


@workflow("review11.tagged_parent")
def tagged_parent(ctx, input):
    log_context_update(invocation_id=4242)
    return ctx.child("review11.context_child", {})


def _fields():
    return log_context_fields()


@workflow("review11.context_child")
def context_child(ctx, input):
    SEEN.append(ctx.side_effect(_fields, name="fields"))
    return "ok"


@workflow("review11.continued_parent")
def continued_parent(ctx, input):
    if input.get("round", 0) == 0:
        ctx.continue_as_new({"round": 1})
    return ctx.child("tests.child", {"x": 5})


@pytest.fixture
def sent_turns(monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(store, "dispatch_turn", lambda run_id, priority=0: sent.append(run_id))
    return sent


def _release_fails_once_for(monkeypatch, run_id):
    real = store.run_release
    failed = []

    def release(rid, token, wake_at, *, wake_now=False):
        if rid == run_id and not failed:
            failed.append(rid)
            raise OperationalError("server closed the connection unexpectedly")
        return real(rid, token, wake_at, wake_now=wake_now)

    monkeypatch.setattr(store, "run_release", release)


# ------------------------------------------------------------------------------------------ findings


@pytest.mark.django_db
def test_a_parent_turn_given_back_after_its_child_committed_leaves_the_child_unsent_until_the_lost_wake_pass(
        monkeypatch, sent_turns):
    """The parent's ctx.child commits the child (no message), then the parent's release fails (a transient
    database error): the turn is given back and raises TurnInterrupted, so no follow happens. The task is
    retried and the parent's next turn replays to the child's pending checkpoint, which neither follows nor
    sends the child. The live, retrying worker leaves the child for the lost-wake pass (30 s); before the
    commit the child's message was sent as its insert committed."""
    run = run_start(workflow="tests.parent", input={})
    sent_turns.clear()
    _release_fails_once_for(monkeypatch, run.id)
    with pytest.raises(TurnInterrupted):
        turns.execute_turn(run.id)
    # the Celery task's autoretry (and the timer pass, 1 s later): the parent's turn again
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert store.runs_redispatch_lost(after_seconds=durable_settings().redispatch_after_seconds, batch=10) == []
    assert child.turns > 0 or child.id in sent_turns, (
        f"child {child.status} with {child.turns} turns and no message (sent: {sent_turns}); only the lost-wake "
        f"pass, {durable_settings().redispatch_after_seconds:.0f} s after its insert, will send it")


@pytest.mark.django_db
def test_a_followed_childs_turn_given_back_after_its_own_child_committed_leaves_the_grandchild_unsent(
        monkeypatch, sent_turns):
    """The same one level down: the followed child's turn starts a grandchild and its release fails; the
    follow logs and returns ("given back"), the child's retried turn replays to the grandchild's pending
    checkpoint, and the grandchild has neither run nor been sent a message."""
    run = run_start(workflow="tests.nest", input={"depth": 2})
    sent_turns.clear()
    child_id = f"{run.id}/0"
    _release_fails_once_for(monkeypatch, child_id)
    assert turns.execute_turn(run.id).outcome == "suspended"  # the child's failure did not fail it
    assert DurableRun.objects.get(pk=child_id).recovery_attempts == 1
    # the child's retry (the timer pass resumes it 1 s later)
    assert turns.execute_turn(child_id).outcome == "suspended"
    grandchild = DurableRun.objects.get(parent_id=child_id)
    assert grandchild.turns > 0 or grandchild.id in sent_turns, (
        f"grandchild {grandchild.status} with {grandchild.turns} turns and no message (sent: {sent_turns})")


@pytest.mark.django_db
def test_a_childs_turn_raising_a_non_database_error_does_not_fail_its_parents_turn(sent_turns):
    """execute_turn promises a child's turn that failed "never fails the one that started it", but the follow
    catches only TurnInterrupted and database errors: a child whose end raises anything else (here its
    output's encoding: ValueError) raises out of the parent's execute_turn, after the parent's turn
    committed: the parent's run_turn task fails (no autoretry) and run_until_settled stops."""
    run = run_start(workflow="review11.parent_of_circular", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "suspended"


# --------------------------------------------------------------------------------- attacks that held


@pytest.mark.django_db
def test_held_a_cancel_between_the_parents_commit_and_the_follow_leaves_the_child_cancelled_and_unclaimed(
        monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent", input={})
    real = turns._execute_turn
    outcomes = []

    def cancel_first(run_id):
        if run_id != run.id:
            run_cancel(run_id=run.id)
        result = real(run_id)
        outcomes.append(result.outcome)
        return result

    monkeypatch.setattr(turns, "_execute_turn", cancel_first)
    turns.execute_turn(run.id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert outcomes == ["suspended", "not_claimed"]
    assert (child.status, child.turns) == ("cancelled", 0)


@pytest.mark.django_db
def test_held_a_parent_cancelled_mid_turn_inserts_no_child_and_the_follow_claims_nothing(sent_turns):
    run = run_start(workflow="review11.cancelled_then_child", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "lease_lost"
    assert DurableRun.objects.get(pk=run.id).status == "cancelled"
    assert not DurableRun.objects.filter(parent_id=run.id).exists()


@pytest.mark.django_db
def test_held_a_swallowed_suspension_then_a_second_child_fails_the_run_and_cancels_the_first(sent_turns):
    run = run_start(workflow="review11.child_twice", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "failed"
    assert result.error["type"] == "WorkflowMisuse"
    children = list(DurableRun.objects.filter(parent_id=run.id).values_list("status", "turns"))
    assert children == [("cancelled", 0)]


@pytest.mark.django_db
def test_held_a_child_claimed_by_another_worker_first_is_not_run_twice(monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent", input={})
    real = turns._execute_turn
    outcomes = []

    def other_worker_first(run_id):
        if run_id != run.id:
            # the lost-wake pass fired early and another worker claimed the child
            assert store.run_claim(store.raw_cursor(), run_id, "other-worker", 30.0) is not None
        result = real(run_id)
        outcomes.append(result.outcome)
        return result

    monkeypatch.setattr(turns, "_execute_turn", other_worker_first)
    assert turns.execute_turn(run.id).outcome == "suspended"
    assert outcomes == ["suspended", "not_claimed"]
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.locked_by, child.turns) == ("running", "other-worker", 1)


@pytest.mark.django_db
def test_held_a_chain_exactly_follow_limit_deep_is_followed_whole_with_no_message_for_a_pending_child(sent_turns):
    run = run_start(workflow="tests.nest", input={"depth": turns.FOLLOW_LIMIT})
    sent_turns.clear()
    turns.execute_turn(run.id)
    chain = sorted(DurableRun.objects.exclude(pk=run.id), key=lambda row: len(row.id))
    assert [row.turns for row in chain] == [1] * turns.FOLLOW_LIMIT
    assert chain[-1].status == "completed"
    assert sent_turns == [chain[-2].id]  # the leaf's end woke its parent; nothing pending was left
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_held_a_replayed_turn_with_the_child_already_started_follows_nothing(monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent_of_waiting", input={})
    turns.execute_turn(run.id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.turns) == ("suspended", 1)
    calls = []
    real = turns._execute_turn
    monkeypatch.setattr(turns, "_execute_turn", lambda run_id: calls.append(run_id) or real(run_id))
    assert turns.execute_turn(run.id).outcome == "suspended"  # a duplicate delivery of the parent's message
    assert calls == [run.id]
    assert DurableRun.objects.get(pk=child.id).turns == 1


@pytest.mark.django_db
def test_held_log_context_of_the_parents_turn_does_not_leak_into_the_followed_childs_turn(sent_turns):
    SEEN.clear()
    run = run_start(workflow="review11.tagged_parent", input={})
    turns.execute_turn(run.id)
    assert len(SEEN) == 1
    assert SEEN[0]["run_id"] == f"{run.id}/0"
    assert "invocation_id" not in SEEN[0]


@pytest.mark.django_db
def test_held_continue_as_new_then_a_child_is_followed_under_the_new_epochs_id(sent_turns):
    run = run_start(workflow="review11.continued_parent", input={})
    assert turns.execute_turn(run.id).outcome == "continued"
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.id, child.status, child.turns) == (f"{run.id}/1.0", "completed", 1)
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_held_a_childs_claim_failing_in_the_follow_leaves_it_to_the_lost_wake_pass(monkeypatch, sent_turns):
    import psycopg

    run = run_start(workflow="tests.parent", input={})
    real = store.run_claim

    def claim(cursor, run_id, token, lease_seconds):
        if run_id != run.id:
            raise psycopg.OperationalError("the connection was lost")
        return real(cursor, run_id, token, lease_seconds)

    monkeypatch.setattr(store, "run_claim", claim)
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.wake_pending, child.turns) == ("pending", True, 0)
    monkeypatch.setattr(store, "run_claim", real)
    assert [row[0] for row in store.runs_redispatch_lost(after_seconds=0, batch=10)] == [child.id]
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_held_a_chain_one_past_the_limit_sends_the_leaf_a_message(sent_turns):
    run = run_start(workflow="tests.nest", input={"depth": turns.FOLLOW_LIMIT + 1})
    sent_turns.clear()
    turns.execute_turn(run.id)
    chain = sorted(DurableRun.objects.exclude(pk=run.id), key=lambda row: len(row.id))
    assert [row.turns for row in chain] == [1] * turns.FOLLOW_LIMIT + [0]
    assert sent_turns == [chain[-1].id]
