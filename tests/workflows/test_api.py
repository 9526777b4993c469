"""The workflows API: workflows, versions (DSL, dedupe, import/export, diff, activate), invocations
(start, decide, cancel, messages) and the MCP registry reads, scoped to the caller's workspaces."""

import json
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.builders import graph, node
from tests.factories import MembershipFactory, UserFactory
from workflows.api import views
from workflows.models import (
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    NodeInvocation,
    UserServerConfig,
    Workflow,
    WorkflowInvocation,
    WorkflowVersion,
)
from workflows.services import invocation_start, workflow_create, workflow_version_activate, workflow_version_create
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

WORKFLOWS = "/api/workflows/"
VERSIONS = "/api/workflow-versions/"
ACTIVATIONS = "/api/workflow-activations/"
INVOCATIONS = "/api/workflow-invocations/"
SERVERS = "/api/mcp/servers/"
TOOLS = "/api/mcp/tools/"
CONFIGS = "/api/mcp/configs/"
SEED_FILE = Path(__file__).parent / "data" / "seed_export.json"
MODEL = "offline-directive-v1"
SECRET = "Bearer tok-91c0-never-in-a-response"


def flow(**changes) -> dict:
    """A two-node workflow the offline model runs."""
    document = graph("planner", node("planner", prompt="Plan.", model=MODEL, tools=["knowledge_search"],
                                     handoffs=["writer"]),
                     node("writer", prompt="Write.", model=MODEL, handoffs=["end"]))
    document.update(changes)
    return document


def make_workflow(workspace, name="flow", dsl=None):
    workflow = workflow_create(workspace=workspace, name=name)
    version, _ = workflow_version_create(workflow=workflow, dsl=dsl or flow())
    return workflow, version


def error_of(response, status=400) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:2000])
    return response.json()["error"]


def _count(client, url, params=None):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params or {})
    assert response.status_code == 200, response.json()
    return len(queries), response


# ---------------------------------------------------------------------------------------- workflows


def test_create_list_search_rename_and_delete_a_workflow(api_as, owner, workspace):
    client = api_as(owner)
    created = client.post(WORKFLOWS, {"workspace": workspace.pk, "name": "Support triage",
                                      "description": "Routes tickets."})
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["owner"] == "owner" and body["version_count"] == 0 and body["active_version"] is None
    assert body["versions_url"].endswith(f"{VERSIONS}?workflow={body['id']}")
    client.post(WORKFLOWS, {"workspace": workspace.pk, "name": "Release notes"})
    assert [w["name"] for w in client.get(WORKFLOWS, {"q": "triage"}).json()["results"]] == ["Support triage"]
    assert len(client.get(WORKFLOWS, {"workspace": workspace.pk}).json()["results"]) == 2
    duplicate = client.post(WORKFLOWS, {"workspace": workspace.pk, "name": "Support triage"})
    assert "name" in error_of(duplicate)["fields"]
    renamed = client.patch(f"{WORKFLOWS}{body['id']}/", {"name": "Triage", "workspace": 987654})
    assert renamed.status_code == 200 and renamed.json()["name"] == "Triage"
    assert renamed.json()["workspace"] == workspace.pk  # a workflow never moves
    assert "name" in error_of(client.patch(f"{WORKFLOWS}{body['id']}/", {"name": "Release notes"}))["fields"]
    assert client.delete(f"{WORKFLOWS}{body['id']}/").status_code == 204
    assert not Workflow.objects.filter(pk=body["id"]).exists()


def test_a_workflow_with_invocations_cannot_be_deleted(api_as, owner, workspace):
    workflow, version = make_workflow(workspace)
    invocation_start(version=version, input={"text": "x"})
    error = error_of(api_as(owner).delete(f"{WORKFLOWS}{workflow.pk}/"), 409)
    assert "has invocations" in error["message"]
    assert Workflow.objects.filter(pk=workflow.pk).exists()


@pytest.mark.parametrize(("payload", "field"), [
    ({"name": ""}, "name"), ({"name": "x" * 201}, "name"), ({"name": ["a"]}, "name"),
    ({"name": "a", "workspace": "abc"}, "workspace"), ({"name": "a", "workspace": 10**30}, "workspace"),
    ({"name": "a", "workspace": {"id": 1}}, "workspace"), ({"name": "a", "description": {"x": 1}}, "description"),
])
def test_bad_workflow_input_is_400_naming_the_field(api_as, owner, workspace, payload, field):
    body = {"workspace": workspace.pk, **payload}
    assert field in error_of(api_as(owner).post(WORKFLOWS, body, format="json"))["fields"]


# ---------------------------------------------------------------------------------------- scoping


@pytest.fixture
def theirs(other_workspace, outsider):
    """The outsider's workflow, version, invocation (with a node and a message) and MCP server."""
    workflow, version = make_workflow(other_workspace, name="globex flow")
    invocation = invocation_start(version=version, input={"text": "globex secret"})
    NodeInvocation.objects.create(workflow_invocation=invocation, seq=1, node_id="planner", output="globex output")
    Message.objects.create(workflow_invocation=invocation, seq=1, role="user", payload={"text": "globex secret"})
    server = McpServer.objects.create(workspace=other_workspace, slug="globex", display_name="Globex",
                                      url="https://mcp.example.test/mcp")
    server_version = McpServerVersion.objects.create(server=server, manifest_hash="a" * 64)
    tool = McpTool.objects.create(server_version=server_version, name="lookup")
    config = UserServerConfig.objects.create(user=outsider, server=server, secrets=SECRET)
    return {"workflow": workflow, "version": version, "invocation": invocation, "server": server, "tool": tool,
            "config": config}


