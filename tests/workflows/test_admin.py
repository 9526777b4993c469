"""The workflows admin: what an operator sees of versions (graph, nodes, genealogy) and invocations
(timeline, messages, approvals, cancel), the read-only history admins, the MCP registry, and the
guarantees around them: workspace scope, escaped user text, write-only secrets, query budgets."""

import json
import re
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.files.base import ContentFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from config.display import pretty_json
from durable import services
from durable.inprocess import run_until_settled
from durable.models import BufferedSignal, DurableRun
from tests.admin_users import admin_staff, client_of
from tests.factories import MembershipFactory
from tests.guards import finishes_within
from tests.workflows.test_dsl import SEED_EXPORT
from workflows import graph
from workflows.models import (
    ContextEntry,
    LlmCall,
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    NodeInvocation,
    UserServerConfig,
    WorkflowInvocation,
    WorkflowVersion,
)
from workflows.services import invocation_start, workflow_create, workflow_version_create

pytestmark = pytest.mark.django_db

XSS_ID = '<script>alert("id")</script>'
XSS_PROMPT = '<img src=x onerror=alert("prompt")>'


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings, tmp_path):
    """Runs are driven in-process here (run_until_settled); blobs go to a temporary media root."""
    settings.DURABLE_DISPATCH_ENABLED = False
    settings.MEDIA_ROOT = str(tmp_path / "media")


def staff_user(username: str, workspace, *, codenames=None):
    """A staff member of `workspace` with the workflows app's permissions (`codenames` to narrow them)."""
    return admin_staff(username, workspace, apps=("workflows",), codenames=codenames)


@pytest.fixture
def staff(workspace):
    return staff_user("acme-staff", workspace)


@pytest.fixture
def staff_client(staff):
    return client_of(staff)


@pytest.fixture
def outsider_client(other_workspace):
    return client_of(staff_user("globex-staff", other_workspace))


@pytest.fixture
def workflow(workspace):
    return workflow_create(workspace=workspace, name="research")


def cyclic_dsl(**changes) -> dict:
    """An orchestrator loop with every kind of edge: conditional, parallel, waitFor, a cycle, `end`."""
    def node(node_id, **fields):
        return {"nodeId": node_id, "gatewayModelId": "gpt-4.1-mini", "systemPrompt": f"You are {node_id}.", **fields}

    document = {"entryNodeId": "orchestrator", "nodes": [
        node("orchestrator", handOffs=["search", "end"], handOffType="conditional", codeTools=["knowledge_search"]),
        node("search", handOffs=["left", "right"], handOffType="parallel", mcpTools=["tavily"]),
        node("left", handOffs=["merge"]),
        node("right", handOffs=["merge"]),
        node("merge", waitFor=["left", "right"], handOffs=["orchestrator"], requiresApproval=True),
    ]}
    document.update(changes)
    return document


def change_url(model: str, pk) -> str:
    return reverse(f"admin:workflows_{model}_change", args=[pk])


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def make_invocation(version, *, status="running", started=None, ended=None, **fields) -> WorkflowInvocation:
    return WorkflowInvocation.objects.create(
        workspace=version.workflow.workspace, workflow_version=version, status=status, usd_budget=Decimal("1"),
        started_at=started, ended_at=ended, **fields)


def make_node(invocation, seq, node_id, *, status="completed", started=None, ended=None, **fields) -> NodeInvocation:
    return NodeInvocation.objects.create(workflow_invocation=invocation, seq=seq, node_id=node_id, status=status,
                                         started_at=started, ended_at=ended, **fields)


def make_message(invocation, node, seq, role, payload, *, source="", target="") -> Message:
    return Message.objects.create(workflow_invocation=invocation, node_invocation=node, seq=seq, role=role,
                                  payload=payload, from_node_id=source, to_node_id=target)


def waiting_invocation(version, *, run_id="wfi-test-1"):
    """An invocation whose node #1 waits for approval on a real (pending) durable run of its workspace."""
    services.run_create(run_id=run_id, workflow="workflows.invoke", input={}, dispatch=False,
                        namespace=version.workflow.workspace.namespace)
    invocation = make_invocation(version, status="waiting", started=timezone.now(), durable_run_id=run_id)
    node = make_node(invocation, 1, "merge", status="waiting", started=timezone.now(), output="draft answer",
                     approval={"pending": True, "run_id": run_id, "signal": "approval:1"})
    return invocation, node


# ----------------------------------------------------------------------------------------- the lists

