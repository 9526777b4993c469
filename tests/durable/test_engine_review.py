"""Regression tests from an adversarial review of the engine: each pins an interleaving or an input
that an earlier version got wrong. Each docstring says what must hold, then ("Earlier: ...") what went
wrong before the fix."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

import tests.durable.review_workflows  # noqa: F401 - registers the review.* workflows
from durable import steps, turns
from durable.codec import decode
from durable.errors import TurnInterrupted
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.services import run_cancel, run_retry, run_start
from tests.durable.concurrency import in_thread, time_out_silent_steps_while

# ------------------------------------------------------------------ plain retries over fans


@pytest.mark.django_db
def test_a_plain_retry_of_a_fan_with_a_failed_item_reruns_the_failed_item(tmp_path):
    """Retry deletes the failed item's checkpoint and keeps the completed one; the replay re-runs only
    the failed item. Earlier: the replay found a fan with 1 checkpoint for 2 items and failed with a
    non-determinism error, every time."""
    run = run_until_settled(run_start(workflow="review.fan_flaky", input={"counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]
    assert decode(run.output) == [1, 1]


@pytest.mark.django_db
def test_a_plain_retry_of_a_fail_fast_fan_whose_child_now_succeeds_completes(tmp_path):
    """The failed child is re-run and now succeeds: the retried run completes. Earlier: the fail_fast
    record (a completed 'value' checkpoint) survived the retry and the replay refused it as
    non-deterministic."""
    run = run_until_settled(run_start(workflow="review.fail_fast_one_child",
                                      input={"counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]
    assert decode(run.output) == [1]


@pytest.mark.django_db
def test_a_plain_retry_replays_a_handled_failure_that_now_succeeds(tmp_path):
    """A step whose failure was handled (a fallback branch) succeeds on the retry: the code takes the
    other branch and the run completes. Earlier: retry kept the completed fallback recorded *after*
    the dropped failed step, the new branch met the fallback's checkpoint, a non-determinism error,
    and every further retry failed the same way."""
    run = run_until_settled(run_start(workflow="review.fallback_then_fail",
                                      input={"counter": str(tmp_path / "a"), "counter2": str(tmp_path / "b")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]


@pytest.mark.django_db
def test_a_plain_retry_does_not_resurrect_the_ended_children_of_a_completed_child(tmp_path):
    """A completed child handled a failed grandchild and had its other grandchild cancelled by the
    close policy. Retrying the (later failed) parent must not run those grandchildren again:
    nobody waits for them, the completed child never replays."""
    evidence = tmp_path / "grandchild.log"
    run = run_until_settled(run_start(workflow="review.grandparent",
                                      input={"path": str(evidence), "counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert evidence.read_text().count("ran") == 1
    grandchildren = DurableRun.objects.filter(parent__parent_id=run.id)
    before = dict(grandchildren.values_list("workflow", "status"))
    assert before == {"review.always_fails": "failed", "review.waits_forever": "cancelled"}
    assert run_retry(run_id=run.id)
    after = dict(grandchildren.values_list("workflow", "status"))
    assert after == before, "the retry re-opened runs that no parent waits for"
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    assert evidence.read_text().count("ran") == 1  # the failed grandchild's step ran again


# ------------------------------------------------------------------ continue-as-new


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_never_cancels_the_new_historys_children():
    """A worker that turns the new history right when the old turn applies the close policy (the
    old history's active children are cancelled) never has the new history's child cancelled: the
    policy applies inside the continue-as-new transaction, before the new history can start. Earlier
    it applied after, and could cancel the new history's child."""
    run = run_start(workflow="review.loop_with_child", input={"n": 0})
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


# ------------------------------------------------------------------ lock order


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


# ------------------------------------------------------------------ the chunked step worker


@pytest.mark.django_db(transaction=True)
def test_a_healthy_step_started_late_in_its_chunk_is_not_timed_out(tmp_path):
    """A step that starts ~0.7 s into its chunk still has its whole 3 s timeout: it runs once and is
    not timed out. Earlier: every step's silence clock was armed at claim and re-armed only at
    flushes between steps, skipped when the previous step took under a second, so the second step was
    timed out at 2.3 s of the 2.6 s it needs, ran twice, and its first result was thrown away."""
    evidence = tmp_path / "runs.log"
    run = run_start(workflow="review.fan_two_slow", input={"path": str(evidence), "first": 0.7, "second": 2.6,
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
    run = run_start(workflow="review.fast_then_beating", input={"path": str(evidence), "seconds": 4.0,
                                                               "timeout": 2.0})
    turns.execute_turn(run.id)
    worker, outcome = in_thread(steps.execute_steps, run.id, [0, 1])
    timed_out = time_out_silent_steps_while(worker)
    assert "error" not in outcome, outcome
    assert run_until_settled(run.id).status == "completed"
    assert (timed_out, evidence.read_text().split().count("start:fast")) == (0, 1)


# ------------------------------------------------------------------ hostile input


@pytest.mark.django_db(transaction=True)
def test_a_value_postgres_cannot_store_fails_the_call_instead_of_looping_the_run_to_dead():
    """A NUL byte in an attribute value is the workflow's input, not an engine outage: the call
    raises ValueError, which the workflow catches. Earlier it became EngineWriteFailed, which the
    workflow cannot catch: each turn was interrupted and retried, and after
    DURABLE_MAX_RECOVERY_ATTEMPTS the run was 'dead' ("engine writes kept failing")."""
    run = run_start(workflow="review.nul_attribute", input={})
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

    run = run_until_settled(run_start(workflow="review.transaction_then_refused_one",
                                      input={"name": "kept by the first transaction"}).id)
    assert run.status == "completed", decode(run.error)
    assert decode(run.output) == {"kept": "kept by the first transaction", "refused": True}
    assert Workspace.objects.filter(name="kept by the first transaction").count() == 1