def test_another_workspaces_rows_are_404_and_never_listed(api_as, owner, workspace, theirs):
    client = api_as(owner)
    _, mine = make_workflow(workspace)
    w, v, i = theirs["workflow"].pk, theirs["version"].pk, theirs["invocation"].pk
    for method, url in [
        ("get", f"{WORKFLOWS}{w}/"), ("patch", f"{WORKFLOWS}{w}/"), ("delete", f"{WORKFLOWS}{w}/"),
        ("post", f"{WORKFLOWS}{w}/versions/"), ("get", f"{VERSIONS}{v}/"), ("get", f"{VERSIONS}{v}/export/"),
        ("get", f"{VERSIONS}{v}/diff/?against={mine.pk}"), ("post", f"{VERSIONS}{v}/activate/"),
        ("post", f"{VERSIONS}{v}/invoke/"), ("get", f"{INVOCATIONS}{i}/"), ("get", f"{INVOCATIONS}{i}/messages/"),
        ("post", f"{INVOCATIONS}{i}/approve/"), ("post", f"{INVOCATIONS}{i}/reject/"),
        ("post", f"{INVOCATIONS}{i}/cancel/"), ("get", f"{SERVERS}{theirs['server'].pk}/"),
        ("get", f"{TOOLS}{theirs['tool'].pk}/"), ("get", f"{CONFIGS}{theirs['config'].pk}/"),
    ]:
        response = getattr(client, method)(url, {"name": "mine now", "dsl": flow()}, format="json") \
            if method in ("post", "patch") else getattr(client, method)(url)
        assert error_of(response, 404)["code"] == "not_found", url
    for url in (WORKFLOWS, VERSIONS, INVOCATIONS, SERVERS, TOOLS, CONFIGS):
        assert "globex" not in client.get(url).content.decode().lower(), url
    # naming their rows in a filter, a body or a diff is "not a valid choice", like a missing id
    for url, params in [(VERSIONS, {"workflow": w}), (VERSIONS, {"parent": v}), (INVOCATIONS, {"version": v}),
                        (INVOCATIONS, {"workflow": w}), (TOOLS, {"server": theirs["server"].pk}),
                        (WORKFLOWS, {"workspace": theirs["workflow"].workspace_id})]:
        assert list(error_of(client.get(url, params))["fields"]) == list(params), (url, params)
    assert "against" in error_of(client.get(f"{VERSIONS}{mine.pk}/diff/", {"against": v}))["fields"]
    assert "workspace" in error_of(client.post(WORKFLOWS, {"workspace": theirs["workflow"].workspace_id,
                                                           "name": "x"}))["fields"]
    assert "workspace" in error_of(client.post(f"{WORKFLOWS}import/", {
        "workspace": theirs["workflow"].workspace_id, "dsl": flow()}, format="json"))["fields"]
    assert theirs["workflow"].versions.count() == 1
    assert theirs["invocation"].__class__.objects.get(pk=i).status == "queued"


@pytest.mark.parametrize("suffix", ["abc", "99999999999999999999", "-1", "1.5", "%20"])
def test_a_malformed_or_huge_id_is_404(api_as, owner, suffix):
    client = api_as(owner)
    for collection in (WORKFLOWS, VERSIONS, INVOCATIONS, SERVERS, TOOLS, CONFIGS):
        assert client.get(f"{collection}{suffix}/").status_code == 404, collection
    assert client.post(f"{VERSIONS}{suffix}/invoke/", {}, format="json").status_code == 404


def test_any_member_writes_and_the_write_role_is_checked_on_every_write(api_as, workspace, monkeypatch):
    """As in knowledge and durable, any member of a workspace may write; every write path checks the
    viewsets' `write_roles`, so narrowing them refuses a plain member everywhere (403), reads still allowed."""
    member = UserFactory(username="plain")
    MembershipFactory(user=member, workspace=workspace, role=Membership.Role.MEMBER)
    client = api_as(member)
    assert client.post(WORKFLOWS, {"workspace": workspace.pk, "name": "by a member"}).status_code == 201
    workflow, version = make_workflow(workspace)
    invocation = invocation_start(version=version, input={"text": "x"})
    for viewset in (views.WorkflowViewSet, views.WorkflowVersionViewSet, views.WorkflowInvocationViewSet):
        monkeypatch.setattr(viewset, "write_roles", Membership.Role.MANAGERS)
    writes = [
        ("post", WORKFLOWS, {"workspace": workspace.pk, "name": "refused"}),
        ("patch", f"{WORKFLOWS}{workflow.pk}/", {"name": "refused"}),
        ("delete", f"{WORKFLOWS}{workflow.pk}/", None),
        ("post", f"{WORKFLOWS}{workflow.pk}/versions/", {"dsl": flow(entryNodeId="writer")}),
        ("post", f"{WORKFLOWS}import/", {"workspace": workspace.pk, "dsl": flow(entryNodeId="writer")}),
        ("post", f"{VERSIONS}{version.pk}/activate/", None),
        ("post", f"{VERSIONS}{version.pk}/invoke/", {"input": "x"}),
        ("post", f"{INVOCATIONS}{invocation.pk}/approve/", {}),
        ("post", f"{INVOCATIONS}{invocation.pk}/reject/", {}),
        ("post", f"{INVOCATIONS}{invocation.pk}/cancel/", {}),
    ]
    for method, url, body in writes:
        response = getattr(client, method)(url, body, format="json")
        assert error_of(response, 403)["code"] == "permission_denied", url
    for url in (f"{WORKFLOWS}{workflow.pk}/", f"{VERSIONS}{version.pk}/", f"{INVOCATIONS}{invocation.pk}/"):
        assert client.get(url).status_code == 200
    assert Workflow.objects.get(pk=workflow.pk).name == "flow" and workflow.versions.count() == 1
    assert WorkflowInvocation.objects.get(pk=invocation.pk).status == "queued"
    assert WorkflowVersion.objects.get(pk=version.pk).status == "candidate"


