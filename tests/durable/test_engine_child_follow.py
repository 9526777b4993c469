"""The worker that ran a turn starting a ctx.child runs the child's first turn next, with no message
(durable.turns.execute_turn): each test names the interleaving it pins down."""

import contextlib

import pytest
from django.db import OperationalError

from config.logging import log_context_fields, log_context_update
from durable import errors, store, turns, workflow
from durable.codec import decode
from durable.errors import TurnInterrupted
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.services import run_cancel, run_start
from durable.settings import durable_settings

SEEN: list = []


@workflow("tests.follow_circular")
def circular(ctx, input):
    """Returns a value JSON cannot encode (a circular reference: ValueError, not TypeError)."""
    value: dict = {}
    value["self"] = value
    return value


@workflow("tests.follow_parent_of_circular")
def parent_of_circular(ctx, input):
    return ctx.child("tests.follow_circular", {})


@workflow("tests.follow_child_twice")
def child_twice(ctx, input):
    """Swallows the suspension of its first ctx.child and starts another."""
    with contextlib.suppress(BaseException):  # the misuse under test
        ctx.child("tests.child", {"x": 1}, name="one")
    return ctx.child("tests.child", {"x": 2}, name="two")


@workflow("tests.follow_tagged_parent")
def tagged_parent(ctx, input):
    log_context_update(invocation_id=4242)
    return ctx.child("tests.follow_context_child", {})


def _fields():
    return log_context_fields()


@workflow("tests.follow_context_child")
def context_child(ctx, input):
    SEEN.append(ctx.side_effect(_fields, name="fields"))
    return "ok"


@workflow("tests.follow_continued_parent")
def continued_parent(ctx, input):
    if input.get("round", 0) == 0:
        ctx.continue_as_new({"round": 1})
    return ctx.child("tests.child", {"x": 5})


def _release_fails_once_for(monkeypatch, run_id):
    real = store.run_release
    failed = []

    def release(rid, token, wake_at, *, wake_now=False):
        if rid == run_id and not failed:
            failed.append(rid)
            raise OperationalError("server closed the connection unexpectedly")
        return real(rid, token, wake_at, wake_now=wake_now)

    monkeypatch.setattr(store, "run_release", release)


def _recording(real, claimed):
    def execute(run_id, **kw):
        result = real(run_id, **kw)
        claimed.append((run_id, result.outcome))
        return result
    return execute


# -------------------------------------------------------------------------------- given back, failed


