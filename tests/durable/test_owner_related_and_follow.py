"""Review of 166f67a: the rows an owner's plan reads through foreign keys (72c96ab), and the follow of a
started child's first turn where a second worker or a cancel gets in its way (35820e4, d4d84a8; a crash before the
follow is in test_engine_child_follow.py)."""

import dataclasses
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durable import owners, turns, workflow
from durable.models import DurableRun
from durable.services import run_cancel, run_start
from tests.builders import graph, node

# what another worker or an operator does while a followed child's first turn runs (set by a test)
DURING_CHILD: list = []


@workflow("tests.review16_parent")
def review16_parent(ctx, input):
    return ctx.child("tests.review16_child", input)


@workflow("tests.review16_child")
def review16_child(ctx, input):
    while DURING_CHILD:
        DURING_CHILD.pop(0)(ctx.run_id)
    return {"ok": True}


@pytest.fixture(autouse=True)
def _nothing_during_the_child():
    DURING_CHILD.clear()
    yield
    DURING_CHILD.clear()


@pytest.fixture
def invocation(make_version):
    from workflows.services import invocation_start

    return invocation_start(version=make_version(graph("a", node("a", approval=True))), input={"text": "x"})


@pytest.fixture
def invocation_owner(monkeypatch):
    """The invocations' owner entry, restored after the test (a test may register it again)."""
    from workflows.models import WorkflowInvocation

    monkeypatch.setattr(owners, "_owners", dict(owners._owners))
    return WorkflowInvocation, owners.owner_of(WorkflowInvocation)


# ---------------------------------------------------------------------------------------- owners: related

@pytest.mark.parametrize("related", [("status",), ("workflow",)], ids=["not-a-relation", "no-such-field"])
def test_register_refuses_related_names_that_begin_could_not_load(related, invocation_owner):
    # register checks an owner's shape as the apps load (ImproperlyConfigured); a `related` select_related
    # cannot follow is only found by begin, as a FieldError that fails the begin step of every run of the owner
    model, owner = invocation_owner
    with pytest.raises(ImproperlyConfigured):
        owners.register(model, noun="invocation", plan=owner.plan, on_end=owner.on_end, related=related)


def test_an_owner_registered_with_one_related_name_as_a_string_is_refused(invocation_owner):
    # tuple(related) of it would be the names "w", "o", "r", ... that begin's select_related refuses
    model, owner = invocation_owner
    with pytest.raises(ImproperlyConfigured, match="not the string 'workflow_version'"):
        owners.register(model, noun="invocation", plan=owner.plan, on_end=owner.on_end, related="workflow_version")


@pytest.mark.django_db
def test_a_nullable_related_row_that_is_null_is_loaded_as_none_and_only_the_row_is_locked(
        invocation, invocation_owner, workspace):
    model, owner = invocation_owner
    seen = []
    owners.register(model, noun="invocation", on_end=owner.on_end, related=("workflow_version", "created_by"),
                    plan=lambda row: seen.append(row.created_by) or owner.plan(row))
    with CaptureQueriesContext(connection) as queries:
        plan = owners.begin(model, invocation.pk, workspace.namespace, invocation.durable_run_id)
    assert plan["invocation_id"] == invocation.pk and seen == [None]
    locking = [query["sql"] for query in queries.captured_queries if "FOR UPDATE" in query["sql"]]
    assert len(locking) == 1 and "LEFT OUTER JOIN" in locking[0]
    assert locking[0].endswith('FOR UPDATE OF "workflows_workflowinvocation"')


def _held_in_plan(invocation_owner):
    """Make the first begin wait inside its plan (the row locked) until released; returns (entered, release)."""
    model, owner = invocation_owner
    entered, release = threading.Event(), threading.Event()

    def plan(row):
        if not entered.is_set():
            entered.set()
            assert release.wait(30)
        return owner.plan(row)

    owners._owners[model._meta.label] = dataclasses.replace(owner, plan=plan)
    return entered, release


