"""The scheduled re-evaluation: each active version re-run on its set; a significant drop flagged."""

import pytest

from durable.inprocess import run_until_settled
from durable.models import Schedule
from durable.services import run_start
from evals.durable_workflows import REEVALUATE_WORKFLOW
from evals.models import EvalRun
from evals.services import reevaluation_schedule_save

pytestmark = pytest.mark.django_db


def test_a_significant_drop_since_the_last_run_is_flagged(facts, support_set, support_versions, evaluate, workspace):
    from knowledge.models import KnowledgeSource
    from knowledge.services import source_delete
    from workflows.services import workflow_version_activate

    _, better = support_versions
    support_set.workflow = better.workflow
    support_set.save()
    workflow_version_activate(version=better)
    before = evaluate(support_set, better)
    assert before.avg_score > 0.8

    steady = run_until_settled(run_start(workflow=REEVALUATE_WORKFLOW, namespace=workspace.namespace).pk,
                               max_wait=60)
    assert steady.status == "completed"
    again = EvalRun.objects.get(origin="schedule")
    assert again.status == "completed" and again.items_reused == 0 and again.regression is None

    for source in KnowledgeSource.objects.filter(workspace=workspace):  # the knowledge the agent relied on is gone
        source_delete(source=source)
    drift = run_until_settled(run_start(workflow=REEVALUATE_WORKFLOW, namespace=workspace.namespace).pk,
                              max_wait=60)
    assert drift.status == "completed"
    dropped = EvalRun.objects.filter(origin="schedule").latest("pk")
    assert dropped.avg_score < again.avg_score
    assert dropped.regression["previous_run"] == again.pk
    assert dropped.regression["comparison"]["verdict"] == "worse"


def test_the_schedule_is_one_per_workspace(workspace):
    first = reevaluation_schedule_save(workspace=workspace)
    again = reevaluation_schedule_save(workspace=workspace, cron="30 2 * * *")
    assert first.pk == again.pk and Schedule.objects.count() == 1
    assert again.workflow == REEVALUATE_WORKFLOW and again.namespace == workspace.namespace
    assert again.cron == "30 2 * * *" and again.overlap == "skip" and again.next_fire_at is not None
