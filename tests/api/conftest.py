import json

import pytest
import schemathesis

import tests.durable.workflows  # noqa: F401 - the suites walk every registered workflow, test ones included
from tests.builders import graph, node


@schemathesis.serializer("application/jsonl")
def _jsonl_body(ctx, value) -> bytes:
    """Generated bodies for the import's JSONL content type (golden-sets/{id}/import/): text as it is, any
    other value as one JSON line. Without it schemathesis skips that content type."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return (json.dumps(value) + "\n").encode()


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs started through the API here are driven in-process (or left pending): no worker listens."""
    settings.DURABLE_DISPATCH_ENABLED = False


def solo(prompt: str) -> dict:
    """A one-node workflow answered by the offline model."""
    return graph("solo", node("solo", prompt=prompt, model="offline-directive-v1", handoffs=["end"]))


def make_world(workspace, user):
    """One object of every kind the API exposes, in `workspace`, created by `user`; returns a marker text
    found in its content (the isolation suite checks it never reaches another workspace's member)."""
    from durable.inprocess import run_until_settled
    from durable.services import run_start, schedule_save
    from tests.factories import KnowledgeChunkFactory, KnowledgeSourceFactory, SkillFactory

    marker = f"marker-{workspace.slug}-7431"
    source = KnowledgeSourceFactory(workspace=workspace, title=f"Source {marker}", text=f"Text {marker}",
                                    created_by=user, chunk_count=1)
    KnowledgeChunkFactory(source=source, content=f"Chunk about durable workflows {marker}")
    SkillFactory(workspace=workspace, name=f"skill-{workspace.slug}", description=f"Skill {marker}",
                 triggers=["durable"], created_by=user)
    run = run_start(workflow="tests.sequence", input={"steps": 2, "note": marker}, namespace=workspace.namespace,
                    tags=["vip"])
    run_until_settled(run.pk)
    run_start(workflow="tests.signal", input={"note": marker}, namespace=workspace.namespace)
    schedule_save(key=f"sched-{workspace.slug}", workflow="tests.sequence", namespace=workspace.namespace,
                  input={"note": marker}, every_seconds=3600)
    version = make_workflow_world(workspace, user, marker)
    make_evals_world(workspace, user, marker, version)
    make_evolution_world(workspace, user, marker, version)
    return marker


def make_workflow_world(workspace, user, marker):
    """A workflow with a version, an invocation (queued: no worker runs it) with a node and a message, and an
    MCP server with a version, a tool and `user`'s config with a secret."""
    from workflows.models import McpServer, McpServerVersion, McpTool, Message, NodeInvocation, UserServerConfig
    from workflows.services import invocation_start, workflow_create, workflow_version_create

    workflow = workflow_create(workspace=workspace, name=f"flow-{workspace.slug}", description=f"Flow {marker}",
                               owner=user)
    version, _ = workflow_version_create(workflow=workflow, created_by=user, commit_message=f"First {marker}",
                                         dsl=solo(f"Answer {marker}"))
    invocation = invocation_start(version=version, input={"note": marker}, user=user)
    node = NodeInvocation.objects.create(workflow_invocation=invocation, seq=1, node_id="solo",
                                         output=f"Output {marker}")
    Message.objects.create(workflow_invocation=invocation, node_invocation=node, seq=1, to_node_id="solo",
                           role=Message.Role.USER, payload={"text": marker})
    server = McpServer.objects.create(workspace=workspace, slug=f"mcp-{workspace.slug}", display_name="Lookup",
                                      description=f"Server {marker}", url="https://mcp.example.test/mcp")
    server_version = McpServerVersion.objects.create(server=server, version="1.0", manifest_hash=f"{server.pk:064x}")
    McpTool.objects.create(server_version=server_version, name="lookup", description=f"Tool {marker}")
    UserServerConfig.objects.create(user=user, server=server, config={"note": marker},
                                    secrets='{"Authorization": "Bearer world-secret-4417"}')
    return version