# ----------------------------------------------------------------------------------------- versions


def test_posting_a_dsl_creates_a_version_and_the_same_dsl_returns_it(api_as, owner, workspace):
    client = api_as(owner)
    workflow = workflow_create(workspace=workspace, name="flow")
    url = f"{WORKFLOWS}{workflow.pk}/versions/"
    first = client.post(url, {"dsl": flow(), "commit_message": "first"}, format="json")
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["created"] is True and body["operation"] == "init" and body["commit_message"] == "first"
    assert [n["node_id"] for n in body["nodes"]] == ["planner", "writer"]
    assert body["nodes"][0]["tools"] == [{"kind": "code", "name": "knowledge_search"}]
    assert body["dsl"]["entryNodeId"] == "planner" and body["unresolved_tools"] == []
    # the same workflow with its nodes and lists in another order is the same version
    reordered = flow()
    reordered["nodes"].reverse()
    again = client.post(url, {"dsl": reordered}, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"] and again.json()["created"] is False
    edited = flow()
    edited["nodes"][1]["systemPrompt"] = "Write briefly."
    child = client.post(url, {"dsl": edited, "parents": [body["id"]]}, format="json").json()
    assert child["operation"] == "manual" and child["parent1"] == body["id"] and child["parent2"] is None
    assert child["parent1_url"].endswith(f"{VERSIONS}{body['id']}/")
    children = client.get(body["children_url"]).json()["results"]
    assert [v["id"] for v in children] == [child["id"]]
    assert client.get(WORKFLOWS + f"{workflow.pk}/").json()["version_count"] == 2
    listed = client.get(VERSIONS, {"workflow": workflow.pk, "operation": "manual"}).json()["results"]
    assert [v["id"] for v in listed] == [child["id"]] and "dsl" not in listed[0]
    assert client.get(VERSIONS, {"status": "active", "workflow": workflow.pk}).json()["results"] == []


def test_a_dsl_error_is_a_400_naming_the_node_and_the_field(api_as, owner, workspace):
    workflow = workflow_create(workspace=workspace, name="flow")
    bad = flow()
    bad["nodes"][0]["handOffs"] = ["ghost"]
    bad["nodes"][1]["maxSteps"] = 500
    error = error_of(api_as(owner).post(f"{WORKFLOWS}{workflow.pk}/versions/", {"dsl": bad}, format="json"))
    assert error["fields"]["dsl"]["nodes[planner].handOffs"] == ["unknown hand-off target 'ghost'"]
    assert "nodes[writer].maxSteps" in error["fields"]["dsl"]
    assert "dsl.nodes[planner].handOffs: unknown hand-off target 'ghost'" in error["message"]
    assert not workflow.versions.exists()


@pytest.mark.parametrize(("dsl", "path"), [
    ("not a document", None),
    ([flow()], None),
    ({"entryNodeId": "a", "nodes": "a"}, "nodes"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "waitFor": 5, "waitingFor": ["a"]}]}, "nodes[a].waitFor"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m", "handOffs": "end"}]}, "nodes[a].handOffs"),
    ({"entryNodeId": "a" * 300, "nodes": [{"nodeId": "a" * 300, "gatewayModelId": "m"}]}, "nodes[0].nodeId"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m" * 300}]}, "nodes[a].gatewayModelId"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m", "maxSteps": 10**40}]}, "nodes[a].maxSteps"),
    ({"entryNodeId": 5, "nodes": [{"nodeId": ["a"], "gatewayModelId": {"x": 1}}]}, "entryNodeId"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m", "description": 5}]}, "nodes[a].description"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m", "requiresApproval": "no"}]},
     "nodes[a].requiresApproval"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m"}], "outputSchema": [1]}, "outputSchema"),
    ({"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m"}], "inputSchema": {"type": "strng"}},
     "inputSchema"),
])
def test_hostile_dsl_documents_are_400_naming_the_path(api_as, owner, workspace, dsl, path):
    workflow = workflow_create(workspace=workspace, name="flow")
    error = error_of(api_as(owner).post(f"{WORKFLOWS}{workflow.pk}/versions/", {"dsl": dsl}, format="json"))
    assert "dsl" in error["fields"]
    if path is not None:
        assert path in error["fields"]["dsl"], error