def _in_thread(fn, *args):
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except Exception as exc:  # reported to the test
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_two_runs_beginning_a_row_with_no_run_at_once_one_takes_it_and_the_other_is_refused(
        invocation, invocation_owner, workspace):
    model, _owner = invocation_owner
    model.objects.filter(pk=invocation.pk).update(durable_run=None)  # a child's row, written by its parent
    entered, release = _held_in_plan(invocation_owner)
    first, first_out = _in_thread(owners.begin, model, invocation.pk, workspace.namespace, "review16-a")
    assert entered.wait(30)
    second, second_out = _in_thread(owners.begin, model, invocation.pk, workspace.namespace, "review16-b")
    time.sleep(0.5)
    assert second.is_alive()  # waiting for the row's lock
    release.set()
    first.join(30)
    second.join(30)
    assert first_out["value"]["invocation_id"] == invocation.pk
    assert second_out == {"value": {"refused": f"invocation {invocation.pk} is driven by run review16-a"}}
    assert model.objects.get(pk=invocation.pk).durable_run_id == "review16-a"


@pytest.mark.django_db(transaction=True)
def test_a_fail_while_a_begin_holds_the_row_waits_for_it_and_its_end_stands(invocation, invocation_owner,
                                                                             workspace):
    model, _owner = invocation_owner
    entered, release = _held_in_plan(invocation_owner)
    begin, begin_out = _in_thread(owners.begin, model, invocation.pk, workspace.namespace, invocation.durable_run_id)
    assert entered.wait(30)
    fail, fail_out = _in_thread(owners.fail, model, invocation.pk, "cancelled by hand", "cancelled")
    time.sleep(0.5)
    assert fail.is_alive()  # the lock of the row is still the begin's
    release.set()
    begin.join(30)
    fail.join(30)
    assert "error" not in begin_out and "error" not in fail_out, (begin_out, fail_out)
    row = model.objects.get(pk=invocation.pk)
    assert (row.status, row.error) == ("cancelled", "cancelled by hand")


# ----------------------------------------------------------------------------- the follow: a second worker, a cancel

@pytest.mark.django_db
@pytest.mark.parametrize("first", [False, True], ids=["a-message", "another-follow"])
def test_a_second_worker_asking_for_the_childs_first_turn_while_the_follow_runs_it_claims_nothing(
        first, sent_turns):
    run = run_start(workflow="tests.review16_parent", input={})
    outcomes = []
    DURING_CHILD.append(lambda child_id: outcomes.append(turns._execute_turn(child_id, first=first).outcome))
    assert turns.execute_turn(run.id).outcome == "suspended"
    child = DurableRun.objects.get(parent_id=run.id)
    assert outcomes == ["not_claimed"]
    assert (child.status, child.turns) == ("completed", 1)


@pytest.mark.django_db
def test_a_parent_cancelled_while_its_childs_first_turn_is_followed_leaves_both_cancelled(sent_turns):
    run = run_start(workflow="tests.review16_parent", input={})
    DURING_CHILD.append(lambda _child_id: run_cancel(run_id=run.id))
    assert turns.execute_turn(run.id).outcome == "suspended"  # the parent's own turn, before the cancel
    child = DurableRun.objects.get(parent_id=run.id)
    assert (DurableRun.objects.get(pk=run.id).status, child.status, child.output) == ("cancelled", "cancelled", "")


def test_register_refuses_a_foreign_keys_column_name_that_begin_could_not_load(invocation_owner):
    # Options.get_field also answers a foreign key's column name (workflow_version_id) with the key itself, so
    # _check_related accepts it; select_related takes field names only and refuses it, in every run's begin
    model, owner = invocation_owner
    with pytest.raises(ImproperlyConfigured):
        owners.register(model, noun="invocation", plan=owner.plan, on_end=owner.on_end,
                        related=("workflow_version_id",))