def make_evals_world(workspace, user, marker, version):
    """A golden set of the workflow with one item, an eval run of `version` on it driven in-process to its end
    (a result, its invocation), and a promotion recording the version's activation."""
    from durable.inprocess import run_until_settled
    from evals.models import Promotion
    from evals.services import eval_run_start, golden_item_add, golden_set_create
    from workflows.services import workflow_version_activate

    golden = golden_set_create(workspace=workspace, name=f"golden-{workspace.slug}", workflow=version.workflow,
                               description=f"Golden {marker}", graders=[{"kind": "contains"}], created_by=user)
    golden_item_add(golden_set=golden, input={"text": f"Question {marker}"}, expected_output=f"Answer {marker}",
                    tags=["critical"], metadata={"note": marker})
    run = eval_run_start(golden_set=golden, version=version, user=user)
    run_until_settled(run.durable_run_id, max_wait=30)
    workflow_version_activate(version=version)
    Promotion.objects.create(workflow=version.workflow, workflow_version=version, golden_set=golden,
                             action=Promotion.Action.PROMOTE, evidence={"first_version": True, "note": marker},
                             decided_by=user)


def make_evolution_world(workspace, user, marker, version):
    """An evolution run of the workflow from `version` (its durable run left pending: no worker runs it) on a golden
    set of its own, with generation 0 written as the run writes it: the base and a prompt mutant of it, each an
    individual (the base with the evals world's eval run), the mutant the best so far."""
    from evals.models import EvalRun
    from evals.services import golden_item_add, golden_set_create
    from evolution.models import EvolutionRun, Generation, Individual
    from evolution.services import evolution_start
    from workflows.services import workflow_version_create

    golden = golden_set_create(workspace=workspace, name=f"evolution-{workspace.slug}", workflow=version.workflow,
                               description=f"Evolution golden {marker}", graders=[{"kind": "contains"}],
                               created_by=user)
    golden_item_add(golden_set=golden, input={"text": f"Evolve {marker}"}, expected_output=f"Evolved {marker}")
    run = evolution_start(workflow=version.workflow, golden_set=golden, base_version=version, goal=f"Goal {marker}",
                          config={"population": 3, "generations": 1, "seed": 1}, user=user)
    mutant, _ = workflow_version_create(workflow=version.workflow, operation="mutation", parents=(version,),
                                        generation=0, commit_message=f"Mutant {marker}", created_by=user,
                                        dsl=solo(f"Answer {marker} in one sentence."))
    generation = Generation.objects.create(evolution_run=run, number=0, best_workflow_version=mutant, stats={
        "best": 60.0, "avg": 55.0, "worst": 50.0, "stddev": 5.0, "improvement": None, "members": 2, "note": marker})
    Individual.objects.create(evolution_run=run, generation=generation, workflow_version=version, kind="base",
                              eval_run=EvalRun.objects.filter(workflow_version=version).first(),
                              note=f"Base {marker}", fitness=50.0, avg_score=0.5, survived=True)
    Individual.objects.create(evolution_run=run, generation=generation, workflow_version=mutant, kind="prompt",
                              note=f"Mutant {marker}", fitness=60.0, avg_score=0.6, survived=True)
    EvolutionRun.objects.filter(pk=run.pk).update(best_version=mutant, base_fitness=50.0, best_fitness=60.0,
                                                  generations_done=1, evaluations=2)


@pytest.fixture
def world(workspace, other_workspace, owner, outsider):
    """The owner's workspace and the outsider's, each with one object of every kind."""
    return {"mine": make_world(workspace, owner), "theirs": make_world(other_workspace, outsider)}


@pytest.fixture
def object_ids(world, api_as):
    """For a user: {collection path: the id of the first object they can list there}."""

    def ids_for(user) -> dict[str, str]:
        from tests.api.schema import collections

        client = api_as(user)
        found = {}
        for path in collections():
            response = client.get(path)
            if response.status_code != 200:
                continue
            rows = response.json()
            rows = rows["results"] if isinstance(rows, dict) and "results" in rows else rows
            if isinstance(rows, list) and rows:
                found[path] = str(rows[0]["id"])
        return found

    return ids_for