def test_an_infinite_number_or_a_foreign_parent_is_400(api_as, owner, workspace, other_workspace):
    client = api_as(owner)
    workflow = workflow_create(workspace=workspace, name="flow")
    _, elsewhere = make_workflow(workspace, name="other flow")
    _, foreign = make_workflow(other_workspace, name="foreign flow")
    url = f"{WORKFLOWS}{workflow.pk}/versions/"
    raw = json.dumps({"dsl": flow()}).replace('"maxSteps": 5', '"maxSteps": 1e999', 1)
    error = error_of(client.post(url, raw, content_type="application/json"))
    assert error["fields"] == {"dsl": ["Value must be valid JSON."]}
    for parents in ([elsewhere.pk], [foreign.pk], [1, 2, 3], ["x"]):
        assert "parents" in error_of(client.post(url, {"dsl": flow(), "parents": parents}, format="json"))["fields"]
    assert not workflow.versions.exists()


def _export_command(version) -> dict:
    out = StringIO()
    call_command("workflow", "export", str(version.pk), stdout=out)
    return json.loads(out.getvalue())


def test_import_and_export_round_trip(api_as, owner, workspace):
    client = api_as(owner)
    document = json.loads(SEED_FILE.read_text())
    imported = client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "workflow": "research",
                                                   "dsl": document}, format="json")
    assert imported.status_code == 201, imported.json()
    body = imported.json()
    assert body["workflow_name"] == "research"
    assert body["unresolved_tools"] == ["researcher.browserUse", "researcher.csvReader", "researcher.tavily"]
    exported = client.get(f"{VERSIONS}{body['id']}/export/").json()
    assert exported == _export_command(WorkflowVersion.objects.get(pk=body["id"])) == body["dsl"]
    again = client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "workflow": "research",
                                                "dsl": exported}, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"] and again.json()["created"] is False
    # without a name: the document's own name, else one derived from its hash (the same on every import)
    unnamed = client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "dsl": document}, format="json").json()
    assert unnamed["workflow_name"].startswith("imported-") and unnamed["created"] is True
    assert client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "dsl": document},
                       format="json").json()["id"] == unnamed["id"]
    named = client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "dsl": {**flow(), "name": "writer"}},
                        format="json").json()
    assert named["workflow_name"] == "writer"
    bad = client.post(f"{WORKFLOWS}import/", {"workspace": workspace.pk, "workflow": "broken",
                                              "dsl": flow(entryNodeId="ghost")}, format="json")
    assert error_of(bad)["fields"]["dsl"] == {"entryNodeId": ["names no node: 'ghost'"]}
    assert not Workflow.objects.filter(name="broken").exists()  # no empty workflow left behind


def test_diff_against_another_version(api_as, owner, workspace):
    client = api_as(owner)
    workflow, old = make_workflow(workspace)
    changed = flow()
    changed["nodes"][0]["systemPrompt"] = "Plan in three steps."
    changed["nodes"][1]["codeTools"] = ["skill_load"]
    new, _ = workflow_version_create(workflow=workflow, dsl=changed, parents=(old,))
    diff = client.get(f"{VERSIONS}{new.pk}/diff/", {"against": old.pk})
    assert diff.status_code == 200, diff.json()
    body = diff.json()
    assert body["from"] == old.dsl_hash and body["to"] == new.dsl_hash and body["same"] is False
    assert body["nodes"]["planner"]["fields"] == ["systemPrompt"]
    assert "+Plan in three steps." in body["nodes"]["planner"]["prompt_diff"]
    assert body["nodes"]["writer"] == {"change": "changed", "fields": ["codeTools"], "prompt_diff": []}
    assert any(line.startswith("+") and "skill_load" in line for line in body["dsl_diff"])
    assert client.get(f"{VERSIONS}{new.pk}/diff/", {"against": new.pk}).json()["same"] is True
    for against in ("", "abc", "99999999999", "9999999999", "999999", "1.5", "-1"):
        assert "against" in error_of(client.get(f"{VERSIONS}{new.pk}/diff/", {"against": against}))["fields"]


def test_activate_archives_the_version_active_before(api_as, owner, workspace):
    client = api_as(owner)
    workflow, first = make_workflow(workspace)
    second, _ = workflow_version_create(workflow=workflow, dsl=flow(entryNodeId="writer"))
    assert client.post(f"{VERSIONS}{first.pk}/activate/").json()["status"] == "active"
    assert client.get(f"{WORKFLOWS}{workflow.pk}/").json()["active_version"] == first.pk
    assert client.post(f"{VERSIONS}{second.pk}/activate/").json()["status"] == "active"
    assert client.get(f"{VERSIONS}{first.pk}/").json()["status"] == "archived"
    assert [v["id"] for v in client.get(VERSIONS, {"status": "active"}).json()["results"]] == [second.pk]
    history = client.get(client.get(f"{WORKFLOWS}{workflow.pk}/").json()["activations_url"]).json()["results"]
    assert [(row["workflow_version"], row["previous_version"], row["kind"], row["created_by"]) for row in history] == [
        (second.pk, first.pk, "activate", "owner"), (first.pk, None, "activate", "owner")]
    assert history[0]["parent"] == history[1]["id"]