def test_the_workflow_list_and_its_workspace_filter_show_only_the_users_workspaces(client, workspace,
                                                                                      other_workspace):
    workflow_create(workspace=workspace, name="acme-research")
    workflow_create(workspace=other_workspace, name="globex-research")
    staff = get_user_model().objects.create_user("staff", password="x", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    MembershipFactory(user=staff, workspace=other_workspace)
    client.force_login(staff)
    page = client.get(reverse("admin:workflows_workflow_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "globex-research" in html and "Globex" in html
    assert "acme-research" not in html
    assert workspace.name not in html  # not even as a choice of the workspace filter


def test_every_workflows_changelist_opens(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    make_message(invocation, node, 10_000, "data", {"text": "hello"}, target="merge")
    for model in ("workflow", "workflowversion", "workflowinvocation", "nodeinvocation", "message", "contextentry",
                  "llmcall", "mcpserver", "mcpserverversion", "userserverconfig"):
        response = staff_client.get(reverse(f"admin:workflows_{model}_changelist"))
        assert response.status_code == 200, model


def test_invocation_list_shows_status_version_cost_tokens_nodes_and_duration(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    start = timezone.now() - timedelta(seconds=30)
    done = make_invocation(version, status="completed", started=start, ended=start + timedelta(seconds=12.5),
                           usd_cost=Decimal("0.012345"), input_tokens=1200, output_tokens=340, node_count=3)
    failed = make_invocation(version, status="failed", started=start)
    page = staff_client.get(reverse("admin:workflows_workflowinvocation_changelist"))
    html = page.content.decode()
    assert {row.pk for row in page.context["cl"].result_list} == {done.pk, failed.pk}
    assert version.dsl_hash[:12] in html and "research" in html
    assert "$0.0123" in html and "1,200 / 340" in html and "12.5 s" in html
    assert 'class="wf-status wf-status-completed"' in html

    def listed(query):
        return {row.pk for row in staff_client.get(reverse("admin:workflows_workflowinvocation_changelist") + query)
                .context["cl"].result_list}

    assert listed("?status__exact=failed") == {failed.pk}
    assert listed(f"?workflow={workflow.pk}") == {done.pk, failed.pk}
    assert listed(f"?workflow_version__id__exact={version.pk}") == {done.pk, failed.pk}
    assert listed(f"?q={done.pk}") == {done.pk}
    assert listed(f"?q={version.dsl_hash[:8]}") == {done.pk, failed.pk}
    # status facets: counts per status, on request (Django's "Show counts")
    facets = staff_client.get(reverse("admin:workflows_workflowinvocation_changelist") + "?_facets=True")
    assert re.search(r"Completed\s*\(1\)", facets.content.decode())


INVOCATIONS_URL = "/admin/workflows/workflowinvocation/"


def listed(client, query: str) -> set[int]:
    response = client.get(INVOCATIONS_URL + query)
    assert response.status_code == 200, response
    return {row.pk for row in response.context["cl"].result_list}


@pytest.fixture
def traces(workflow, other_workspace):
    """Invocations whose words are in a tool result, an assistant answer, a hand-off, the input, the output;
    and one of another workspace."""
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    rows = {}

    def said(name, role, payload, **fields):
        invocation = make_invocation(version, status="completed", **fields)
        node = make_node(invocation, 1, "search")
        if role:
            make_message(invocation, node, 10_001, role, payload)
        rows[name] = invocation

    said("tool", "tool", {"content": "The flux capacitor needs 1.21 gigawatts.", "name": "knowledge_search",
                          "tool_call_id": "c1"})
    said("assistant", "assistant", {"content": "Penguins huddle together against the cold.", "model": "m"})
    said("handoff", "delegation", {"text": "Check the lighthouse keeper's logbook."})
    said("input", None, None, input={"question": "Where do albatrosses nest?"})
    said("output", None, None, output={"text": "Marmalade is made of bitter oranges.", "node_id": "merge"})
    elsewhere, _ = workflow_version_create(workflow=workflow_create(workspace=other_workspace, name="globex"),
                                           dsl=cyclic_dsl())
    foreign = make_invocation(elsewhere, status="completed")
    make_message(foreign, make_node(foreign, 1, "search"), 10_001, "tool",
                 {"content": "A zeppelin over the penguins.", "name": "knowledge_search"})
    rows["foreign"] = foreign
    return rows


def test_the_invocation_search_finds_words_said_in_its_messages_input_and_output(staff_client, outsider_client,
                                                                                traces):
    assert listed(staff_client, "?q=gigawatts") == {traces["tool"].pk}  # a tool result
    assert listed(staff_client, "?q=penguin") == {traces["assistant"].pk}  # an answer (stemmed: penguins)
    assert listed(staff_client, "?q=lighthouse+logbook") == {traces["handoff"].pk}
    assert listed(staff_client, "?q=albatross") == {traces["input"].pk}
    assert listed(staff_client, "?q=marmalade") == {traces["output"].pk}
    assert listed(staff_client, '?q="flux capacitor"') == {traces["tool"].pk}
    assert listed(staff_client, '?q="capacitor flux"') == set()  # a phrase in its order only
    assert listed(staff_client, "?q=penguins+-huddle") == set()
    # a word said only in another workspace's invocation finds nothing; its own workspace finds it
    assert listed(staff_client, "?q=zeppelin") == set()
    assert listed(outsider_client, "?q=zeppelin") == {traces["foreign"].pk}
    assert listed(outsider_client, "?q=penguins") == {traces["foreign"].pk}
    # the other matches stay: an id, a workflow's name
    assert listed(staff_client, f"?q={traces['tool'].pk}") == {traces["tool"].pk}
    assert listed(staff_client, "?q=research") == {row.pk for name, row in traces.items() if name != "foreign"}
    assert listed(staff_client, "?q=%22%22%22") == set()  # quotes only: no words, no error


def test_the_trace_search_is_served_by_the_full_text_indexes(staff_client, traces):
    """The changelist's query, as it ran, can be answered through both GIN indexes (sequential scans off: on a
    table this small the planner would rather read it all)."""
    with CaptureQueriesContext(connection) as captured:
        assert listed(staff_client, "?q=gigawatts") == {traces["tool"].pk}
    (query,) = [entry["sql"] for entry in captured.captured_queries
                if "@@" in entry["sql"] and entry["sql"].startswith('SELECT "workflows_workflowinvocation"."id"')]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + query)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET LOCAL enable_seqscan = on")
    assert "workflows_msg_search_idx" in plan and "workflows_inv_search_idx" in plan, plan


def test_a_searched_list_counts_at_most_its_first_matches(staff_client, workflow, monkeypatch):
    from workflows.admin import SearchedCountPaginator, WorkflowInvocationAdmin

    monkeypatch.setattr(SearchedCountPaginator, "limit", 3)
    monkeypatch.setattr(WorkflowInvocationAdmin, "list_per_page", 2)
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    made = [make_invocation(version, status="completed", output={"text": "common words"}) for _ in range(5)]
    changelist = staff_client.get(INVOCATIONS_URL + "?q=common").context["cl"]
    assert changelist.result_count == 3 and changelist.paginator.num_pages == 2
    assert [row.pk for row in changelist.result_list] == [made[4].pk, made[3].pk]  # newest first
    assert listed(staff_client, "?q=common&p=2") == {made[2].pk}


def test_the_invocation_list_filters_by_model_tool_cost_duration_and_date(staff_client, outsider_client, workflow,
                                                                          other_workspace):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    mistral, _ = workflow_version_create(workflow=workflow_create(workspace=workflow.workspace, name="mistral"), dsl={
        "entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "mistral-small"}]})
    start = timezone.now() - timedelta(hours=1)
    free = make_invocation(version, status="completed", started=start, ended=start + timedelta(milliseconds=300))
    cheap = make_invocation(version, status="completed", usd_cost=Decimal("0.005"), started=start,
                            ended=start + timedelta(seconds=5))
    paid = make_invocation(version, status="completed", usd_cost=Decimal("0.05"), started=start,
                           ended=start + timedelta(seconds=30))
    dear = make_invocation(mistral, status="failed", usd_cost=Decimal("2.5"), started=start,
                           ended=start + timedelta(minutes=20))
    make_node(cheap, 1, "orchestrator", model="offline-directive-v1")
    searched = make_node(paid, 1, "search")
    make_message(paid, searched, 10_002, "tool", {"content": "hits", "name": "knowledge_search"})
    make_message(cheap, make_node(cheap, 2, "search"), 20_002, "assistant", {
        "content": "", "tool_calls": [{"id": "c", "name": "knowledge_search", "arguments": {}}]})  # asked, never ran
    WorkflowInvocation.objects.filter(pk=dear.pk).update(created_at=timezone.now() - timedelta(days=3))

    assert listed(staff_client, "?model=mistral-small") == {dear.pk}  # the model its version names
    assert listed(staff_client, "?model=offline-directive-v1") == {cheap.pk}  # the model that answered
    assert listed(staff_client, "?model=gpt-4.1-mini") == {free.pk, cheap.pk, paid.pk}
    assert listed(staff_client, "?tool=knowledge_search") == {paid.pk}
    assert listed(staff_client, "?tool=tavily") == set()
    assert listed(staff_client, "?cost=free") == {free.pk}
    assert listed(staff_client, "?cost=0.01") == {paid.pk, dear.pk}
    assert listed(staff_client, "?cost=0.10") == listed(staff_client, "?cost=1") == {dear.pk}
    assert listed(staff_client, "?duration=1s") == {free.pk}
    assert listed(staff_client, "?duration=10s") == {cheap.pk}
    assert listed(staff_client, "?duration=1m") == {paid.pk}
    assert listed(staff_client, "?duration=long") == {dear.pk}
    assert listed(staff_client, "?created=24h") == {free.pk, cheap.pk, paid.pk}
    assert listed(staff_client, "?created=7d&cost=1&status__exact=failed") == {dear.pk}
    assert listed(staff_client, "?q=hits&tool=knowledge_search") == {paid.pk}
    assert staff_client.get(INVOCATIONS_URL + "?cost=lots").url.endswith("?e=1")  # refused, not a server error
    # the choices: the names of the user's workspaces only
    page = staff_client.get(INVOCATIONS_URL).content.decode()
    for name in ("mistral-small", "offline-directive-v1", "gpt-4.1-mini", "knowledge_search", "tavily", "&gt; $1",
                 "10 min or more", "last 24 hours"):
        assert name in page, name
    elsewhere, _ = workflow_version_create(workflow=workflow_create(workspace=other_workspace, name="globex"), dsl={
        "entryNodeId": "z", "nodes": [{"nodeId": "z", "gatewayModelId": "grok-9", "codeTools": ["web_fetch"]}]})
    make_node(make_invocation(elsewhere), 1, "z", model="grok-9-answer")
    page = staff_client.get(INVOCATIONS_URL).content.decode()
    assert "grok-9" not in page and "web_fetch" not in page
    outsider = outsider_client.get(INVOCATIONS_URL).content.decode()
    assert "grok-9-answer" in outsider and "web_fetch" in outsider and "mistral-small" not in outsider
    assert listed(outsider_client, "?model=mistral-small") == set()


def test_the_invocation_list_refuses_a_model_or_tool_filter_postgres_cannot_read(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    make_invocation(version)
    for query, name in (("?model=gpt%00", "model"), ("?tool=%00", "tool")):  # every admin page refuses a NUL
        response = staff_client.get(INVOCATIONS_URL + query)
        assert response.status_code == 400 and response.content.decode().startswith(f"{name}: "), query
    response = staff_client.get(INVOCATIONS_URL + "?model=" + "m" * 100_000)
    assert response.status_code == 200 or (response.status_code == 302 and response.url.endswith("?e=1"))


# ------------------------------------------------------------------------------------- version page

def test_version_page_draws_the_graph_and_lists_nodes_unresolved_tools_dsl_and_genealogy(staff_client, workflow):
    base, _ = workflow_version_create(workflow=workflow, dsl=SEED_EXPORT, commit_message="imported")
    mutated_dsl = json.loads(json.dumps(SEED_EXPORT))
    mutated_dsl["nodes"][1]["systemPrompt"] = "Check every source twice."
    child, _ = workflow_version_create(workflow=workflow, dsl=mutated_dsl, operation="mutation", parents=(base,),
                                       commit_message="critic: check twice")
    crossed_dsl = json.loads(json.dumps(mutated_dsl))
    crossed_dsl["nodes"][2]["systemPrompt"] = "Answer in two paragraphs."
    grandchild, _ = workflow_version_create(workflow=workflow, dsl=crossed_dsl, operation="crossover",
                                            parents=(child, base), commit_message="crossover")

    response = staff_client.get(change_url("workflowversion", base.pk))
    assert response.status_code == 200
    html = response.content.decode()
    svg = str(response.context["graph_svg"])
    assert svg.startswith("<svg") and '<svg xmlns="http://www.w3.org/2000/svg" class="workflow-graph"' in html
    for node_id in ("researcher", "critic", "writer", "end"):
        assert f'data-node-id="{node_id}"' in svg
    assert 'data-from="researcher" data-to="critic"' in svg
    assert 'data-from="writer" data-to="end"' in svg
    assert re.search(r'class="edge edge-waitfor edge-forward" data-from="critic" data-to="writer"', svg)
    # nodes table: model, tools (the unresolved ones marked), hand-offs, prompt excerpt
    assert [node["id"] for node in response.context["graph_nodes"]] == ["researcher", "critic", "writer"]
    assert "openrouter#openai/gpt-4.1-mini" in html and "Search the web and collect three sources." in html
    assert "sequential: writer, critic" in html
    assert '<span class="wf-tag wf-tag-missing">researcher.browserUse</span>' in html
    assert "&quot;entryNodeId&quot;: &quot;researcher&quot;" in html  # indented DSL JSON in a <pre>
    # genealogy: its children, each linked
    children = {row["hash"] for row in response.context["children"]}
    assert children == {child.dsl_hash[:12], grandchild.dsl_hash[:12]}
    assert change_url("workflowversion", child.pk) in html

    crossed = staff_client.get(change_url("workflowversion", grandchild.pk))
    assert [(row["role"], row["hash"]) for row in crossed.context["parents"]] == [
        ("parent 1", child.dsl_hash[:12]), ("parent 2", base.dsl_hash[:12])]
    assert change_url("workflowversion", base.pk) in crossed.content.decode()


def test_versions_are_read_only(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    response = staff_client.post(change_url("workflowversion", version.pk), {"commit_message": "rewritten"})
    assert response.status_code == 403
    assert staff_client.get(reverse("admin:workflows_workflowversion_add")).status_code == 403


def test_graph_layout_is_layered_from_the_entry_with_cycles_as_back_edges():
    plan = graph.layout(cyclic_dsl())
    assert plan.node_layers() == [["orchestrator"], ["search"], ["left", "right"], ["merge"], ["end"]]
    edges = [(edge.source, edge.target, edge.kind, edge.back) for edge in plan.edges]
    assert edges == [
        ("orchestrator", "search", "conditional", False), ("orchestrator", "end", "conditional", False),
        ("search", "left", "parallel", False), ("search", "right", "parallel", False),
        ("left", "merge", "sequential", False), ("right", "merge", "sequential", False),
        ("merge", "orchestrator", "sequential", True),  # the loop is drawn as a back edge
        ("left", "merge", "waitfor", False), ("right", "merge", "waitfor", False),  # dotted, besides the hand-offs
    ]
    svg = str(graph.dsl_svg(cyclic_dsl()))
    assert svg == str(graph.dsl_svg(cyclic_dsl()))  # deterministic
    assert svg.count('class="edge edge-conditional') == 2 and svg.count(">choice</text>") == 2
    assert svg.count('class="edge edge-parallel') == 2 and svg.count('class="edge-parallel-inner"') == 2
    assert 'stroke-dasharray="2 4"' in svg  # waitFor dotted
    assert 'class="edge edge-sequential edge-back" data-from="merge" data-to="orchestrator"' in svg
    assert svg.count('class="node-approval"') == 1


def test_graph_of_twenty_nodes_with_long_edges_keeps_boxes_apart():
    nodes = [{"nodeId": f"n{index}", "gatewayModelId": "m",
              "handOffs": [f"n{index + 1}", f"n{min(index + 5, 19)}"] if index < 19 else ["end", "n0"]}
             for index in range(20)]
    plan = graph.layout({"entryNodeId": "n0", "nodes": nodes})
    boxes = [plan.boxes[key] for row in plan.node_layers() for key in row]
    assert len(boxes) == 21  # 20 nodes and `end`
    for index, a in enumerate(boxes):
        assert a.x >= 0 and a.x + a.w <= plan.width and a.y >= 0 and a.y + a.h <= plan.height
        for b in boxes[index + 1:]:
            assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
    # the edges that skip layers pass through waypoints instead of under the boxes in between
    assert all(edge.via for edge in plan.edges if not edge.back and edge.source == "n0" and edge.target == "n5")
    assert [edge.back for edge in plan.edges if edge.source == "n19" and edge.target == "n0"] == [True]


def test_a_self_loop_and_an_unreachable_node_are_drawn():
    dsl = {"entryNodeId": "a", "nodes": [
        {"nodeId": "a", "gatewayModelId": "m", "handOffs": ["a", "end"], "handOffType": "conditional"},
        {"nodeId": "island", "gatewayModelId": "m", "handOffs": []},
    ]}
    svg = str(graph.dsl_svg(dsl))
    assert 'data-from="a" data-to="a"' in svg and "edge-back" in svg
    assert 'class="node node-unreachable" data-node-id="island"' in svg
    assert 'class="edge edge-implicit edge-forward" data-from="island" data-to="end"' in svg


# -------------------------------------------------------------------------------------------- XSS

def test_node_ids_and_prompts_are_escaped_in_the_svg_and_on_the_pages(staff_client, workflow):
    dsl = cyclic_dsl()
    dsl["nodes"][2]["nodeId"] = XSS_ID
    dsl["nodes"][1]["handOffs"] = [XSS_ID, "right"]
    dsl["nodes"][4]["waitFor"] = [XSS_ID, "right"]
    dsl["nodes"][0]["systemPrompt"] = XSS_PROMPT
    dsl["nodes"][0]["gatewayModelId"] = "<b>model</b>"
    version, _ = workflow_version_create(workflow=workflow, dsl=dsl)

    svg = str(graph.dsl_svg(version.dsl))
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    assert 'data-node-id="&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;"' in svg
    assert "&lt;img src=x onerror=alert(&quot;prompt&quot;)&gt;" in svg  # in the box's tooltip

    html = staff_client.get(change_url("workflowversion", version.pk)).content.decode()
    assert XSS_ID not in html and XSS_PROMPT not in html and "<b>model</b>" not in html
    assert "&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;" in html

    invocation = make_invocation(version, status="failed", started=timezone.now(), error=XSS_PROMPT,
                                 input={"text": XSS_ID}, output={"text": XSS_PROMPT})
    node = make_node(invocation, 1, XSS_ID, status="failed", started=timezone.now(), ended=timezone.now(),
                     error=XSS_ID, output=XSS_PROMPT, input=XSS_ID, model="<i>m</i>")
    make_message(invocation, node, 10_000, "delegation", {"text": XSS_PROMPT}, source=XSS_ID, target=XSS_ID)
    make_message(invocation, node, 10_001, "assistant", {
        "content": XSS_PROMPT, "tool_calls": [{"id": "c1", "name": XSS_ID, "arguments": {"q": XSS_PROMPT}}],
        "usage": {"input_tokens": 1, "output_tokens": 2, "model": XSS_ID}, "model": XSS_ID})
    make_message(invocation, node, 10_002, "tool", {"content": XSS_PROMPT, "name": XSS_ID, "tool_call_id": "c1"})
    html = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert XSS_ID not in html and XSS_PROMPT not in html and "<i>m</i>" not in html
    assert html.count("&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;") >= 5
    for model in ("message", "nodeinvocation"):
        page = staff_client.get(reverse(f"admin:workflows_{model}_changelist")).content.decode()
        assert XSS_ID not in page and XSS_PROMPT not in page


# ---------------------------------------------------------------------------------- invocation page

def test_invocation_page_shows_totals_payloads_run_link_timeline_and_messages(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    start = timezone.now() - timedelta(minutes=5)
    services.run_create(run_id="wfi-page", workflow="workflows.invoke", input={}, dispatch=False,
                        namespace=workflow.workspace.namespace)
    invocation = make_invocation(version, status="failed", started=start, ended=start + timedelta(seconds=10),
                                 durable_run_id="wfi-page", input={"text": "what is durable?"},
                                 error="merge: the model refused", usd_cost=Decimal("0.002500"), input_tokens=900,
                                 output_tokens=120, llm_calls=4, cache_hits=1, node_count=2)
    first = make_node(invocation, 1, "orchestrator", started=start, ended=start + timedelta(seconds=2),
                      model="gpt-4.1-mini", input_tokens=500, output_tokens=60, usd_cost=Decimal("0.0015"),
                      output="Search first.", next_nodes=["search"])
    second = make_node(invocation, 2, "search", status="failed", started=start + timedelta(seconds=2),
                       ended=start + timedelta(seconds=10), model="gpt-4.1-mini", error="the model refused")
    make_message(invocation, first, 10_000, "data", {"text": "what is durable?"}, target="orchestrator")
    make_message(invocation, first, 10_001, "system", {"content": "You are orchestrator."})
    make_message(invocation, first, 10_002, "assistant", {
        "content": "", "tool_calls": [{"id": "call-1", "name": "knowledge_search", "arguments": {"query": "durable"}}],
        "usage": {"input_tokens": 250, "output_tokens": 30, "model": "gpt-4.1-mini"}, "cache_hit": True,
        "model": "gpt-4.1-mini"})
    make_message(invocation, first, 10_003, "tool", {"content": "Durable runs survive crashes. " * 40,
                                                      "name": "knowledge_search", "tool_call_id": "call-1"})
    make_message(invocation, first, 19_999, "delegation", {"text": "Search first."}, source="orchestrator",
                 target="search")
    make_message(invocation, second, 20_000, "delegation", {"text": "Search first."}, source="orchestrator",
                 target="search")

    response = staff_client.get(change_url("workflowinvocation", invocation.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Failed" in html and "merge: the model refused" in html
    assert "&quot;text&quot;: &quot;what is durable?&quot;" in html  # input as pretty JSON
    assert "$0.0025 (budget $1.00)" in html and "900 / 120" in html and "4 (1 answered by the cache)" in html
    assert "2 (budget 14)" in html and f"Invocation {invocation.pk} of research @ {version.dsl_hash[:12]}" in html
    assert reverse("admin:durable_durablerun_change", args=["wfi-page"]) in html
    # the timeline: one bar per node invocation, placed by its start and end in the invocation's 10 s
    bars = response.context["timeline"]["bars"]
    assert [(bar["seq"], bar["node_id"], bar["left"], bar["width"]) for bar in bars] == [
        (1, "orchestrator", "0.000", "20.000"), (2, "search", "20.000", "80.000")]
    assert 'style="left: 20.000%; width: 80.000%"' in html
    # each node's messages in order: role, from -> to, content, tool calls, usage; long content collapsed
    nodes = response.context["node_views"]
    assert [message["seq"] for message in nodes[0]["messages"]] == [10_000, 10_001, 10_002, 10_003, 19_999]
    assert [message["seq"] for message in nodes[1]["messages"]] == [20_000]
    assert "orchestrator → search" in html
    assert "calls <strong>knowledge_search</strong>" in html and "&quot;query&quot;: &quot;durable&quot;" in html
    assert "250 in / 30 out · cache hit" in html
    assert nodes[0]["messages"][3]["long"] and '<details class="wf-more"><summary>Durable runs survive' in html
    assert "the model refused" in html
    # a failed invocation offers no cancel, and no node waits
    assert 'id="wf-cancel"' not in html and "wf-decision" not in html


def test_invocation_page_links_context_entries_downloaded_through_the_admin(staff_client, outsider_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation = make_invocation(version, status="completed")
    entry = ContextEntry(workflow_invocation=invocation, key="node-1-call", size=11, content_type="text/html",
                         summary="<b>big</b>")
    entry.data.save("blob.html", ContentFile(b"<h1>hi</h1>x"), save=False)
    entry.save()
    html = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    download = reverse("admin:workflows_contextentry_download", args=[entry.pk])
    assert download in html and "<b>big</b>" not in html
    response = staff_client.get(download)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"<h1>hi</h1>x"
    assert response["Content-Disposition"].startswith("attachment")
    assert response["Content-Type"] == "application/octet-stream"  # HTML is never served as HTML
    assert response["X-Content-Type-Options"] == "nosniff" and response["Content-Security-Policy"] == "sandbox"
    assert staff_client.get(change_url("contextentry", entry.pk)).status_code == 200
    assert outsider_client.get(download).status_code == 302  # another workspace: as a missing row
    assert "/media/" not in staff_client.get(change_url("contextentry", entry.pk)).content.decode()


# ----------------------------------------------------------------------------- scores, add to golden set

def evals_staff(username, workspace, *, add_items=True):
    """A staff member with the workflows' permissions and the evals' (without adding golden items, if asked)."""
    user = admin_staff(username, workspace, apps=("workflows", "evals"))
    if not add_items:
        user.user_permissions.remove(Permission.objects.get(codename="add_goldenitem"))
    return user


@pytest.fixture
def graded(workflow, other_workspace):
    """An invocation graded by two eval runs (one of them with a failing item), and golden sets of its workspace
    and of another."""
    from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet

    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation = make_invocation(version, status="completed", input={"text": "How long do refunds take?"},
                                 output={"text": "Refunds take five days.", "node_id": "merge"})
    golden = GoldenSet.objects.create(workspace=workflow.workspace, name="refunds", workflow=workflow)
    item = GoldenItem.objects.create(golden_set=golden, position=1, input={"text": "How long do refunds take?"},
                                     expected_output="five business days", tags=["critical"], split="test")
    runs = [EvalRun.objects.create(workspace=workflow.workspace, golden_set=golden, workflow_version=version,
                                   status="completed") for _ in range(2)]
    GoldenResult.objects.create(eval_run=runs[0], golden_item=item, workflow_version=version,
                                workflow_invocation=invocation, score=0.8, passed=True, grader="contains+token_f1",
                                grades=[{"kind": "contains", "score": 1.0, "weight": 2},
                                        {"kind": "token_f1", "score": 0.4}], reuse_key="a")
    GoldenResult.objects.create(eval_run=runs[1], golden_item=item, workflow_version=version,
                                workflow_invocation=invocation, score=0.2, passed=False, grader="llm_judge",
                                grades=[{"kind": "llm_judge", "error": "the judge timed out"}], reuse_key="b")
    other = GoldenSet.objects.create(workspace=other_workspace, name="globex set")
    return {"invocation": invocation, "set": golden, "other_set": other, "runs": runs, "item": item}


def test_the_invocation_page_shows_the_scores_that_graded_it(workspace, graded):
    client = client_of(evals_staff("grader", workspace))
    response = client.get(change_url("workflowinvocation", graded["invocation"].pk))
    html = response.content.decode()
    (panel,) = response.context["panels"]
    assert [(row["golden_set"], row["score"], row["passed"], row["run"]) for row in panel["scores"]] == [
        ("refunds", "0.200", False, graded["runs"][1].pk), ("refunds", "0.800", True, graded["runs"][0].pk)]
    assert [(grade["kind"], grade["score"]) for grade in panel["scores"][1]["grades"]] == [
        ("contains", "1.000"), ("token_f1", "0.400")]
    assert panel["scores"][0]["grades"] == [{"kind": "llm_judge", "score": "error", "weight": None}]
    assert reverse("admin:evals_evalrun_change", args=[graded["runs"][0].pk]) in html
    assert "#1 How long do refunds take?" in html and "contains: 1.000 (weight 2)" in html
    assert '<span class="ev-fail">failed</span>' in html and '<span class="ev-pass">passed</span>' in html
    ungraded = make_invocation(graded["invocation"].workflow_version, status="completed")
    assert "No eval run has graded this invocation." in client.get(
        change_url("workflowinvocation", ungraded.pk)).content.decode()


def test_the_invocation_pages_scores_and_form_query_count_does_not_grow_with_results_or_sets(workspace, graded):
    from evals.models import EvalRun, GoldenResult, GoldenSet

    client = client_of(evals_staff("grader", workspace))
    url = change_url("workflowinvocation", graded["invocation"].pk)
    client.get(url)  # the content types' cache filled
    before = count_queries(client, url)
    for index in range(8):
        run = EvalRun.objects.create(workspace=workspace, golden_set=graded["set"], status="completed",
                                     workflow_version=graded["invocation"].workflow_version)
        GoldenResult.objects.create(eval_run=run, golden_item=graded["item"], workflow_invocation=graded["invocation"],
                                    workflow_version=run.workflow_version, score=0.5, reuse_key=str(index))
        GoldenSet.objects.create(workspace=workspace, name=f"set {index}")
    assert count_queries(client, url) == before


def add_item_url(invocation) -> str:
    return reverse("admin:evals_goldenitem_from_invocation") + f"?invocation={invocation.pk}"


def test_add_to_golden_set_prefills_the_form_and_creates_the_item(workspace, graded):
    from evals.models import GoldenItem

    client = client_of(evals_staff("curator", workspace))
    invocation = graded["invocation"]
    page = client.get(change_url("workflowinvocation", invocation.pk))
    form = page.context["panels"][0]["form"]
    assert [choice for choice in form.fields["golden_set"].choices] == [(graded["set"].pk, "refunds")]
    html = page.content.decode()
    assert "Add to golden set" in html and "Refunds take five days.</textarea>" in html
    assert "globex set" not in html

    response = client.post(add_item_url(invocation), {
        "golden_set": graded["set"].pk, "input": json.dumps(invocation.input),
        "expected_output": "Refunds take five business days.", "scoring_criteria": "names the delay",
        "tags": "critical, refunds"})
    assert response.status_code == 302 and response.url.endswith(
        change_url("workflowinvocation", invocation.pk) + "#ev-invocation-evals")
    item = GoldenItem.objects.get(golden_set=graded["set"], position=2)
    assert (item.input, item.expected_output, item.scoring_criteria, item.tags) == (
        {"text": "How long do refunds take?"}, "Refunds take five business days.", "names the delay",
        ["critical", "refunds"])
    assert item.metadata == {"from_invocation": invocation.pk} and item.split in ("train", "validation", "test")
    assert any("Added item #2" in text and "refunds" in text for text in messages_of(response))


def test_add_to_golden_set_refuses_another_workspaces_set_bad_fields_csrf_and_no_permission(
        workspace, other_workspace, graded):
    from evals.models import GoldenItem

    invocation = graded["invocation"]
    curator = evals_staff("curator", workspace)
    client = client_of(curator)
    data = {"golden_set": graded["other_set"].pk, "input": '{"text": "x"}', "expected_output": "y"}
    refused = client.post(add_item_url(invocation), data)
    assert refused.status_code == 400 and "golden_set" in refused.context["form"].errors
    assert any("Not added: golden_set" in text for text in messages_of(refused))
    bad = client.post(add_item_url(invocation), {**data, "golden_set": graded["set"].pk, "input": "{nope"})
    assert bad.status_code == 400 and list(bad.context["form"].errors) == ["input"]
    empty = client.post(add_item_url(invocation), {**data, "golden_set": graded["set"].pk, "input": "{}"})
    assert empty.status_code == 400 and "is required" in str(empty.context["form"].errors["input"])
    assert not GoldenItem.objects.filter(position__gt=1).exists()

    checked = Client(enforce_csrf_checks=True)
    checked.force_login(curator)
    assert checked.post(add_item_url(invocation), {**data, "golden_set": graded["set"].pk}).status_code == 403
    reader = client_of(evals_staff("reader", workspace, add_items=False))
    assert "Add to golden set" not in reader.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert reader.post(add_item_url(invocation), {**data, "golden_set": graded["set"].pk}).status_code == 403
    # another workspace's staff cannot reach the invocation (as a missing one), even with a set of its own
    outsider = client_of(evals_staff("globex-curator", other_workspace))
    away = outsider.post(add_item_url(invocation), {**data})
    assert away.status_code == 302 and not GoldenItem.objects.filter(golden_set=graded["other_set"]).exists()
    assert GoldenItem.objects.count() == 1


def test_add_to_golden_set_refuses_an_input_it_cannot_store_or_read_naming_the_field(workspace, graded):
    from evals.models import GoldenItem

    client = client_of(evals_staff("curator", workspace))
    data = {"golden_set": graded["set"].pk, "expected_output": "y"}
    for text in ('{"text": NaN}', '{"text": Infinity}', '{"text": "a\\u0000b"}', "[" * 100_000 + "]" * 100_000):
        refused = client.post(add_item_url(graded["invocation"]), {**data, "input": text})
        assert refused.status_code == 400, text
        assert list(refused.context["form"].errors) == ["input"], text
    assert GoldenItem.objects.count() == 1


# ----------------------------------------------------------------------------------- approve / reject

def decide(client, invocation, **data):
    return client.post(reverse("admin:workflows_workflowinvocation_decide", args=[invocation.pk]), data)


def test_approve_sends_the_decision_to_the_run_and_a_second_decision_is_refused(staff_client, staff, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert 'name="decision" value="approve"' in page and 'name="decision" value="reject"' in page

    response = decide(staff_client, invocation, node_seq=1, decision="approve", comment="looks right")
    assert response.status_code == 302 and response.url.endswith("#node-1")
    assert any("Approved node merge (#1)" in text for text in messages_of(response))
    node.refresh_from_db()
    assert node.approval["sent"]["decision"] == "approve" and node.approval["sent"]["comment"] == "looks right"
    assert node.approval["sent"]["by"] == staff.pk
    assert BufferedSignal.objects.filter(run_id="wfi-test-1", name="approval:1").count() == 1

    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert "Decision sent: approve" in page and 'value="approve"' not in page
    # when, as the admin writes dates (its time zone), not the stored ISO text
    sent_at = timezone.localtime(datetime.fromisoformat(node.approval["sent"]["at"]))
    assert f"at {sent_at:%Y-%m-%d %H:%M:%S}" in page and node.approval["sent"]["at"] not in page
    # and the page's own dates in the same format (the admin's were Django's "Dec. 4, 2026, 6:51 p.m.")
    invocation.refresh_from_db()
    assert f"{timezone.localtime(invocation.started_at):%Y-%m-%d %H:%M:%S}" in page
    assert " a.m." not in page and " p.m." not in page

    again = decide(staff_client, invocation, node_seq=1, decision="reject", comment="changed my mind")
    assert again.status_code == 302
    assert any("already received a decision" in text for text in messages_of(again))
    assert BufferedSignal.objects.filter(run_id="wfi-test-1").count() == 1
    shown = staff_client.get(again.url).content.decode()
    assert "already received a decision" in shown


def test_reject_sends_a_rejection(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    response = decide(staff_client, invocation, node_seq=1, decision="reject", comment="wrong sources")
    assert any("Rejected node merge (#1)" in text for text in messages_of(response))
    node.refresh_from_db()
    assert node.approval["sent"]["decision"] == "reject" and node.approval["sent"]["comment"] == "wrong sources"


def test_reject_with_comment_offers_a_revision_which_needs_a_comment(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert "Reject with comment" in page and 'name="decision" value="revise"' in page

    blank = decide(staff_client, invocation, node_seq=1, decision="revise", comment="  ")
    assert any("Not recorded" in text and "comment: a revision needs a comment" in text
               for text in messages_of(blank))
    assert not BufferedSignal.objects.exists()

    response = decide(staff_client, invocation, node_seq=1, decision="revise", comment="Cite the sources.")
    assert response.status_code == 302 and response.url.endswith("#node-1")
    assert any("Asked node merge (#1)" in text and "revision" in text for text in messages_of(response))
    node.refresh_from_db()
    assert node.approval["sent"]["decision"] == "revise" and node.approval["sent"]["comment"] == "Cite the sources."
    assert BufferedSignal.objects.filter(run_id="wfi-test-1", name="approval:1").count() == 1
    assert "Decision sent: revise" in staff_client.get(response.url).content.decode()


def test_a_revise_through_the_admin_shows_the_revision_round_and_the_decisions(staff_client, workflow):
    """End to end on the offline model: revise, the node answers again and waits; the page shows the request for
    a revision in the transcript and the span tree, and the earlier answer's decision."""
    dsl = {"entryNodeId": "draft", "nodes": [
        {"nodeId": "draft", "gatewayModelId": "offline-directive-v1", "requiresApproval": True}]}
    version, _ = workflow_version_create(workflow=workflow, dsl=dsl)
    invocation = invocation_start(version=version, input={"text": "The docs moved to a new site. Announce it."})
    run_until_settled(invocation.durable_run_id, max_wait=30)
    decide(staff_client, invocation, node_seq=1, decision="revise", comment="Say where the docs moved.")
    run_until_settled(invocation.durable_run_id, max_wait=30)
    response = staff_client.get(change_url("workflowinvocation", invocation.pk))
    html = response.content.decode()
    assert "Waiting for approval of revision 1." in html
    assert "Revision 1 asked by acme-staff" in html
    assert "An operator asked for a revision: Say where the docs moved." in html
    (row,) = response.context["span_tree"]
    assert [span["kind"] for span in row["spans"]] == ["llm", "revision", "llm"]
    assert row["spans"][1]["by"] == "acme-staff" and "Say where the docs moved." in row["spans"][1]["comment"]
    assert "answer 1: revise by acme-staff" in html


def test_the_span_tree_nests_model_calls_and_their_tool_calls_with_offsets_from_the_start(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    start = timezone.now() - timedelta(minutes=1)
    invocation = make_invocation(version, status="completed", started=start, ended=start + timedelta(seconds=10))
    first = make_node(invocation, 1, "orchestrator", started=start, ended=start + timedelta(seconds=5))
    second = make_node(invocation, 2, "search", started=start + timedelta(seconds=5),
                       ended=start + timedelta(seconds=10))
    at = {}

    def said(node, seq, role, payload, seconds):
        make_message(invocation, node, seq, role, payload)
        at[seq] = start + timedelta(seconds=seconds)

    said(first, 10_000, "user", {"content": "find it"}, 0.1)
    said(first, 10_001, "assistant", {
        "content": "", "tool_calls": [{"id": "c1", "name": "knowledge_search", "arguments": {}}],
        "model": "gpt-4.1-mini", "usage": {"input_tokens": 120, "output_tokens": 8, "usd_cost": "0.0012"},
        "latency_ms": 1500}, 2)
    said(first, 10_002, "tool", {"content": "hits", "name": "knowledge_search", "tool_call_id": "c1",
                                 "latency_ms": 400}, 2.5)
    said(first, 10_003, "tool", {"content": "error: no", "name": "web_fetch", "error": True}, 3)
    said(first, 10_004, "assistant", {"content": "Found.", "model": "gpt-4.1-mini", "cache_hit": True,
                                      "usage": {"input_tokens": 200, "output_tokens": 5, "usd_cost": "0.002"},
                                      "latency_ms": 1000}, 4.5)
    said(second, 20_000, "assistant", {"content": "done", "model": "offline-directive-v1", "latency_ms": 2000,
                                       "usage": {"input_tokens": 1, "output_tokens": 1}}, 9)
    for seq, moment in at.items():
        Message.objects.filter(workflow_invocation=invocation, seq=seq).update(created_at=moment)

    response = staff_client.get(change_url("workflowinvocation", invocation.pk))
    tree = response.context["span_tree"]
    assert [(row["seq"], row["node_id"], row["bar"]["offset"], row["bar"]["duration"]) for row in tree] == [
        (1, "orchestrator", "0 ms", "5.0 s"), (2, "search", "5.0 s", "5.0 s")]
    call, cached = tree[0]["spans"]
    assert (call["kind"], call["model"], call["input_tokens"], call["cost"], call["cached"]) == (
        "llm", "gpt-4.1-mini", 120, "$0.0012", False)
    assert (call["offset"], call["duration"], call["left"], call["width"]) == ("500 ms", "1.5 s", "5.000", "15.000")
    # the tool calls of its round, below it: one timed by its latency, one by the message before it
    assert [(tool["name"], tool["offset"], tool["duration"], tool["error"]) for tool in call["tools"]] == [
        ("knowledge_search", "2.1 s", "400 ms", False), ("web_fetch", "2.5 s", "500 ms", True)]
    assert (cached["offset"], cached["duration"], cached["cached"], cached["cost"]) == ("3.5 s", "1.0 s", True, "$0.00")
    assert [(span["model"], span["offset"]) for span in tree[1]["spans"]] == [("offline-directive-v1", "7.0 s")]
    html = response.content.decode()
    assert html.count('class="wf-span wf-span-llm') == 3 and html.count('class="wf-span wf-span-tool') == 2
    assert "120 in / 8 out · $0.0012" in html and '<span class="wf-cached">cached</span>' in html


def test_a_decision_for_a_node_that_does_not_wait_shows_the_error(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, _node = waiting_invocation(version)
    response = decide(staff_client, invocation, node_seq=7, decision="approve")
    assert any("no node of this invocation is waiting for approval at seq 7" in text
               for text in messages_of(response))
    bad = decide(staff_client, invocation, node_seq=1, decision="maybe")
    assert any("Not recorded" in text and "decision" in text for text in messages_of(bad))
    assert not BufferedSignal.objects.exists()


def test_decisions_need_post_csrf_and_the_change_permission(staff, workspace, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    url = reverse("admin:workflows_workflowinvocation_decide", args=[invocation.pk])
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(staff)
    assert checked.get(url).status_code == 405
    assert checked.post(url, {"node_seq": 1, "decision": "approve"}).status_code == 403  # no CSRF token

    viewer = Client()
    viewer.force_login(staff_user("viewer", workspace, codenames=["view_workflowinvocation", "view_workflowversion"]))
    page = viewer.get(change_url("workflowinvocation", invocation.pk))
    assert page.status_code == 200 and 'value="approve"' not in page.content.decode()
    assert viewer.post(url, {"node_seq": 1, "decision": "approve"}).status_code == 403
    anonymous = Client()
    assert anonymous.post(url, {"node_seq": 1, "decision": "approve"}).status_code == 302  # to the login page
    node.refresh_from_db()
    assert "sent" not in node.approval


def test_an_approval_through_the_admin_lets_a_real_invocation_finish(staff_client, workflow):
    """End to end with the offline model: the node waits, the operator approves, the run completes."""
    dsl = {"entryNodeId": "draft", "nodes": [
        {"nodeId": "draft", "gatewayModelId": "offline-directive-v1", "systemPrompt": "Answer in one sentence.",
         "handOffs": ["polish"], "requiresApproval": True},
        {"nodeId": "polish", "gatewayModelId": "offline-directive-v1", "systemPrompt": "Answer in one sentence.",
         "handOffs": ["end"]},
    ]}
    version, _ = workflow_version_create(workflow=workflow, dsl=dsl)
    invocation = invocation_start(version=version, input={"text": "What is a durable run?"})
    run_until_settled(invocation.durable_run_id)
    invocation.refresh_from_db()
    assert invocation.status == "waiting"
    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert 'id="approval-1"' in page and "What is a durable run?" in page

    decide(staff_client, invocation, node_seq=1, decision="approve", comment="ship it")
    run_until_settled(invocation.durable_run_id)
    invocation.refresh_from_db()
    assert invocation.status == "completed"
    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert "Approved</strong>" in page and "ship it" in page and "#2 polish" in page


def test_a_node_waiting_for_approval_shows_the_calls_it_already_made(staff_client, workflow):
    dsl = {"entryNodeId": "draft", "nodes": [
        {"nodeId": "draft", "gatewayModelId": "offline-directive-v1", "codeTools": ["knowledge_search"],
         "systemPrompt": "Call knowledge_search before answering.", "handOffs": ["end"], "requiresApproval": True}]}
    version, _ = workflow_version_create(workflow=workflow, dsl=dsl)
    invocation = invocation_start(version=version, input={"text": "What is a durable run?"})
    run_until_settled(invocation.durable_run_id)
    invocation.refresh_from_db()
    assert invocation.status == "waiting"
    answers = Message.objects.filter(workflow_invocation=invocation, role="assistant")
    assert answers.count() == 2  # the tool call, then the answer that waits for approval
    tokens_in = sum(m.payload["usage"]["input_tokens"] for m in answers)
    tokens_out = sum(m.payload["usage"]["output_tokens"] for m in answers)
    response = staff_client.get(change_url("workflowinvocation", invocation.pk))
    node = response.context["node_views"][0]
    assert (node["model"], node["llm_calls"], node["input_tokens"], node["output_tokens"]) == (
        "offline-directive-v1", 2, tokens_in, tokens_out)
    assert tokens_in > 0 and f"{tokens_in} / {tokens_out}" in response.content.decode()


# --------------------------------------------------------------------------------------------- cancel

def test_cancel_button_cancels_an_active_invocation_and_its_run(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    page = staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()
    assert 'id="wf-cancel"' in page
    url = reverse("admin:workflows_workflowinvocation_cancel", args=[invocation.pk])
    response = staff_client.post(url)
    assert any(f"Cancelled invocation {invocation.pk}" in text for text in messages_of(response))
    invocation.refresh_from_db()
    node.refresh_from_db()
    assert invocation.status == "cancelled" and node.status == "failed"
    assert DurableRun.objects.get(pk="wfi-test-1").status == "cancelled"
    again = staff_client.post(url)
    assert any("was not cancelled: it is cancelled" in text for text in messages_of(again))
    assert 'id="wf-cancel"' not in staff_client.get(change_url("workflowinvocation", invocation.pk)).content.decode()


def test_cancel_action_cancels_only_active_invocations(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    active, _node = waiting_invocation(version)
    done = make_invocation(version, status="completed")
    response = staff_client.post(reverse("admin:workflows_workflowinvocation_changelist"), {
        "action": "cancel_invocations", "_selected_action": [active.pk, done.pk]})
    assert response.status_code == 302
    assert any("Cancelled 1 of 2 selected invocations" in text for text in messages_of(response))
    active.refresh_from_db()
    done.refresh_from_db()
    assert (active.status, done.status) == ("cancelled", "completed")


# -------------------------------------------------------------------------------------------- scoping

def test_another_workspaces_rows_are_absent_and_cannot_be_acted_on(outsider_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation, node = waiting_invocation(version)
    message = make_message(invocation, node, 10_000, "data", {"text": "secret plan"}, target="merge")
    call = LlmCall.objects.create(workspace=workflow.workspace, key="k" * 64, provider="offline", model="m",
                                  response={"content": "cached secret"})
    for model, pk in (("workflowversion", version.pk), ("workflowinvocation", invocation.pk),
                      ("nodeinvocation", node.pk), ("message", message.pk), ("llmcall", call.pk)):
        response = outsider_client.get(change_url(model, pk))
        assert response.status_code == 302 and response.url == reverse("admin:index"), model
        listing = outsider_client.get(reverse(f"admin:workflows_{model}_changelist"))
        assert listing.status_code == 200 and not list(listing.context["cl"].result_list), model

    decided = outsider_client.post(reverse("admin:workflows_workflowinvocation_decide", args=[invocation.pk]),
                                   {"node_seq": 1, "decision": "approve"})
    assert decided.status_code == 302 and decided.url == reverse("admin:index")
    cancelled = outsider_client.post(reverse("admin:workflows_workflowinvocation_cancel", args=[invocation.pk]))
    assert cancelled.status_code == 302 and cancelled.url == reverse("admin:index")
    action = outsider_client.post(reverse("admin:workflows_workflowinvocation_changelist"), {
        "action": "cancel_invocations", "_selected_action": [invocation.pk]})
    assert action.status_code in (200, 302)
    node.refresh_from_db()
    invocation.refresh_from_db()
    assert "sent" not in node.approval and invocation.status == "waiting"
    assert not BufferedSignal.objects.exists()
    filters = outsider_client.get(reverse("admin:workflows_workflowinvocation_changelist")).content.decode()
    assert "research" not in filters and "Acme" not in filters  # not even as filter choices


def test_messages_and_node_invocations_are_searchable_by_invocation(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    first, other = make_invocation(version), make_invocation(version)
    node = make_node(first, 1, "search")
    wanted = [make_message(first, node, seq, "user", {"content": f"m{seq}"}) for seq in (10_002, 10_000, 10_001)]
    make_message(other, make_node(other, 1, "search"), 10_000, "user", {"content": "elsewhere"})
    listing = staff_client.get(reverse("admin:workflows_message_changelist") + f"?q={first.pk}")
    rows = list(listing.context["cl"].result_list)
    assert [row.pk for row in rows] == [message.pk for message in sorted(wanted, key=lambda m: m.seq)]
    nodes = staff_client.get(reverse("admin:workflows_nodeinvocation_changelist") + f"?q={first.pk}")
    assert [row.pk for row in nodes.context["cl"].result_list] == [node.pk]
    page = staff_client.get(change_url("nodeinvocation", node.pk)).content.decode()
    assert f"?node_invocation__id__exact={node.pk}" in page
    by_node = staff_client.get(reverse("admin:workflows_message_changelist") + f"?node_invocation__id__exact={node.pk}")
    assert len(by_node.context["cl"].result_list) == 3


# ---------------------------------------------------------------------------------------- MCP registry

def test_mcp_servers_are_editable_with_their_versions_and_tools_read_only(staff_client, workspace):
    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://mcp.example.test/mcp")
    version = McpServerVersion.objects.create(server=server, version="1.2.0", manifest_hash="a" * 64)
    McpTool.objects.create(server_version=version, name="web_search", description="Searches the web",
                           input_schema={"type": "object"})
    page = staff_client.get(change_url("mcpserver", server.pk))
    html = page.content.decode()
    assert page.status_code == 200 and "1.2.0" in html and "web_search" in html
    assert "1.2.0 (1 tools)" in staff_client.get(reverse("admin:workflows_mcpserver_changelist")).content.decode()
    response = staff_client.post(change_url("mcpserver", server.pk), {
        "workspace": workspace.pk, "slug": "search", "display_name": "Web search", "url": "https://new.example.test/mcp",
        "description": "The search server", "repository_url": "",
        "versions-TOTAL_FORMS": "1", "versions-INITIAL_FORMS": "1", "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000", "versions-0-id": version.pk, "versions-0-server": server.pk,
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    server.refresh_from_db()
    assert (server.display_name, server.url) == ("Web search", "https://new.example.test/mcp")
    tools = staff_client.get(change_url("mcpserverversion", version.pk)).content.decode()
    assert "web_search" in tools and "Searches the web" in tools
    assert staff_client.post(change_url("mcpserverversion", version.pk), {}).status_code == 403


def config_form(server, user, **fields):
    return {"user": user.pk, "server": server.pk, "config": "{}", "enabled": "on", "new_secrets": "", **fields}


def test_user_server_config_secrets_are_write_only(staff_client, staff, workspace):
    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://mcp.example.test/mcp")
    secret = "Bearer tok-5ecret-value"
    response = staff_client.post(reverse("admin:workflows_userserverconfig_add"), config_form(
        server, staff, new_secrets=json.dumps({"Authorization": secret})))
    assert response.status_code == 302
    config = UserServerConfig.objects.get(user=staff, server=server)
    assert json.loads(config.secrets) == {"Authorization": secret}
    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM workflows_userserverconfig WHERE id = %s", [config.pk])
        assert "tok-5ecret" not in cursor.fetchone()[0]  # encrypted at rest

    page = staff_client.get(change_url("userserverconfig", config.pk)).content.decode()
    assert "tok-5ecret" not in page
    assert re.search(r'<input type="password" name="new_secrets"[^>]*>', page)
    assert 'value="' not in re.search(r'<input type="password" name="new_secrets"[^>]*>', page).group(0)
    assert ">set<" in page
    listing = staff_client.get(reverse("admin:workflows_userserverconfig_changelist")).content.decode()
    assert "tok-5ecret" not in listing and ">set<" in listing

    # saving without new secrets keeps them; bad JSON is refused without echoing it; clearing empties them
    staff_client.post(change_url("userserverconfig", config.pk), config_form(server, staff, enabled=""))
    config.refresh_from_db()
    assert not config.enabled and json.loads(config.secrets) == {"Authorization": secret}
    bad = staff_client.post(change_url("userserverconfig", config.pk), config_form(server, staff,
                                                                                   new_secrets="{not-json-5ecret"))
    assert bad.status_code == 200 and "Not valid JSON" in bad.content.decode()
    assert "not-json-5ecret" not in bad.content.decode()
    staff_client.post(change_url("userserverconfig", config.pk), config_form(server, staff, clear_secrets="on"))
    config.refresh_from_db()
    assert config.secrets == ""
    assert ">not set<" in staff_client.get(change_url("userserverconfig", config.pk)).content.decode()


@pytest.mark.django_db
def test_moving_a_server_to_another_host_does_not_send_other_users_secrets_there(workspace):
    """A colleague saved an Authorization header for the workspace's `search` server. Another staff
    member of the workspace edits the server's URL to a host of their choosing in the admin. The
    colleague's secret must not be sent to the new host on their next call (their secrets are set
    aside, or their config disabled, until they confirm the new address)."""
    from django.test import Client
    from django.urls import reverse

    from workflows.mcp import McpError
    from workflows.mcp_services import mcp_headers_for
    from workflows.models import McpServer, UserServerConfig

    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://mcp.example.test/mcp")
    colleague = staff_user("colleague", workspace)
    UserServerConfig.objects.create(user=colleague, server=server,
                                    secrets=json.dumps({"Authorization": "Bearer colleague-secret"}))
    assert mcp_headers_for(user=colleague, server=server) == {"Authorization": "Bearer colleague-secret"}

    mover = Client()
    mover.force_login(staff_user("mover", workspace))
    response = mover.post(reverse("admin:workflows_mcpserver_change", args=[server.pk]), {
        "workspace": workspace.pk, "slug": "search", "display_name": "Search", "url": "https://collector.example/mcp",
        "description": "", "repository_url": "",
        "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0", "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    server.refresh_from_db()
    assert server.url == "https://collector.example/mcp"
    try:
        headers = mcp_headers_for(user=colleague, server=server)
    except McpError:
        headers = {}
    assert "Bearer colleague-secret" not in headers.values()


def test_staff_see_only_their_own_server_configs(staff_client, staff, workspace):
    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://mcp.example.test/mcp")
    colleague = staff_user("colleague", workspace)
    theirs = UserServerConfig.objects.create(user=colleague, server=server, secrets='{"X-Key": "theirs"}')
    mine = UserServerConfig.objects.create(user=staff, server=server)
    listing = staff_client.get(reverse("admin:workflows_userserverconfig_changelist"))
    assert [row.pk for row in listing.context["cl"].result_list] == [mine.pk]
    assert staff_client.get(change_url("userserverconfig", theirs.pk)).status_code == 302
    refused = staff_client.post(reverse("admin:workflows_userserverconfig_add"), config_form(server, colleague))
    assert refused.status_code == 200 and "user" in refused.context["adminform"].form.errors


def test_llm_call_cache_is_read_only(staff_client, workspace):
    call = LlmCall.objects.create(workspace=workspace, key="f" * 64, provider="offline", model="offline-directive-v1",
                                  response={"content": "cached answer"}, hits=3, input_tokens=10, output_tokens=5)
    page = staff_client.get(change_url("llmcall", call.pk)).content.decode()
    assert "cached answer" in page and "offline-directive-v1" in page
    listing = staff_client.get(reverse("admin:workflows_llmcall_changelist")).content.decode()
    assert "ffffffffffffffff" in listing and ">3<" in listing
    assert staff_client.post(change_url("llmcall", call.pk), {"hits": 0}).status_code == 403


# ------------------------------------------------------------------------------------- query budgets

def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


def test_invocation_list_query_count_does_not_grow_with_rows(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    make_invocation(version, status="completed", started=timezone.now(), ended=timezone.now())
    url = reverse("admin:workflows_workflowinvocation_changelist")
    one = count_queries(staff_client, url)
    with_counts = count_queries(staff_client, url + "?_facets=True")
    # one aggregate per filter (status, workflow, cost, duration, created, workspace; model and tool count nothing);
    # choices read once
    assert with_counts == one + 6
    other, _ = workflow_version_create(workflow=workflow_create(workspace=workflow.workspace, name="second"),
                                       dsl=cyclic_dsl(entryNodeId="search"))
    for index in range(30):
        make_invocation(version if index % 2 else other, status="running", started=timezone.now())
    assert count_queries(staff_client, url) == one
    assert count_queries(staff_client, url + "?_facets=True") == with_counts


def test_a_searched_and_filtered_invocation_list_query_count_does_not_grow_with_rows(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())

    def traced():
        invocation = make_invocation(version, status="completed", started=timezone.now(), ended=timezone.now())
        node = make_node(invocation, 1, "search", model="gpt-4.1-mini")
        make_message(invocation, node, 10_001, "tool", {"content": "gigawatts", "name": "knowledge_search"})

    traced()
    url = INVOCATIONS_URL + "?q=gigawatts&tool=knowledge_search&model=gpt-4.1-mini&cost=free&duration=1s&created=24h"
    one, with_counts = count_queries(staff_client, url), count_queries(staff_client, url + "&_facets=True")
    for _ in range(30):
        traced()
    assert (count_queries(staff_client, url), count_queries(staff_client, url + "&_facets=True")) == (one, with_counts)
    assert len(listed(staff_client, url[len(INVOCATIONS_URL):])) == 31


SEARCH_INDEXES = ("workflows_msg_search_idx", "workflows_msg_tool_idx", "workflows_inv_search_idx")


def _index_validity() -> dict[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                       "WHERE c.relname = ANY(%s)", [list(SEARCH_INDEXES)])
        return dict(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_search_index_migration_runs_again_after_a_concurrent_build_failed_halfway():
    """A CREATE INDEX CONCURRENTLY that fails (or whose process dies) leaves an INVALID index of its name and the
    migration unrecorded: migrate runs it again, over that index and the ones already built."""
    from django.db.migrations.executor import MigrationExecutor

    with connection.cursor() as cursor:
        cursor.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'workflows_msg_search_idx'::regclass")
    assert _index_validity() == {"workflows_msg_search_idx": False, "workflows_msg_tool_idx": True,
                                 "workflows_inv_search_idx": True}
    executor = MigrationExecutor(connection)
    key = ("workflows", "0009_invocation_search")
    state = executor.loader.project_state(key, at_end=False)
    with connection.schema_editor(atomic=False) as editor:
        executor.loader.graph.nodes[key].apply(state, editor)
    assert _index_validity() == dict.fromkeys(SEARCH_INDEXES, True)


def test_history_lists_query_count_does_not_grow_with_rows(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    invocation = make_invocation(version)
    node = make_node(invocation, 1, "search")
    make_message(invocation, node, 10_000, "data", {"text": "hi"})
    McpServer.objects.create(workspace=workflow.workspace, slug="s1", display_name="s", url="https://mcp.example.test/mcp")
    LlmCall.objects.create(workspace=workflow.workspace, key=f"{1:064d}", provider="p", model="m", response={})
    urls = [reverse(f"admin:workflows_{model}_changelist")
            for model in ("workflowversion", "nodeinvocation", "message", "mcpserver", "llmcall")]
    before = [count_queries(staff_client, url) for url in urls]
    for seq in range(2, 30):
        node = make_node(invocation, seq, f"n{seq}")
        make_message(invocation, node, seq * 10_000, "user", {"content": "hi"})
        McpServer.objects.create(workspace=workflow.workspace, slug=f"s{seq}", display_name="s",
                                 url="https://mcp.example.test/mcp")
        LlmCall.objects.create(workspace=workflow.workspace, key=f"{seq:064d}", provider="p", model="m", response={})
    for seq in range(8):
        workflow_version_create(workflow=workflow, dsl=cyclic_dsl(entryNodeId=["search", "left", "right",
                                                                              "merge"][seq % 4]),
                                commit_message=str(seq))
    assert [count_queries(staff_client, url) for url in urls] == before


def test_change_pages_query_count_does_not_grow_with_nodes_messages_or_children(staff_client, workflow):
    root, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl(entryNodeId="merge"))
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl(), parents=(root,))
    invocation = make_invocation(version, status="running", started=timezone.now())
    node = make_node(invocation, 1, "orchestrator", started=timezone.now())
    make_message(invocation, node, 10_000, "data", {"text": "hi"})
    invocation_url = change_url("workflowinvocation", invocation.pk)
    version_url = change_url("workflowversion", version.pk)
    for url in (invocation_url, version_url):  # the content types' cache filled, whichever test ran before
        count_queries(staff_client, url)
    small = (count_queries(staff_client, invocation_url), count_queries(staff_client, version_url))

    for seq in range(2, 15):
        node = make_node(invocation, seq, "search", started=timezone.now(), ended=timezone.now(),
                         status="waiting" if seq == 14 else "completed",
                         approval={"pending": True, "run_id": "r", "signal": f"approval:{seq}"} if seq == 14 else None)
        for offset in range(6):
            make_message(invocation, node, seq * 10_000 + offset, "assistant",
                         {"content": "x", "tool_calls": [{"id": "c", "name": "t", "arguments": {}}]})
        entry = ContextEntry(workflow_invocation=invocation, node_invocation=node, key=f"k{seq}", size=1)
        entry.data.save(f"k{seq}.txt", ContentFile(b"x"), save=False)
        entry.save()
    big_dsl = {"entryNodeId": "n0", "nodes": [
        {"nodeId": f"n{index}", "gatewayModelId": "m", "handOffs": [f"n{index + 1}"] if index < 19 else ["end"]}
        for index in range(20)]}
    for index in range(6):
        dsl = cyclic_dsl()
        dsl["nodes"][0]["systemPrompt"] = f"variant {index}"
        workflow_version_create(workflow=workflow, dsl=dsl, operation="mutation", parents=(version,))
    big, _ = workflow_version_create(workflow=workflow, dsl=big_dsl, operation="crossover", parents=(version, root))
    large = (count_queries(staff_client, invocation_url), count_queries(staff_client, version_url))
    assert large == small
    assert count_queries(staff_client, change_url("workflowversion", big.pk)) == small[1]


def test_scores_and_costs_read_as_numbers_a_person_reads(staff_client, workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    WorkflowVersion.objects.filter(pk=version.pk).update(avg_score=0.499833, pass_rate=0.142857)
    listing = staff_client.get(reverse("admin:workflows_workflowversion_changelist")).content.decode()
    assert "0.500" in listing and "14%" in listing and "0.499833" not in listing and "0.142857" not in listing
    page = staff_client.get(change_url("workflowversion", version.pk)).content.decode()
    assert "0.500" in page and "0.499833" not in page
    paid = LlmCall.objects.create(workspace=workflow.workspace, key="a" * 64, provider="openai", model="gpt-4.1-mini",
                                  usd_cost=Decimal("0.027"), response={})
    free = LlmCall.objects.create(workspace=workflow.workspace, key="b" * 64, provider="offline", model="m",
                                  response={})
    listing = staff_client.get(reverse("admin:workflows_llmcall_changelist")).content.decode()
    assert "$0.0270" in listing and "0.0000000000" not in listing
    assert "$0.0270" in staff_client.get(change_url("llmcall", paid.pk)).content.decode()
    page = staff_client.get(change_url("llmcall", free.pk)).content.decode()
    assert "$0.00" in page and "0.0000000000" not in page
    _, node = waiting_invocation(version)
    NodeInvocation.objects.filter(pk=node.pk).update(usd_cost=Decimal("0.0000123"))
    assert "$0.000012" in staff_client.get(reverse("admin:workflows_nodeinvocation_changelist")).content.decode()


# -------------------------------------------------------------------------------------- workflow page

def eval_run(version, golden_set, score, *, days_ago=0, **fields):
    from evals.models import EvalRun

    run = EvalRun.objects.create(workspace=version.workflow.workspace, golden_set=golden_set, workflow_version=version,
                                 status=fields.pop("status", "completed"), avg_score=score, pass_rate=score, **fields)
    EvalRun.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    return run


def versions_of(workflow, count: int) -> list[WorkflowVersion]:
    versions = []
    for index in range(count):
        dsl = cyclic_dsl()
        dsl["nodes"][0]["systemPrompt"] = f"You are orchestrator, take {index}."
        versions.append(workflow_version_create(workflow=workflow, dsl=dsl, commit_message=f"take {index}",
                                                parents=versions[-1:], operation="mutation" if versions else "init")[0])
    return versions


def test_workflow_page_shows_its_versions_active_marked_its_invocations_and_its_last_7_days(staff_client, workflow):
    from evals.models import GoldenSet
    from workflows.services import workflow_version_activate

    first, second, third = versions_of(workflow, 3)
    workflow_version_activate(version=second)
    start = timezone.now() - timedelta(minutes=10)
    done = make_invocation(second, status="completed", started=start, ended=start + timedelta(seconds=12.5),
                           usd_cost=Decimal("0.0120"))
    failed = make_invocation(third, status="failed", started=start, ended=start + timedelta(seconds=2),
                             usd_cost=Decimal("0.0030"))
    running = make_invocation(third, status="running", started=start)
    old = make_invocation(first, status="failed", usd_cost=Decimal("5"))
    WorkflowInvocation.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    golden = GoldenSet.objects.create(workspace=workflow.workspace, workflow=workflow, name="<b>faq</b>")
    eval_run(first, golden, 0.5, days_ago=3)
    eval_run(second, golden, 0.75, days_ago=1)
    eval_run(third, golden, 0.25, config={"item_ids": [1]})  # a minibatch: not a version's score

    response = staff_client.get(change_url("workflow", workflow.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert [row["hash"] for row in response.context["versions"]] == [v.dsl_hash[:12] for v in (third, second, first)]
    active_row = re.search(r'<tr class="wf-version wf-active">.*?</tr>', html, re.S).group(0)
    assert second.dsl_hash[:12] in active_row and "● Active" in active_row
    assert html.count('class="wf-version wf-active"') == 1 and "take 2" in html
    assert f"?workflow__id__exact={workflow.pk}" in html  # all versions
    # newest invocations first, each linked, with its version, status, cost and duration
    assert [row["id"] for row in response.context["invocations"]] == [running.pk, failed.pk, done.pk, old.pk]
    assert change_url("workflowinvocation", done.pk) in html
    assert "$0.0120" in html and "12.5 s" in html and 'class="wf-status wf-status-failed"' in html
    # the last 7 days: 3 invocations, 1 failed of the 2 ended, $0.0150 (the 8 days old one is not counted)
    recent = response.context["recent"]
    assert (recent["total"], recent["failed"], recent["ended"], recent["failure_rate"], recent["usd_cost"]) == (
        "3", "1", "2", "50%", "$0.0150")
    assert re.search(r'id="wf-recent-failed"><a href="[^"]*status__exact=failed">1</a> of 2 ended \(50%\)', html)
    # each number opens the list of what it counts
    def listed(url):
        return {row.pk for row in staff_client.get(url.replace("&amp;", "&")).context["cl"].result_list}

    workflow_version_create(workflow=workflow_create(workspace=workflow.workspace, name="other"), dsl=cyclic_dsl())
    assert listed(response.context["versions_url"]) == {first.pk, second.pk, third.pk}
    assert listed(response.context["recent_url"]) == {done.pk, failed.pk, running.pk}
    assert listed(response.context["recent_failed_url"]) == {failed.pk}
    # the trend: the two full-set runs, oldest first, the set's name escaped
    svg = str(response.context["trend_svg"])
    assert re.findall(r'data-score="([0-9.]+)"', svg) == ["0.500", "0.750"]
    assert "<b>faq</b>" not in html and "&lt;b&gt;faq&lt;/b&gt;" in svg


def test_workflow_list_shows_the_active_version_and_the_invocations_of_the_last_7_days(staff_client, workflow):
    from workflows.services import workflow_version_activate

    version = versions_of(workflow, 1)[0]
    workflow_version_activate(version=version)
    for _ in range(3):
        make_invocation(version)
    idle = workflow_create(workspace=workflow.workspace, name="idle")
    listing = staff_client.get(reverse("admin:workflows_workflow_changelist"))
    rows = {row.name: row for row in listing.context["cl"].result_list}
    assert (rows["research"].active_version_hash, rows["research"].invocation_count) == (version.dsl_hash, 3)
    assert (rows[idle.name].active_version_pk, rows[idle.name].invocation_count) == (None, 0)
    assert change_url("workflowversion", version.pk) in listing.content.decode()


def test_workflow_page_and_list_query_counts_do_not_grow_with_rows(staff_client, workflow):
    from evals.models import GoldenSet

    golden = GoldenSet.objects.create(workspace=workflow.workspace, workflow=workflow, name="faq")
    first = versions_of(workflow, 1)[0]
    make_invocation(first, status="completed", started=timezone.now(), ended=timezone.now())
    eval_run(first, golden, 0.5)
    page, listing = change_url("workflow", workflow.pk), reverse("admin:workflows_workflow_changelist")
    small = (count_queries(staff_client, page), count_queries(staff_client, listing))
    versions = versions_of(workflow, 12)
    for index, version in enumerate(versions):
        make_invocation(version, status="failed" if index % 3 else "completed", started=timezone.now(),
                        ended=timezone.now(), usd_cost=Decimal("0.01"))
        eval_run(version, golden, index / 12)
    for index in range(5):
        workflow_create(workspace=workflow.workspace, name=f"other-{index}")
    assert (count_queries(staff_client, page), count_queries(staff_client, listing)) == small


# ------------------------------------------------------------------------- version pages: stats and diff

def test_version_page_shows_its_invocation_stats_latest_eval_and_links(staff_client, workflow):
    from evals.models import GoldenSet

    version = versions_of(workflow, 1)[0]
    start = timezone.now() - timedelta(minutes=5)
    make_invocation(version, status="completed", started=start, ended=start + timedelta(seconds=4),
                    usd_cost=Decimal("0.0200"))
    make_invocation(version, status="failed", started=start, ended=start + timedelta(seconds=2),
                    usd_cost=Decimal("0.0100"))
    make_invocation(version, status="running", started=start)
    golden = GoldenSet.objects.create(workspace=workflow.workspace, workflow=workflow, name="faq")
    eval_run(version, golden, 0.4, days_ago=2)
    latest = eval_run(version, golden, 0.8125)
    html = staff_client.get(change_url("workflowversion", version.pk)).content.decode()
    assert re.search(r'id="wf-stats-total">3<', html)
    assert "1 of 2 ended (50%)" in html and "$0.0100" in html and "3.0 s" in html
    assert f"eval run {latest.pk}</a> on faq: score 0.812" in html
    for name in ("diff", "run", "edit"):
        assert reverse(f"admin:workflows_workflowversion_{name}", args=[version.pk]) in html


def test_diff_with_parent_shows_the_changed_prompt_and_fields_per_node(staff_client, outsider_client, workflow):
    parent = versions_of(workflow, 1)[0]
    dsl = json.loads(json.dumps(parent.dsl))
    dsl["nodes"][0]["systemPrompt"] = "You are the orchestrator.\nPlan first."
    dsl["nodes"][2]["gatewayModelId"] = "gpt-4.1"
    child, _ = workflow_version_create(workflow=workflow, dsl=dsl, operation="manual", parents=(parent,))
    url = reverse("admin:workflows_workflowversion_diff", args=[child.pk])
    assert f'href="{url}" id="wf-diff-link">Diff with parent<' in \
        staff_client.get(change_url("workflowversion", child.pk)).content.decode()
    response = staff_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<span class="wf-diff-del">-You are orchestrator, take 0.</span>' in html
    assert '<span class="wf-diff-add">+You are the orchestrator.</span>' in html
    assert '<span class="wf-diff-add">+Plan first.</span>' in html
    changes = {row["node"]: row for row in response.context["nodes"]}
    assert changes["orchestrator"]["change"] == "changed" and changes["search"]["change"] == "same"
    assert changes["left"]["fields"] == [{"name": "gatewayModelId", "old": '"gpt-4.1-mini"', "new": '"gpt-4.1"'}]
    assert response.context["dsl_lines"]  # the canonical DSL's diff
    # against another version of the workflow; a bad one is named; another workspace's version is missing
    assert staff_client.get(url + f"?against={child.pk}").context["changes"]["same"] is True
    bad = staff_client.get(url + "?against=nope")
    assert bad.status_code == 400 and "against: &#x27;nope&#x27; is not a version of research" in bad.content.decode()
    assert outsider_client.get(url).status_code == 404
    root = staff_client.get(reverse("admin:workflows_workflowversion_diff", args=[parent.pk]))
    assert root.status_code == 200 and "has no parent" in root.content.decode()


# ------------------------------------------------------------------------------------- version: run

INPUT_SCHEMA = {"type": "object", "required": ["question", "depth"], "properties": {
    "question": {"type": "string", "description": "What to research."},
    "depth": {"type": "integer", "minimum": 1, "maximum": 5},
    "temperature": {"type": "number"},
    "cite": {"type": "boolean"},
    "tone": {"enum": ["plain", "formal"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}},
    "code": {"type": "string", "maxLength": 6, "pattern": "^[A-Z]+$"},
}}


def runnable_version(workflow, **dsl_fields):
    dsl = {"entryNodeId": "answer", "nodes": [{"nodeId": "answer", "gatewayModelId": "offline-directive-v1",
                                               "systemPrompt": "Answer in one sentence.", "handOffs": ["end"]}],
           **dsl_fields}
    return workflow_version_create(workflow=workflow, dsl=dsl)[0]


def test_run_form_is_drawn_from_the_input_schema_refuses_a_bad_value_and_starts_on_a_good_one(staff_client,
                                                                                              workflow):
    version = runnable_version(workflow, inputSchema=INPUT_SCHEMA)
    url = reverse("admin:workflows_workflowversion_run", args=[version.pk])
    page = staff_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    # the required properties first, in the schema's order (its object's keys come back from jsonb sorted)
    assert page.context["form"].input_fields == ["input-question", "input-depth", "input-cite", "input-code",
                                                 "input-tags", "input-temperature", "input-tone"]
    assert re.search(r'<label for="id_input-question" class="required">question:</label>', html)
    assert re.search(r'<textarea name="input-question"[^>]*required', html) and "What to research." in html
    assert re.search(r'<input type="number" name="input-depth" min="1" max="5" required', html)
    assert re.search(r'<input type="number" name="input-temperature"[^>]*step="any"', html)
    assert '<input type="checkbox" name="input-cite"' in html
    assert re.search(r'<select name="input-tone"[^>]*>\s*<option value="" selected>---------</option>\s*'
                     r'<option value="&quot;plain&quot;">plain</option>', html)
    assert re.search(r'<textarea name="input-tags"[^>]*class="wf-code"', html)  # an array: JSON
    assert re.search(r'<input type="text" name="input-code"[^>]*maxlength="6"', html)

    good = {"input-question": "What is a durable run?", "input-depth": "2", "input-temperature": "0.5",
            "input-cite": "on", "input-tone": '"formal"', "input-tags": '["db"]', "input-code": ""}
    for field, value, problem in (("input-depth", "9", "less than or equal to 5"),
                                  ("input-tags", '["far-too-long"]', "is too long"),
                                  ("input-code", "abc", "does not match"),
                                  ("input-tags", "[NaN]", "Enter a valid JSON"),
                                  ("node_budget", "0", "greater than or equal to 1")):
        refused = staff_client.post(url, {**good, field: value})
        assert refused.status_code == 400, field
        row = re.search(rf'<div class="wf-form-row wf-has-error" data-field="{field}">.*?</div>',
                        refused.content.decode(), re.S)
        assert row is not None and problem in row.group(0), (field, refused.content.decode()[:3000])
    assert not WorkflowInvocation.objects.exists()

    started = staff_client.post(url, good)
    invocation = WorkflowInvocation.objects.get()
    assert started.status_code == 302 and started.url == change_url("workflowinvocation", invocation.pk)
    assert invocation.input == {"question": "What is a durable run?", "depth": 2, "temperature": 0.5, "cite": True,
                                "tone": "formal", "tags": ["db"]}
    assert invocation.workflow_version == version and invocation.durable_run_id
    assert any(f"Started invocation {invocation.pk}" in text for text in messages_of(started))


def test_run_without_an_input_schema_takes_json_and_a_version_that_cannot_run_is_refused(staff_client, workflow):
    version = runnable_version(workflow)
    url = reverse("admin:workflows_workflowversion_run", args=[version.pk])
    html = staff_client.get(url).content.decode()
    assert re.search(r'<textarea name="input"[^>]*>\n\{&quot;text&quot;: &quot;&quot;\}</textarea>', html)
    bad = staff_client.post(url, {"input": "{not json"})
    assert bad.status_code == 400 and "Enter a valid JSON." in bad.content.decode()
    assert not WorkflowInvocation.objects.exists()
    assert staff_client.post(url, {"input": '"Hello"'}).status_code == 302
    assert WorkflowInvocation.objects.get().input == "Hello"

    lacking = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())[0]  # an MCP tool nobody provides
    url = reverse("admin:workflows_workflowversion_run", args=[lacking.pk])
    assert "search.tavily is not available" in staff_client.get(url).content.decode()
    refused = staff_client.post(url, {"input": "{}"})
    assert refused.status_code == 400 and "Not started" in refused.content.decode()
    assert WorkflowInvocation.objects.count() == 1


def test_run_form_matches_the_schema_s_patterns_under_a_time_limit_and_refuses_a_schema_that_loops(
        staff_client, workflow, monkeypatch):
    from workflows import services

    monkeypatch.setattr(services, "INPUT_PATTERN_TIMEOUT_SECONDS", 0.1)
    version = runnable_version(workflow, inputSchema={"type": "object", "properties": {
        "code": {"type": "string", "pattern": "(a?){32}a{32}"}}})
    url = reverse("admin:workflows_workflowversion_run", args=[version.pk])
    with finishes_within(30):
        refused = staff_client.post(url, {"input-code": ("a" * 31 + "b") * 150})
    assert refused.status_code == 400
    row = re.search(r'<div class="wf-form-row wf-has-error" data-field="input-code">.*?</div>',
                    refused.content.decode(), re.S)
    assert row is not None and "did not finish within 0.1 s" in row.group(0)
    assert staff_client.post(url, {"input-code": "a" * 40}).status_code == 302  # a match in time starts

    looping = runnable_version(workflow, inputSchema={"type": "object", "properties": {
        "deep": {"$ref": "#/properties/deep"}}})
    refused = staff_client.post(reverse("admin:workflows_workflowversion_run", args=[looping.pk]), {"input-deep": "1"})
    assert refused.status_code == 400 and "refers to itself" in refused.content.decode()
    deep = staff_client.post(reverse("admin:workflows_workflowversion_run", args=[runnable_version(workflow).pk]),
                             {"input": "[" * 100_000 + "]" * 100_000})
    assert deep.status_code == 400 and "nested too deeply" in deep.content.decode()
    assert WorkflowInvocation.objects.count() == 1


# ------------------------------------------------------------------------------------ version: edit

def test_edit_as_new_version_saves_a_manual_child_and_the_same_dsl_leads_to_its_version(staff_client, staff,
                                                                                         workflow):
    version = versions_of(workflow, 1)[0]
    url = reverse("admin:workflows_workflowversion_edit", args=[version.pk])
    page = staff_client.get(url)
    assert page.status_code == 200
    assert page.context["form"]["dsl"].value() == pretty_json(version.dsl)
    assert '<textarea name="dsl"' in page.content.decode()
    dsl = json.loads(json.dumps(version.dsl))
    dsl["nodes"][0]["systemPrompt"] = "Plan, then delegate."

    saved = staff_client.post(url, {"dsl": json.dumps(dsl), "commit_message": "orchestrator: plan first"})
    child = WorkflowVersion.objects.exclude(pk=version.pk).get()
    assert saved.status_code == 302 and saved.url == change_url("workflowversion", child.pk)
    assert (child.operation, child.parent1_id, child.parent2_id, child.commit_message, child.created_by_id) == (
        "manual", version.pk, None, "orchestrator: plan first", staff.pk)
    assert child.dsl["nodes"][0]["systemPrompt"] == "Plan, then delegate."
    assert any("Saved version" in text for text in messages_of(saved))

    again = staff_client.post(url, {"dsl": json.dumps(dsl, indent=4), "commit_message": "again"})
    assert again.status_code == 302 and again.url == change_url("workflowversion", child.pk)
    assert any("already has this DSL" in text for text in messages_of(again))
    unchanged = staff_client.post(url, {"dsl": pretty_json(version.dsl), "commit_message": "no change"})
    assert unchanged.url == change_url("workflowversion", version.pk)
    assert any("unchanged" in text for text in messages_of(unchanged))
    assert WorkflowVersion.objects.count() == 2


def test_edit_shows_dsl_errors_on_their_node_and_field_and_keeps_the_text(staff_client, workflow):
    version = versions_of(workflow, 1)[0]
    url = reverse("admin:workflows_workflowversion_edit", args=[version.pk])
    dsl = json.loads(json.dumps(version.dsl))
    dsl["nodes"][1]["handOffs"] = ["nowhere"]
    dsl["nodes"][3]["maxSteps"] = 500
    del dsl["nodes"][2]["nodeId"]
    text = json.dumps(dsl, indent=1)
    refused = staff_client.post(url, {"dsl": text, "commit_message": "broken"})
    assert refused.status_code == 400
    html = refused.content.decode()
    groups = {group["label"]: group["problems"] for group in refused.context["groups"]}
    assert {"field": "handOffs", "message": "unknown hand-off target 'nowhere'"} in groups["node search"]
    assert {"field": "maxSteps", "message": "must be a whole number from 1 to 50"} in groups["node right"]
    assert {"field": "nodeId", "message": "is required"} in groups["node #3 (no nodeId)"]  # by its position
    assert re.search(r'data-node-id="search">node search</h3>\s*<ul><li class="wf-dsl-error" data-field="handOffs">'
                     r'<code>handOffs</code>: unknown hand-off target &#x27;nowhere&#x27;</li>', html)
    assert refused.context["form"]["dsl"].value() == text  # the operator's text, as typed
    assert WorkflowVersion.objects.count() == 1

    not_json = staff_client.post(url, {"dsl": '{"nodes": [', "commit_message": "x"})
    assert not_json.status_code == 400 and "Not JSON: Expecting value (line 1, column 12)." in not_json.content.decode()
    nan = staff_client.post(url, {"dsl": json.dumps(dsl).replace("500", "NaN"), "commit_message": "x"})
    assert nan.status_code == 400 and "NaN is not a JSON number" in nan.content.decode()
    assert WorkflowVersion.objects.count() == 1


def test_version_views_refuse_another_workspace_a_user_without_permission_and_a_post_without_csrf(
        staff, outsider_client, workspace, workflow):
    version = runnable_version(workflow)
    urls = {name: reverse(f"admin:workflows_workflowversion_{name}", args=[version.pk])
            for name in ("diff", "run", "edit")}
    for name, url in urls.items():
        assert outsider_client.get(url).status_code == 404, name
        assert outsider_client.post(url, {"input": "{}"}).status_code == 404, name

    viewer = client_of(staff_user("viewer", workspace, codenames=["view_workflowversion", "view_workflowinvocation"]))
    assert viewer.get(urls["diff"]).status_code == 200
    page = viewer.get(change_url("workflowversion", version.pk)).content.decode()
    assert 'id="wf-run-link"' not in page and 'id="wf-edit-link"' not in page
    for name in ("run", "edit"):
        assert viewer.get(urls[name]).status_code == 403, name
    assert viewer.post(urls["run"], {"input": "{}"}).status_code == 403
    assert viewer.post(urls["edit"], {"dsl": json.dumps(cyclic_dsl()), "commit_message": "x"}).status_code == 403

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(staff)
    assert strict.get(urls["edit"]).status_code == 200
    assert strict.post(urls["run"], {"input": "{}"}).status_code == 403
    assert strict.post(urls["edit"], {"dsl": json.dumps(cyclic_dsl()), "commit_message": "x"}).status_code == 403
    assert not WorkflowInvocation.objects.exists() and WorkflowVersion.objects.count() == 1


def test_version_page_query_count_does_not_grow_with_invocations_or_eval_runs(staff_client, workflow):
    from evals.models import GoldenSet

    golden = GoldenSet.objects.create(workspace=workflow.workspace, workflow=workflow, name="faq")
    version = versions_of(workflow, 1)[0]
    make_invocation(version, status="completed", started=timezone.now(), ended=timezone.now())
    url = change_url("workflowversion", version.pk)
    small = count_queries(staff_client, url)
    for index in range(15):
        make_invocation(version, status="failed" if index % 2 else "completed", started=timezone.now(),
                        ended=timezone.now(), usd_cost=Decimal("0.01"))
        eval_run(version, golden, index / 15)
    assert count_queries(staff_client, url) == small


def test_the_version_pages_escape_the_schema_the_dsl_and_its_errors(staff_client, workflow):
    version = runnable_version(workflow, inputSchema={"type": "object", "properties": {
        XSS_ID: {"type": "string", "title": XSS_PROMPT, "description": XSS_PROMPT},
        "tone": {"enum": [XSS_ID]}}})
    run = staff_client.get(reverse("admin:workflows_workflowversion_run", args=[version.pk])).content.decode()
    edit_url = reverse("admin:workflows_workflowversion_edit", args=[version.pk])
    dsl = json.loads(json.dumps(version.dsl))
    dsl["nodes"][0]["handOffs"] = [XSS_ID]
    refused = staff_client.post(edit_url, {"dsl": json.dumps(dsl), "commit_message": XSS_PROMPT}).content.decode()
    other = workflow_version_create(workflow=workflow_create(workspace=workflow.workspace, name="other"),
                                    dsl=cyclic_dsl())[0]
    diff = staff_client.get(reverse("admin:workflows_workflowversion_diff", args=[version.pk])
                            + f"?against={other.pk}")
    assert diff.status_code == 400  # a version of another workflow
    for html in (run, refused, staff_client.get(edit_url).content.decode(), diff.content.decode()):
        assert XSS_ID not in html and XSS_PROMPT not in html
    assert "&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;" in run and "unknown hand-off target" in refused
