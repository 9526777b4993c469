"""Which workflows a workspace member may start, and what a workflow does with an id that names a row
of another workspace. Both walk the registry, so a workflow added later is covered without a line here."""

import json

import pytest

from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import DurableRun, Schedule, StepCheckpoint
from durable.registry import get_workflow, workflow_names
from durable.services import run_cancel, run_start
from knowledge import services as knowledge_services
from knowledge.models import KnowledgeChunk, KnowledgeSource
from tests.factories import SkillFactory

pytestmark = pytest.mark.django_db

RUNS = "/api/durable/runs/"
SCHEDULES = "/api/durable/schedules/"
SECRET = "Globex quarterly numbers: revenue 7,431,009 (confidential)."


@pytest.fixture
def foreign(other_workspace):
    """Rows of the outsider's workspace (A), indexed, with content the owner (B) must never see."""
    source, _ = knowledge_services.source_create_text(workspace=other_workspace, text=SECRET, title="Numbers")
    run_until_settled(KnowledgeSource.objects.get(pk=source.pk).ingest_run_id, max_wait=30)
    source.refresh_from_db()
    assert source.ingest_status == "indexed"
    skill = SkillFactory(workspace=other_workspace)
    run = run_start(workflow="tests.sequence", input={"steps": 1}, namespace=other_workspace.namespace)
    return {"workspace": other_workspace, "source": source, "skill": skill, "run": run}


def foreign_inputs(foreign) -> list[dict]:
    """Every way an input can name A's rows: each id under the names workflows use."""
    source, skill, run, ws = foreign["source"], foreign["skill"], foreign["run"], foreign["workspace"]
    return [
        {"source_id": source.pk, "mode": "ingest", "force": True},
        {"source_id": source.pk, "mode": "reembed"},
        {"skill_id": skill.pk, "run_id": run.pk, "workspace": ws.pk, "workspace_id": ws.pk, "id": source.pk,
         "input": {"source_id": source.pk}},
    ]


def snapshot(foreign) -> dict:
    source = KnowledgeSource.objects.values().get(pk=foreign["source"].pk)
    chunks = list(KnowledgeChunk.objects.filter(source_id=source["id"]).order_by("ordinal")
                  .values_list("id", "content"))
    run = DurableRun.objects.values("status", "updated_at").get(pk=foreign["run"].pk)
    return {"source": source, "chunks": chunks, "run": run}


def test_only_workflows_marked_for_the_api_can_be_started_or_scheduled(api_as, owner, workspace):
    client = api_as(owner)
    internal = [name for name in workflow_names() if not get_workflow(name).api]
    assert "knowledge.ingest_source" in internal
    for name in internal:
        response = client.post(RUNS, {"workflow": name, "workspace": workspace.pk, "input": {}}, format="json")
        assert response.status_code == 400, name
        assert "workflow" in response.json()["error"]["fields"], name
        response = client.post(SCHEDULES, {"key": f"k-{name}", "workflow": name, "workspace": workspace.pk,
                                           "every_seconds": 60}, format="json")
        assert response.status_code == 400, name
        assert "workflow" in response.json()["error"]["fields"], name
    assert not DurableRun.objects.filter(workflow__in=internal, namespace=workspace.namespace).exists()
    assert not Schedule.objects.exists()
    started = client.post(RUNS, {"workflow": "durable.demo.digest", "workspace": workspace.pk, "input": {}},
                          format="json")
    assert started.status_code == 201, started.json()


@pytest.mark.parametrize("variant", range(3))
def test_every_workflow_refuses_an_id_of_another_workspace(api_as, owner, workspace, foreign, variant):
    """B (owner of `workspace`) names A's rows in a run's input, through the API where the workflow is
    startable there, and directly in B's namespace (as a schedule or a platform path would): A's rows
    are left alone and nothing of A reaches B's run, its output or its timeline."""
    client = api_as(owner)
    before = snapshot(foreign)
    payload = foreign_inputs(foreign)[variant]
    for name in workflow_names():
        if get_workflow(name).api:
            response = client.post(RUNS, {"workflow": name, "workspace": workspace.pk, "input": payload},
                                   format="json")
            assert response.status_code in (201, 400), (name, response.json())
            started = [response.json()["id"]] if response.status_code == 201 else []
        else:
            started = []
        started.append(run_start(workflow=name, input=payload, namespace=workspace.namespace).pk)
        for run_id in started:
            run = run_until_settled(run_id, max_wait=0.5)
            steps = StepCheckpoint.objects.filter(run__namespace=workspace.namespace, run__id__startswith=run_id)
            seen = [run.input, run.output, run.error,
                    *(value for pair in steps.values_list("output", "error") for value in pair)]
            text = json.dumps([decode(value) if value else None for value in seen])
            assert "7,431,009" not in text, name
        assert snapshot(foreign) == before, name
    ingest = DurableRun.objects.filter(workflow="knowledge.ingest_source", namespace=workspace.namespace)
    if variant < 2:
        run = ingest.get()
        assert run.status == "failed"
        assert "not in this run's workspace" in decode(run.error)["message"]


def test_a_platform_run_is_not_retried_with_an_input_of_the_callers_choosing(api_as, owner, workspace, foreign):
    run = run_start(workflow="knowledge.ingest_source", input={"source_id": 0}, namespace=workspace.namespace)
    assert run_cancel(run_id=run.pk, reason="test")
    client = api_as(owner)
    response = client.post(f"{RUNS}{run.pk}/retry/", {"input": {"source_id": foreign["source"].pk}}, format="json")
    assert response.status_code == 400
    assert "input" in response.json()["error"]["fields"]
    assert client.post(f"{RUNS}{run.pk}/retry/", format="json").status_code == 200
    assert decode(DurableRun.objects.get(pk=run.pk).input) == {"source_id": 0}