# -------------------------------------------------------------------------------------- invocations


def test_invoking_a_version_with_missing_tools_and_models_is_refused_naming_each(api_as, owner, workspace, settings):
    # with real providers, a prefix no provider serves is a missing model (offline, the offline model answers it)
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    dsl = graph("planner", node("planner", model="nosuchprovider#x", tools=["tavily"], handoffs=["writer"]),
                node("writer", model=MODEL, mcp=["browser"]))
    _, version = make_workflow(workspace, dsl=dsl)
    error = error_of(api_as(owner).post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"text": "hi"}}, format="json"))
    tools = " ".join(error["fields"]["tools"])
    assert "planner.tavily" in tools and "writer.browser" in tools
    assert len(error["fields"]["models"]) == 1 and "planner.nosuchprovider#x" in error["fields"]["models"][0]
    assert not WorkflowInvocation.objects.exists()


def test_invoking_a_version_answers_202_with_a_queued_invocation_and_its_durable_run(api_as, owner, workspace):
    client = api_as(owner)
    workflow, version = make_workflow(workspace)
    response = client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"text": "How do runs resume?"},
                                                                "node_budget": 3, "usd_budget": "0.25"},
                           format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["input"] == {"text": "How do runs resume?"} and body["nodes"] == []
    assert body["workflow"] == workflow.pk and body["workflow_version"] == version.pk and body["node_budget"] == 3
    assert Decimal(body["usd_budget"]) == Decimal("0.25") and body["created_by"] == "owner"
    assert body["durable_run"] == f"wfi-{body['id']}"
    assert body["durable_run_url"].endswith(f"/api/durable/runs/wfi-{body['id']}/")
    run = client.get(body["durable_run_url"])
    assert run.status_code == 200 and run.json()["workflow"] == "workflows.invoke"
    for params in ({"workflow": workflow.pk}, {"version": version.pk}, {"status": "queued"}, {}):
        assert [i["id"] for i in client.get(INVOCATIONS, params).json()["results"]] == [body["id"]], params
    assert client.get(INVOCATIONS, {"status": ["completed", "failed"]}).json()["results"] == []
    # any JSON is an input
    for value in ("plain text", [1, 2], None, 7):
        assert client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": value}, format="json").status_code == 202


@pytest.mark.parametrize(("payload", "field"), [
    ({"node_budget": 0}, "node_budget"), ({"node_budget": 10**30}, "node_budget"),
    ({"node_budget": "x"}, "node_budget"), ({"node_budget": 2.5}, "node_budget"), ({"usd_budget": -1}, "usd_budget"),
    ({"usd_budget": "1e400"}, "usd_budget"),
    ({"usd_budget": "NaN"}, "usd_budget"), ({"usd_budget": {"a": 1}}, "usd_budget"),
    ({"usd_budget": 2_000_000}, "usd_budget"),
])
def test_bad_invocation_input_is_400_naming_the_field(api_as, owner, workspace, payload, field):
    _, version = make_workflow(workspace)
    error = error_of(api_as(owner).post(f"{VERSIONS}{version.pk}/invoke/", payload, format="json"))
    assert list(error["fields"]) == [field]
    assert not WorkflowInvocation.objects.exists()


SCHEMA = {"type": "object", "required": ["text"],
          "properties": {"text": {"type": "string", "maxLength": 20}, "n": {"type": "integer", "minimum": 1}}}


def test_an_input_its_version_schema_refuses_is_400_naming_each_place(api_as, owner, workspace):
    """The version's inputSchema binds the API as it binds the admin's Run form: nothing starts."""
    client = api_as(owner)
    _, version = make_workflow(workspace, dsl=flow(inputSchema=SCHEMA))
    error = error_of(client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"n": 0}}, format="json"))
    assert list(error["fields"]) == ["input"]
    problems = error["fields"]["input"]
    assert "(the input): 'text' is a required property" in problems and "n: 0 is less than the minimum of 1" in problems
    for value in ("plain text", {"text": "x" * 21}, None):
        assert error_of(client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": value}, format="json"))["fields"]
    assert not WorkflowInvocation.objects.exists()
    assert client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"text": "hi", "n": 2}},
                       format="json").status_code == 202


def test_an_input_schema_pattern_that_backtracks_refuses_the_input_in_bounded_time(api_as, owner, workspace,
                                                                                  monkeypatch):
    from workflows import services

    monkeypatch.setattr(services, "INPUT_PATTERN_TIMEOUT_SECONDS", 0.1)
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(a?){32}a{32}"}}}
    _, version = make_workflow(workspace, dsl=flow(inputSchema=schema))
    error = error_of(api_as(owner).post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"code": ("a" * 31 + "b") * 150}},
                                        format="json"))
    assert error["fields"]["input"] == ["Not checked: a pattern of the input schema the pattern did not finish "
                                        "within 0.1 s."]
    assert not WorkflowInvocation.objects.exists()


def test_an_input_json_cannot_store_is_400_naming_it(api_as, owner, workspace):
    _, version = make_workflow(workspace)
    raw = '{"input": {"n": [1, 1e999]}}'
    error = error_of(api_as(owner).post(f"{VERSIONS}{version.pk}/invoke/", raw, content_type="application/json"))
    assert error["fields"] == {"input": ["Value must be valid JSON."]}
    assert not WorkflowInvocation.objects.exists()