@pytest.mark.django_db
def test_a_parent_turn_given_back_after_its_child_committed_follows_the_child_when_it_is_retried(
        monkeypatch, sent_turns):
    """The parent's ctx.child commits the child (no message), then the parent's release fails (a transient
    database error): the turn is given back and raises TurnInterrupted, so no follow happens then. The task
    is retried, and the parent's next turn replays to the child's pending checkpoint and follows the child,
    which has had no turn: it is not left for the lost-wake pass (30 s)."""
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
def test_a_followed_childs_turn_given_back_after_its_own_child_committed_follows_the_grandchild_when_retried(
        monkeypatch, sent_turns):
    """The same one level down: the followed child's turn starts a grandchild and its release fails; the
    follow logs and returns (the child was given back), and the child's retried turn replays to the
    grandchild's pending checkpoint and follows the grandchild."""
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
    """A followed child's turn that raises anything (not only a database error) never fails the parent's
    turn. Here the child's output cannot be encoded (a circular reference raises ValueError, not TypeError):
    the child fails saying so, as it would on its own worker."""
    run = run_start(workflow="tests.follow_parent_of_circular", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert child.status == "failed" and "not JSON-serialisable" in child.error
    assert run_until_settled(run.id).status == "failed"


@pytest.mark.django_db
def test_a_turn_that_starts_a_child_runs_the_childs_first_turn_next_and_sends_it_no_message(sent_turns):
    run = run_start(workflow="tests.parent", input={})
    sent_turns.clear()
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    # the child ran (and ended) in the same call; its end woke the parent, by message
    assert (child.status, child.turns) == ("completed", 1)
    assert sent_turns == [run.id]
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
@pytest.mark.parametrize("finisher", ["lost-wake pass", "redelivered parent message"])
def test_a_crash_before_the_childs_first_turn_leaves_it_to_the_lost_wake_pass_or_the_parents_redelivery(
        monkeypatch, sent_turns, finisher):
    run = run_start(workflow="tests.parent", input={})
    real = turns._execute_turn

    def dies_before_the_child(run_id, **kw):
        if run_id != run.id:
            raise SystemExit("the worker died after its turn committed")
        return real(run_id, **kw)

    monkeypatch.setattr(turns, "_execute_turn", dies_before_the_child)
    sent_turns.clear()
    with pytest.raises(SystemExit):
        turns.execute_turn(run.id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.wake_pending, child.turns) == ("pending", True, 0)
    assert sent_turns == []  # no message for it yet: the lost-wake pass sends one
    if finisher == "lost-wake pass":
        assert [row[0] for row in store.runs_redispatch_lost(after_seconds=0, batch=10)] == [child.id]
        assert sent_turns == [child.id]
        monkeypatch.setattr(turns, "_execute_turn", real)
    else:
        monkeypatch.setattr(turns, "_execute_turn", real)
        # the parent's message was not acknowledged (acks_late): delivered again, its turn replays to the child
        # and follows it
        assert turns.execute_turn(run.id).outcome == "suspended"
        child.refresh_from_db()
        assert (child.status, child.turns) == ("completed", 1)
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_a_childs_first_turn_that_fails_is_given_back_and_never_fails_its_parents_turn(monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent", input={})
    real = turns._turn

    def engine_write_fails_in_the_child(run_id, *args):
        if run_id != run.id:
            raise errors.EngineWriteFailed(RuntimeError("the database went away"))
        return real(run_id, *args)

    monkeypatch.setattr(turns, "_turn", engine_write_fails_in_the_child)
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.recovery_attempts, child.locked_by) == ("suspended", 1, "")
    assert child.wake_at is not None  # given back with a short delay, for the timer pass
    monkeypatch.setattr(turns, "_turn", real)
    assert run_until_settled(run.id).status == "completed"


# ------------------------------------------------------------------------------------------ races


@pytest.mark.django_db
def test_a_cancel_between_the_parents_commit_and_the_follow_leaves_the_child_cancelled_and_unclaimed(
        monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent", input={})
    real = turns._execute_turn
    outcomes = []

    def cancel_first(run_id, **kw):
        if run_id != run.id:
            run_cancel(run_id=run.id)
        result = real(run_id, **kw)
        outcomes.append(result.outcome)
        return result

    monkeypatch.setattr(turns, "_execute_turn", cancel_first)
    turns.execute_turn(run.id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert outcomes == ["suspended", "not_claimed"]
    assert (child.status, child.turns) == ("cancelled", 0)


@pytest.mark.django_db
def test_a_parent_cancelled_mid_turn_inserts_no_child_and_the_follow_claims_nothing(sent_turns):
    run = run_start(workflow="tests.cancel_then_child", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "lease_lost"
    assert DurableRun.objects.get(pk=run.id).status == "cancelled"
    assert not DurableRun.objects.filter(parent_id=run.id).exists()


@pytest.mark.django_db
def test_a_swallowed_suspension_then_a_second_child_fails_the_run_and_cancels_the_first(sent_turns):
    run = run_start(workflow="tests.follow_child_twice", input={})
    result = turns.execute_turn(run.id)
    assert result.outcome == "failed"
    assert result.error["type"] == "WorkflowMisuse"
    children = list(DurableRun.objects.filter(parent_id=run.id).values_list("status", "turns"))
    assert children == [("cancelled", 0)]


@pytest.mark.django_db
def test_a_child_claimed_by_another_worker_first_is_not_run_twice(monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent", input={})
    real = turns._execute_turn
    outcomes = []

    def other_worker_first(run_id, **kw):
        if run_id != run.id:
            # the lost-wake pass fired early and another worker claimed the child
            assert store.run_claim(store.raw_cursor(), run_id, "other-worker", 30.0) is not None
        result = real(run_id, **kw)
        outcomes.append(result.outcome)
        return result

    monkeypatch.setattr(turns, "_execute_turn", other_worker_first)
    assert turns.execute_turn(run.id).outcome == "suspended"
    assert outcomes == ["suspended", "not_claimed"]
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.locked_by, child.turns) == ("running", "other-worker", 1)


@pytest.mark.django_db
def test_a_chain_exactly_follow_limit_deep_is_followed_whole_with_no_message_for_a_pending_child(sent_turns):
    run = run_start(workflow="tests.nest", input={"depth": turns.FOLLOW_LIMIT})
    sent_turns.clear()
    turns.execute_turn(run.id)
    chain = sorted(DurableRun.objects.exclude(pk=run.id), key=lambda row: len(row.id))
    assert [row.turns for row in chain] == [1] * turns.FOLLOW_LIMIT
    assert chain[-1].status == "completed"
    assert sent_turns == [chain[-2].id]  # the leaf's end woke its parent; nothing pending was left
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_a_replayed_turn_with_the_child_already_started_follows_nothing(monkeypatch, sent_turns):
    run = run_start(workflow="tests.parent_of_waiting", input={})
    turns.execute_turn(run.id)
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.turns) == ("suspended", 1)
    claimed = []
    real = turns._execute_turn
    monkeypatch.setattr(turns, "_execute_turn", _recording(real, claimed))
    assert turns.execute_turn(run.id).outcome == "suspended"  # a duplicate delivery of the parent's message
    # the replay asks for the child's first turn, which it has had: nothing claims it
    assert claimed == [(run.id, "suspended"), (child.id, "not_claimed")]
    assert DurableRun.objects.get(pk=child.id).turns == 1


@pytest.mark.django_db
def test_log_context_of_the_parents_turn_does_not_leak_into_the_followed_childs_turn(sent_turns):
    SEEN.clear()
    run = run_start(workflow="tests.follow_tagged_parent", input={})
    turns.execute_turn(run.id)
    assert len(SEEN) == 1
    assert SEEN[0]["run_id"] == f"{run.id}/0"
    assert "invocation_id" not in SEEN[0]


@pytest.mark.django_db
def test_continue_as_new_then_a_child_is_followed_under_the_new_epochs_id(sent_turns):
    run = run_start(workflow="tests.follow_continued_parent", input={})
    assert turns.execute_turn(run.id).outcome == "continued"
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.id, child.status, child.turns) == (f"{run.id}/1.0", "completed", 1)
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
def test_a_childs_claim_failing_in_the_follow_leaves_it_to_the_lost_wake_pass(monkeypatch, sent_turns):
    import psycopg

    run = run_start(workflow="tests.parent", input={})
    real = store.run_claim

    def claim(cursor, run_id, token, lease_seconds, **kw):
        if run_id != run.id:
            raise psycopg.OperationalError("the connection was lost")
        return real(cursor, run_id, token, lease_seconds, **kw)

    monkeypatch.setattr(store, "run_claim", claim)
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert (child.status, child.wake_pending, child.turns) == ("pending", True, 0)
    monkeypatch.setattr(store, "run_claim", real)
    assert [row[0] for row in store.runs_redispatch_lost(after_seconds=0, batch=10)] == [child.id]
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db
@pytest.mark.parametrize("past", [1, 2])
def test_a_chain_of_children_is_followed_to_the_limit_and_the_next_is_sent_a_message(past, sent_turns):
    depth = turns.FOLLOW_LIMIT + past
    run = run_start(workflow="tests.nest", input={"depth": depth})
    sent_turns.clear()
    turns.execute_turn(run.id)
    chain = sorted(DurableRun.objects.exclude(pk=run.id), key=lambda row: len(row.id))
    assert [row.turns for row in chain] == [1] * turns.FOLLOW_LIMIT + [0]
    assert sent_turns == [chain[-1].id]
    assert decode(run_until_settled(run.id).output)["depth"] == depth
