"""Rows a durable run drives (durable.owners), through each app's owner: the guards of begin and the
one reconcile the beat runs for all of them."""

import json

import pytest

from durable.inprocess import run_until_settled
from durable.services import run_cancel, run_start
from tests.builders import graph, node
from tests.evals.conftest import support_set  # noqa: F401  (shared fixture)

pytestmark = pytest.mark.django_db

OWNERS = ["workflows.WorkflowInvocation", "evals.EvalRun", "evolution.EvolutionRun"]


@pytest.fixture
def start_row(make_version, support_set):  # noqa: F811
    """Start a row of an owner (by its label) the way its app does; returns (row, its workflow, its input)."""
    from evals.durable_workflows import EVAL_WORKFLOW
    from evals.services import eval_run_start
    from evolution.durable_workflows import EVOLVE_WORKFLOW
    from evolution.services import evolution_start
    from workflows.durable_workflows import INVOKE_WORKFLOW
    from workflows.services import invocation_start

    version = make_version(graph("a", node("a", approval=True)))

    def start(label: str):
        if label == "workflows.WorkflowInvocation":
            row = invocation_start(version=version, input={"text": "x"})
            return row, INVOKE_WORKFLOW, {"invocation_id": row.pk}
        if label == "evals.EvalRun":
            row = eval_run_start(golden_set=support_set, version=version)
            return row, EVAL_WORKFLOW, {"eval_run_id": row.pk}
        row = evolution_start(workflow=version.workflow, golden_set=support_set,
                              config={"population": 2, "generations": 1, "seed": 1})
        return row, EVOLVE_WORKFLOW, {"evolution_run_id": row.pk}

    return start


@pytest.mark.parametrize("label", OWNERS)
def test_begin_refuses_a_row_of_another_workspace_or_driven_by_another_run_and_leaves_an_ended_one(
        label, start_row, workspace, other_workspace):
    row, workflow, input = start_row(label)
    own_run = row.durable_run_id

    stranger = run_until_settled(run_start(workflow=workflow, input=input, namespace=other_workspace.namespace).pk)
    assert stranger.status == "failed" and "does not belong to this run's workspace" in stranger.error
    intruder = run_until_settled(run_start(workflow=workflow, input=input, namespace=workspace.namespace).pk)
    assert intruder.status == "failed" and f"is driven by run {own_run}" in intruder.error
    row.refresh_from_db()
    assert (row.status, row.durable_run_id, row.error, row.started_at) == ("queued", own_run, "", None)

    type(row).objects.filter(pk=row.pk).update(status="cancelled", error="stopped by hand")
    ended = run_until_settled(own_run)
    assert ended.status == "completed" and json.loads(ended.output) == {"status": "cancelled"}
    row.refresh_from_db()
    assert (row.status, row.error, row.started_at) == ("cancelled", "stopped by hand", None)


def test_one_beat_entry_ends_the_rows_of_every_owner_whose_run_ended(start_row):
    from config.celery import app

    reconciles = [entry["task"] for entry in app.conf.beat_schedule.values() if "reconcile" in entry["task"]]
    assert reconciles == ["durable.reconcile"]
    app.loader.import_default_modules()  # what a worker does at start: the apps' task modules
    # the names the beat sent before still run, for a message queued then
    assert {"workflows.reconcile", "evals.reconcile", "evolution.reconcile"} <= set(app.tasks)

    ended = {label: start_row(label)[0] for label in OWNERS}
    active = {label: start_row(label)[0] for label in OWNERS}
    for row in ended.values():
        run_cancel(run_id=row.durable_run_id, reason="from the durable admin")

    assert app.tasks[reconciles[0]]() == {label: 1 for label in OWNERS}
    for row in ended.values():
        row.refresh_from_db()
        assert row.status == "cancelled" and f"its durable run {row.durable_run_id} was cancelled" in row.error
        assert row.ended_at is not None
    for row in active.values():
        row.refresh_from_db()
        assert row.status == "queued" and not row.ended_at
    assert app.tasks[reconciles[0]]() == {label: 0 for label in OWNERS}


def test_the_reconcile_reads_each_owners_active_rows_through_its_index(start_row):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable import owners

    for label in OWNERS:
        start_row(label)
    with CaptureQueriesContext(connection) as queries:
        assert owners.reconcile() == {label: 0 for label in OWNERS}
    selects = [query["sql"] for query in queries.captured_queries]
    assert len(selects) == len(OWNERS)  # one statement per owner, whatever the row count
    plans = []
    with connection.cursor() as cursor:
        # tiny tables: ask whether the active-rows index can serve the query. Plain index scans are off too, or the
        # primary key's scan in id order (the query's order) may cost as little and be chosen; a bitmap scan
        # needs an index condition, which only a partial index whose predicate the query implies does without
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_indexonlyscan = off")
        for select in selects:
            cursor.execute("EXPLAIN " + select)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    for plan, index in zip(plans, ["workflows_inv_active_idx", "evals_run_active_idx", "evolution_run_active_idx"],
                           strict=True):
        assert index in plan, plan


def test_an_invocations_begin_reads_its_version_with_its_row_and_locks_only_the_row(start_row, workspace):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable import owners
    from workflows.models import WorkflowInvocation

    row, _workflow, _input = start_row("workflows.WorkflowInvocation")
    with CaptureQueriesContext(connection) as queries:
        plan = owners.begin(WorkflowInvocation, row.pk, workspace.namespace, row.durable_run_id)
    assert plan["version_id"] == row.workflow_version_id and plan["dsl"] == row.workflow_version.dsl
    selects = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("SELECT")]
    locking = [sql for sql in selects if "FOR UPDATE" in sql]
    assert len(locking) == 1 and '"workflows_workflowversion"' in locking[0]
    assert locking[0].endswith('FOR UPDATE OF "workflows_workflowinvocation"')
    # nothing more of the version is fetched: the plan's other read is its node versions' ids
    assert [sql for sql in selects if sql not in locking and 'FROM "workflows_workflowversion"' in sql] == []


def test_the_begin_of_an_owner_naming_no_related_rows_joins_nothing(start_row, workspace):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from durable import owners
    from evals.models import EvalRun

    row, _workflow, _input = start_row("evals.EvalRun")
    with CaptureQueriesContext(connection) as queries:
        owners.begin(EvalRun, row.pk, workspace.namespace, row.durable_run_id)
    locking = [query["sql"] for query in queries.captured_queries if "FOR UPDATE" in query["sql"]]
    assert len(locking) == 1 and " JOIN " not in locking[0]