def test_approve_or_reject_with_no_waiting_node_is_409_and_cancel_ends_it(api_as, owner, workspace):
    client = api_as(owner)
    _, version = make_workflow(workspace)
    invocation = invocation_start(version=version, input={"text": "x"})
    for decision in ("approve", "reject"):
        error = error_of(client.post(f"{INVOCATIONS}{invocation.pk}/{decision}/", {"comment": "ok"}), 409)
        assert "waiting for approval" in error["message"]
    assert "node_seq" in error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/", {"node_seq": -1}))["fields"]
    assert "comment" in error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/",
                                             {"comment": "x" * 10_001}))["fields"]
    cancelled = client.post(f"{INVOCATIONS}{invocation.pk}/cancel/", {"reason": "not needed"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"] == "not needed"
    again = error_of(client.post(f"{INVOCATIONS}{invocation.pk}/cancel/"), 409)
    assert "is cancelled" in again["message"]
    assert error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/"), 409)


def test_approve_a_waiting_node_through_the_api(api_as, owner, workspace, settle):
    client = api_as(owner)
    dsl = graph("draft", node("draft", model=MODEL, approval=True, handoffs=["publish"]),
                node("publish", model=MODEL))
    _, version = make_workflow(workspace, dsl=dsl)
    started = client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"text": "announce"}}, format="json").json()
    invocation = settle(WorkflowInvocation.objects.get(pk=started["id"]))
    assert invocation.status == "waiting", invocation.error
    detail = client.get(f"{INVOCATIONS}{invocation.pk}/").json()
    assert [(n["seq"], n["node_id"], n["status"]) for n in detail["nodes"]] == [(1, "draft", "waiting")]
    assert "node_seq" in error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/", {"node_seq": "x"}))["fields"]
    assert error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/", {"node_seq": 2}), 409)
    approved = client.post(f"{INVOCATIONS}{invocation.pk}/approve/", {"comment": "ship it", "node_seq": 1})
    assert approved.status_code == 200, approved.json()
    assert approved.json()["nodes"][0]["approval"]["sent"]["comment"] == "ship it"
    assert error_of(client.post(f"{INVOCATIONS}{invocation.pk}/reject/"), 409)  # one decision per node
    invocation = settle(invocation)
    assert invocation.status == "completed", invocation.error
    detail = client.get(f"{INVOCATIONS}{invocation.pk}/").json()
    assert [n["node_id"] for n in detail["nodes"]] == ["draft", "publish"] and detail["output"]


def test_revise_a_waiting_node_through_the_api_needs_a_comment_and_the_node_answers_again(api_as, owner, workspace,
                                                                                          settle):
    client = api_as(owner)
    _, version = make_workflow(workspace, dsl=graph("draft", node("draft", model=MODEL, approval=True)))
    started = client.post(f"{VERSIONS}{version.pk}/invoke/", {"input": {"text": "The docs moved. Announce it."}},
                          format="json").json()
    invocation = settle(WorkflowInvocation.objects.get(pk=started["id"]))
    assert invocation.status == "waiting", invocation.error
    assert list(error_of(client.post(f"{INVOCATIONS}{invocation.pk}/revise/", {"comment": " "}))["fields"]) == [
        "comment"]
    revised = client.post(f"{INVOCATIONS}{invocation.pk}/revise/", {"comment": "Say where the docs moved."})
    assert revised.status_code == 200, revised.json()
    assert revised.json()["nodes"][0]["approval"]["sent"]["decision"] == "revise"
    assert error_of(client.post(f"{INVOCATIONS}{invocation.pk}/approve/"), 409)  # that answer took its decision
    invocation = settle(invocation)
    assert invocation.status == "waiting", invocation.error
    detail = client.get(f"{INVOCATIONS}{invocation.pk}/").json()
    assert detail["nodes"][0]["approval"]["revision"] == 1
    assert client.post(f"{INVOCATIONS}{invocation.pk}/approve/").status_code == 200
    assert settle(invocation).status == "completed"


def test_messages_are_paginated_in_seq_order_and_filtered(api_as, owner, workspace):
    client = api_as(owner)
    _, version = make_workflow(workspace)
    invocation = invocation_start(version=version, input={"text": "x"})
    first = NodeInvocation.objects.create(workflow_invocation=invocation, seq=1, node_id="planner")
    second = NodeInvocation.objects.create(workflow_invocation=invocation, seq=2, node_id="writer")
    for seq in (7, 3, 1, 6, 2, 5, 4):
        Message.objects.create(workflow_invocation=invocation, node_invocation=first if seq <= 4 else second, seq=seq,
                               role="assistant" if seq % 2 else "user", from_node_id="planner",
                               payload={"text": f"m{seq}"})
    url = f"{INVOCATIONS}{invocation.pk}/messages/"
    page = client.get(url, {"page_size": 3}).json()
    assert [m["seq"] for m in page["results"]] == [1, 2, 3] and page["results"][0]["node_seq"] == 1
    page = client.get(page["next"]).json()
    assert [m["seq"] for m in page["results"]] == [4, 5, 6]
    assert [m["seq"] for m in client.get(page["next"]).json()["results"]] == [7]
    assert [m["seq"] for m in client.get(url, {"node_seq": 2}).json()["results"]] == [5, 6, 7]
    assert [m["seq"] for m in client.get(url, {"role": "user", "node_seq": 1}).json()["results"]] == [2, 4]
    assert [m["seq"] for m in client.get(url, {"role": ["user", "assistant"]}).json()["results"]] == \
        [1, 2, 3, 4, 5, 6, 7]
    for params, field in [({"role": "boss"}, "role"), ({"node_seq": "x"}, "node_seq"),
                          ({"node_seq": 10**20}, "node_seq"), ({"cursor": "garbage"}, "cursor"),
                          ({"page_size": 0}, "page_size")]:
        assert field in error_of(client.get(url, params))["fields"], params
    # the messages' filters are not the invocation list's: ?status= does not hide the invocation
    assert client.get(url, {"status": "completed"}).status_code == 200
    assert client.get(page["next"].replace(f"/{invocation.pk}/", f"/{invocation.pk + 1000}/")).status_code == 404


