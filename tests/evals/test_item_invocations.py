"""Review of 6279aec: an item's invocation is written from the eval run's columns (evals.execution.
eval_invocations_create reads `.values(...)` of the run instead of the run with its version and durable run)."""

from decimal import Decimal

import pytest

from durable.models import DurableRun
from evals import execution
from evals.models import EvalRun
from evals.services import eval_run_start
from workflows.models import WorkflowInvocation

pytestmark = pytest.mark.django_db


@pytest.fixture
def eval_run(support_set, support_versions, owner):
    return eval_run_start(golden_set=support_set, version=support_versions[0], user=owner, usd_budget="0.25")


def first_item(eval_run):
    return eval_run.golden_set.items.order_by("position", "id").first()


def test_an_items_invocation_carries_the_eval_runs_workspace_version_budgets_author_and_its_lane(eval_run, owner):
    item = first_item(eval_run)
    created = execution.eval_invocations_create(eval_run.pk, [item.pk], "review16-lane")
    invocation = WorkflowInvocation.objects.get(pk=created[str(item.pk)])
    assert (invocation.workspace_id, invocation.workflow_version_id, invocation.input, invocation.node_budget,
            invocation.usd_budget, invocation.parent_run_id, invocation.created_by_id, invocation.status) == (
        eval_run.workspace_id, eval_run.workflow_version_id, item.input, eval_run.config["node_budget"],
        Decimal(eval_run.config["usd_budget"]), "review16-lane", owner.pk, "queued")


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "dead"])
def test_an_eval_run_whose_durable_run_ended_creates_no_invocation(status, eval_run):
    DurableRun.objects.filter(pk=eval_run.durable_run_id).update(status=status)
    before = WorkflowInvocation.objects.count()
    with pytest.raises(execution.EvalRunEnded, match=status):
        execution.eval_invocations_create(eval_run.pk, [first_item(eval_run).pk], "review16-lane")
    assert WorkflowInvocation.objects.count() == before


@pytest.mark.parametrize("status", ["pending", "running", "suspended"])
def test_an_eval_run_whose_durable_run_is_active_or_absent_creates_its_items_invocations(status, eval_run):
    items = list(eval_run.golden_set.items.order_by("position", "id").values_list("pk", flat=True)[:2])
    DurableRun.objects.filter(pk=eval_run.durable_run_id).update(status=status)
    assert set(execution.eval_invocations_create(eval_run.pk, items, "review16-lane")) == {str(pk) for pk in items}
    EvalRun.objects.filter(pk=eval_run.pk).update(durable_run=None)  # a row no run has begun
    assert set(execution.eval_invocations_create(eval_run.pk, items, "review16-lane-2")) == {str(pk) for pk in items}