# -------------------------------------------------------------------------------------- MCP registry


@pytest.fixture
def registry(workspace, owner, member):
    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://user:hunter2@mcp.example.test:8443/mcp?key=abc")
    old = McpServerVersion.objects.create(server=server, version="0.9", manifest_hash="0" * 64,
                                          status=McpServerVersion.Status.SUPERSEDED)
    McpTool.objects.create(server_version=old, name="legacy")
    active = McpServerVersion.objects.create(server=server, version="1.0", manifest_hash="1" * 64,
                                             capabilities={"tools": {}})
    for name in ("web", "news"):
        McpTool.objects.create(server_version=active, name=name, description=f"Search the {name}.",
                               input_schema={"type": "object"})
    bare = McpServer.objects.create(workspace=workspace, slug="unsynced", display_name="Unsynced",
                                    url="https://mcp.example.test/other")
    mine = UserServerConfig.objects.create(user=owner, server=server, config={"headers": {"X-Team": "a"}},
                                           secrets=json.dumps({"Authorization": SECRET}))
    UserServerConfig.objects.create(user=owner, server=bare, enabled=False)
    UserServerConfig.objects.create(user=member, server=server, secrets=json.dumps({"Authorization": SECRET}))
    return {"server": server, "bare": bare, "config": mine}


def test_mcp_servers_and_tools_are_listed_with_the_active_version(api_as, owner, registry):
    client = api_as(owner)
    servers = {s["slug"]: s for s in client.get(SERVERS).json()["results"]}
    search = servers["search"]
    assert search["active_version"]["version"] == "1.0" and search["active_version"]["status"] == "active"
    assert [t["name"] for t in search["tools"]] == ["news", "web"]
    assert search["url"] == "https://mcp.example.test:8443/mcp"  # no credentials, no query string
    assert servers["unsynced"]["active_version"] is None and servers["unsynced"]["tools"] == []
    assert client.get(f"{SERVERS}{registry['server'].pk}/").json()["tools"] == search["tools"]
    tools = client.get(TOOLS, {"active": "true", "server": registry["server"].pk}).json()["results"]
    assert sorted(t["qualified_name"] for t in tools) == ["search/news", "search/web"]
    assert [t["name"] for t in client.get(TOOLS, {"active": "false"}).json()["results"]] == ["legacy"]


def test_mcp_reads_never_contain_secrets(api_as, owner, member, registry):
    client = api_as(owner)
    configs = client.get(CONFIGS).json()["results"]
    assert {(c["server_slug"], c["has_secrets"], c["enabled"]) for c in configs} == {("search", True, True),
                                                                                    ("unsynced", False, False)}
    assert all("secrets" not in c for c in configs)
    assert client.get(f"{CONFIGS}{registry['config'].pk}/").json()["config"] == {"headers": {"X-Team": "a"}}
    # only the caller's own configs: the member's config of the same server is not theirs to read
    member_config = UserServerConfig.objects.get(user=member)
    assert client.get(f"{CONFIGS}{member_config.pk}/").status_code == 404
    urls = [SERVERS, TOOLS, CONFIGS, f"{SERVERS}{registry['server'].pk}/", f"{CONFIGS}{registry['config'].pk}/"]
    for url in urls:
        for fmt in ("json", "api"):
            text = client.get(url, {"format": fmt}).content.decode()
            assert SECRET not in text and "hunter2" not in text and "fernet:" not in text, url
    assert len(api_as(member).get(CONFIGS).json()["results"]) == 1


def test_a_config_whose_secrets_do_not_decrypt_still_lists(api_as, owner, registry):
    """The list never decrypts the secrets column, so a rotated-away key cannot break it."""
    UserServerConfig.objects.filter(pk=registry["config"].pk).update(secrets="fernet:not-a-token")
    response = api_as(owner).get(CONFIGS)
    assert response.status_code == 200
    assert {c["has_secrets"] for c in response.json()["results"] if c["id"] == registry["config"].pk} == {True}


# ------------------------------------------------------------------------------------ query budgets


def _workflows(workspace, n):
    for _ in range(n):
        workflow, version = make_workflow(workspace, name=f"flow {Workflow.objects.count()}")
        workflow_version_create(workflow=workflow, dsl=flow(entryNodeId="writer"), parents=(version,))


def _activations(workspace, n):
    for _ in range(n):
        workflow_version_activate(version=make_workflow(workspace, name=f"flow {Workflow.objects.count()}")[1])


def _invocations(workspace, n):
    version = WorkflowVersion.objects.filter(workflow__workspace=workspace).first() or make_workflow(workspace)[1]
    for _ in range(n):
        invocation_start(version=version, input={"text": "x"})


def _servers(workspace, n, user):
    for _ in range(n):
        index = McpServer.objects.count()
        server = McpServer.objects.create(workspace=workspace, slug=f"s{index}", url="https://mcp.example.test/")
        version = McpServerVersion.objects.create(server=server, manifest_hash=f"{index:064x}")
        McpTool.objects.bulk_create([McpTool(server_version=version, name=f"t{k}") for k in range(3)])
        UserServerConfig.objects.create(user=user, server=server, secrets="x")


# list url, how to add rows, the most queries it may take (session, scoping, page, prefetches)
LISTS = [(WORKFLOWS, "workflows", 1), (VERSIONS, "workflows", 1), (ACTIVATIONS, "activations", 1),
         (INVOCATIONS, "invocations", 1),
         (SERVERS, "servers", 3), (TOOLS, "servers", 1), (CONFIGS, "servers", 1)]


@pytest.mark.parametrize(("url", "kind", "budget"), LISTS)
def test_list_endpoints_cost_the_same_for_1_and_50_rows(api_as, owner, workspace, url, kind, budget,
                                                        django_assert_max_num_queries):
    client = api_as(owner)
    make = {"workflows": lambda n: _workflows(workspace, n), "invocations": lambda n: _invocations(workspace, n),
            "activations": lambda n: _activations(workspace, n),
            "servers": lambda n: _servers(workspace, n, owner)}[kind]
    make(1)
    one, _ = _count(client, url)
    make(49 if url != VERSIONS else 24)
    many, response = _count(client, url)
    assert len(response.json()["results"]) == 50
    assert many == one
    with django_assert_max_num_queries(budget):
        client.get(url)


def test_details_and_messages_cost_the_same_for_1_and_20_nodes(api_as, owner, workspace,
                                                               django_assert_max_num_queries):
    client = api_as(owner)
    workflow = workflow_create(workspace=workspace, name="wide")
    small, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", model=MODEL)))
    wide_nodes = [node(f"n{k}", model=MODEL, handoffs=[f"n{k + 1}"] if k < 19 else ["end"]) for k in range(20)]
    wide, _ = workflow_version_create(workflow=workflow, dsl=graph("n0", *wide_nodes))
    one_node = invocation_start(version=small, input={"text": "x"})
    many_nodes = invocation_start(version=wide, input={"text": "x"})
    for invocation, count in ((one_node, 1), (many_nodes, 20)):
        for seq in range(1, count + 1):
            row = NodeInvocation.objects.create(workflow_invocation=invocation, seq=seq, node_id=f"n{seq}")
            Message.objects.create(workflow_invocation=invocation, node_invocation=row, seq=seq * 10, role="user")
            Message.objects.create(workflow_invocation=invocation, node_invocation=row, seq=seq * 10 + 1,
                                   role="assistant")
    pairs = [(f"{VERSIONS}{small.pk}/", f"{VERSIONS}{wide.pk}/"),
             (f"{INVOCATIONS}{one_node.pk}/", f"{INVOCATIONS}{many_nodes.pk}/"),
             (f"{INVOCATIONS}{one_node.pk}/messages/", f"{INVOCATIONS}{many_nodes.pk}/messages/"),
             (f"{VERSIONS}{small.pk}/diff/?against={wide.pk}", f"{VERSIONS}{wide.pk}/diff/?against={small.pk}")]
    for few_url, many_url in pairs:
        few, _ = _count(client, few_url)
        many, _ = _count(client, many_url)
        assert few == many, (few_url, few, many)
        with django_assert_max_num_queries(2):  # the row (its joins), then its nodes or its page
            client.get(many_url)
    assert len(client.get(f"{INVOCATIONS}{many_nodes.pk}/").json()["nodes"]) == 20
    assert len(client.get(f"{VERSIONS}{wide.pk}/").json()["nodes"]) == 20


def test_the_schema_documents_the_workflow_endpoints(api_as, owner):
    paths = api_as(owner).get("/api/schema/?format=json").json()["paths"]
    assert {"/api/workflows/", "/api/workflows/{id}/versions/", "/api/workflows/import/",
            "/api/workflow-versions/{id}/diff/", "/api/workflow-versions/{id}/export/",
            "/api/workflow-versions/{id}/invoke/", "/api/workflow-versions/{id}/activate/",
            "/api/workflow-invocations/{id}/messages/", "/api/workflow-invocations/{id}/approve/",
            "/api/workflow-invocations/{id}/reject/", "/api/workflow-invocations/{id}/cancel/",
            "/api/mcp/servers/", "/api/mcp/tools/", "/api/mcp/configs/"} <= set(paths)
    assert {p["name"] for p in paths["/api/workflow-invocations/{id}/messages/"]["get"]["parameters"]} >= {
        "node_seq", "role", "cursor"}
