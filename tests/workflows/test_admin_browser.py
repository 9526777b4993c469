"""The workflows admin in a real browser (Debian's Chromium through Playwright, against live_server):
the version page's SVG graph, the invocation page's timeline and messages, and an approval through
the form. Screenshots of both pages land in the test's tmp_path."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from durable import services
from tests.browser import assert_fits_the_screen, assert_readable, log_in
from tests.factories import MembershipFactory
from tests.workflows.test_admin import cyclic_dsl
from workflows.models import Message, NodeInvocation, WorkflowInvocation, WorkflowVersion
from workflows.services import workflow_create, workflow_version_create

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def scene(transactional_db, workspace, settings):
    """Data is written before Playwright starts: its sync API switches greenlets, and ORM calls made
    inside it open connections of their own that outlive the test."""
    settings.DURABLE_DISPATCH_ENABLED = False  # the approval's signal is buffered; no worker needed
    operator = get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    MembershipFactory(user=operator, workspace=workspace)

    version, _ = workflow_version_create(workflow=workflow_create(workspace=workspace, name="research"),
                                         dsl=cyclic_dsl())
    services.run_create(run_id="wfi-browser", workflow="workflows.invoke", input={}, dispatch=False,
                        namespace=workspace.namespace)
    start = timezone.now() - timedelta(seconds=20)
    invocation = WorkflowInvocation.objects.create(
        workspace=workspace, workflow_version=version, status="waiting", usd_budget=Decimal("1"), started_at=start,
        durable_run_id="wfi-browser", input={"text": "Compare durable engines."}, node_count=3)

    def node(seq, node_id, status, begin, end, model="gpt-4.1-mini", **fields):
        return NodeInvocation.objects.create(
            workflow_invocation=invocation, seq=seq, node_id=node_id, status=status, model=model,
            started_at=start + timedelta(seconds=begin), ended_at=start + timedelta(seconds=end) if end else None,
            **fields)

    # as a real fan-out node reads: a provider-prefixed model, a cost, cache hits, several next nodes
    first = node(1, "orchestrator", "completed", 0, 4, input_tokens=312_450, output_tokens=48_210,
                 model="openrouter#meta-llama/llama-3.3-70b-instruct-turbo", usd_cost=Decimal("0.0270"),
                 llm_calls=12, cache_hits=3, tool_calls=9,
                 next_nodes=["search", "critic_of_sources", "fact_checker", "summarizer", "style_editor"])
    second = node(2, "search", "completed", 4, 12, input_tokens=500, output_tokens=80)
    node(3, "merge", "waiting", 12, None, output="Engines compared.",
         approval={"pending": True, "run_id": "wfi-browser", "signal": "approval:3"})
    Message.objects.bulk_create([
        Message(workflow_invocation=invocation, node_invocation=first, seq=10_000, role="data",
                to_node_id="orchestrator", payload={"text": "Compare durable engines."}),
        Message(workflow_invocation=invocation, node_invocation=first, seq=10_001, role="assistant",
                payload={"content": "", "tool_calls": [{"id": "c1", "name": "knowledge_search",
                                                        "arguments": {"query": "durable engines"}}],
                         "usage": {"input_tokens": 150, "output_tokens": 20}, "model": "gpt-4.1-mini"}),
        Message(workflow_invocation=invocation, node_invocation=first, seq=10_002, role="tool",
                payload={"content": "Temporal, DBOS and this engine.", "name": "knowledge_search",
                         "tool_call_id": "c1"}),
        Message(workflow_invocation=invocation, node_invocation=second, seq=20_000, role="delegation",
                from_node_id="orchestrator", to_node_id="search", payload={"text": "Search the engines."}),
    ])
    return {"version": version, "invocation": invocation}


@pytest.fixture
def page(scene, browser_page):
    return browser_page


def test_operator_reads_the_graph_and_the_timeline_and_approves_a_node(live_server, scene, page, tmp_path):
    log_in(page, live_server)

    # the version page: one box per node, `end`, and the edges styled by kind
    page.goto(live_server.url + reverse("admin:workflows_workflowversion_change", args=[scene["version"].pk]))
    svg = page.locator("svg.workflow-graph")
    svg.wait_for(state="visible")
    boxes = svg.locator("g.node")
    assert boxes.count() == 5
    assert sorted(boxes.nth(index).get_attribute("data-node-id") for index in range(5)) == [
        "left", "merge", "orchestrator", "right", "search"]
    assert svg.locator("g.node-end").count() == 1
    assert svg.locator("path.edge").count() == 9
    assert svg.locator("path.edge-parallel").count() == 2
    assert svg.locator("path.edge-conditional").count() == 2
    assert svg.locator("path.edge-waitfor").count() == 2
    assert svg.locator('path.edge-back[data-from="merge"][data-to="orchestrator"]').count() == 1
    drawn = {boxes.nth(index).get_attribute("data-node-id"): boxes.nth(index).bounding_box() for index in range(5)}
    assert all(box["width"] > 100 and box["height"] > 40 for box in drawn.values())
    # layered from the entry: orchestrator above search, above left/right side by side, above merge
    assert drawn["orchestrator"]["y"] < drawn["search"]["y"] < drawn["left"]["y"] < drawn["merge"]["y"]
    assert drawn["left"]["y"] == drawn["right"]["y"]
    assert drawn["left"]["x"] + drawn["left"]["width"] <= drawn["right"]["x"]
    assert page.locator("#wf-node-table tbody tr").count() == 5
    page.screenshot(path=str(tmp_path / "workflow-version.png"), full_page=True)
    assert_fits_the_screen(page)

    # the invocation page: a timeline row per node invocation, the messages, the waiting node's form
    page.goto(live_server.url + reverse("admin:workflows_workflowinvocation_change", args=[scene["invocation"].pk]))
    timeline = page.locator("#wf-timeline")
    timeline.wait_for(state="visible")
    assert timeline.locator(".wf-tl-row").count() == 3
    bars = [timeline.locator(".wf-tl-bar").nth(index).bounding_box() for index in range(3)]
    assert all(bar["width"] > 0 for bar in bars)
    assert bars[0]["x"] < bars[1]["x"] < bars[2]["x"]  # later nodes start further right
    first = page.locator("#node-1")
    assert first.locator("tr.wf-message").count() == 3
    assert "knowledge_search" in first.inner_text() and "Temporal, DBOS and this engine." in first.inner_text()
    assert "orchestrator → search" in page.locator("#node-2").inner_text()
    page.screenshot(path=str(tmp_path / "workflow-invocation.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "workflow-invocation-dark.png")
    assert_fits_the_screen(page)
    close = page.locator("a.closelink").bounding_box()
    assert close["y"] > page.locator("#wf-context").bounding_box()["y"]  # the page ends with it

    approval = page.locator("#approval-3")
    approval.locator("textarea[name=comment]").fill("Good comparison.")
    approval.locator("button.wf-approve").click()
    page.wait_for_selector(".messagelist .success")
    assert "Approved node merge (#3)" in page.locator(".messagelist").inner_text()
    sent = page.locator("#node-3 .wf-decision-sent")
    assert "Decision sent: approve" in sent.inner_text() and "Good comparison." in sent.inner_text()
    assert page.locator("#approval-3").count() == 0
    assert (tmp_path / "workflow-version.png").stat().st_size > 10_000


CONSOLE_SCHEMA = {"type": "object", "required": ["question"], "properties": {
    "question": {"type": "string", "description": "What the workflow researches."},
    "depth": {"type": "integer", "minimum": 1, "maximum": 5, "description": "How many sources to read."},
    "tone": {"enum": ["plain", "formal"]},
    "cite": {"type": "boolean", "description": "Cite the sources."},
}}


def console_dsl(writer_prompt: str) -> dict:
    def node(node_id, prompt, handoffs):
        return {"nodeId": node_id, "gatewayModelId": "offline-directive-v1", "systemPrompt": prompt,
                "handOffs": handoffs, "description": f"The {node_id}."}

    return {"entryNodeId": "planner", "inputSchema": CONSOLE_SCHEMA, "nodes": [
        node("planner", "Plan the research: list the questions to answer.", ["writer"]),
        node("writer", writer_prompt, ["end"]),
    ]}


@pytest.fixture
def console(transactional_db, workspace, settings):
    """A workflow with a lineage of versions (the middle one active), eval runs on two golden sets and invocations
    of every status; written before Playwright starts (see `scene`)."""
    from evals.models import EvalRun, GoldenSet
    from workflows.services import workflow_version_activate

    settings.DURABLE_DISPATCH_ENABLED = False  # the run page's invocation is queued; no worker needed
    operator = get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    MembershipFactory(user=operator, workspace=workspace)
    workflow = workflow_create(workspace=workspace, name="research-assistant")
    versions = []
    for index in range(6):
        prompt = f"Write the answer in {index + 2} short paragraphs.\nCite every source by its title."
        versions.append(workflow_version_create(
            workflow=workflow, dsl=console_dsl(prompt), parents=versions[-1:],
            operation="manual" if versions else "init",
            commit_message=f"writer: {index + 2} paragraphs" if versions else "first version")[0])
    for index, version in enumerate(versions):
        WorkflowVersion.objects.filter(pk=version.pk).update(avg_score=0.42 + 0.08 * index,
                                                             pass_rate=0.5 + 0.05 * index)
    workflow_version_activate(version=versions[3])
    now = timezone.now()
    sets = [GoldenSet.objects.create(workspace=workspace, workflow=workflow, name=name)
            for name in ("research questions", "citations (hard)")]
    for index, version in enumerate(versions):
        for offset, golden in enumerate(sets):
            run = EvalRun.objects.create(workspace=workspace, golden_set=golden, workflow_version=version,
                                         status="completed", avg_score=0.42 + 0.08 * index - 0.15 * offset,
                                         pass_rate=0.5 + 0.05 * index)
            EvalRun.objects.filter(pk=run.pk).update(created_at=now - timedelta(days=6 - index, hours=offset))
    for index, status in enumerate(["completed", "completed", "failed", "running", "completed", "cancelled"]):
        start = now - timedelta(hours=index * 3)
        WorkflowInvocation.objects.create(
            workspace=workspace, workflow_version=versions[3 + index % 3], status=status, usd_budget=Decimal("1"),
            usd_cost=Decimal("0.0270") * (index + 1), started_at=start,
            ended_at=None if status == "running" else start + timedelta(seconds=8 + index),
            input={"question": "What is a durable run?"})
    return {"workflow": workflow, "version": versions[-1], "parent": versions[-2]}


def test_operator_reads_a_workflow_diffs_runs_and_edits_a_version(live_server, console, browser_page, tmp_path):
    page = browser_page
    log_in(page, live_server)
    version = console["version"]

    # the workflow page: the last 7 days, the score trend, the versions (the active one marked), the invocations
    page.goto(live_server.url + reverse("admin:workflows_workflow_change", args=[console["workflow"].pk]))
    page.locator("svg.wf-trend").wait_for(state="visible")
    assert page.locator("svg.wf-trend .wf-trend-series").count() == 2
    assert page.locator("svg.wf-trend circle.wf-trend-point").count() == 12
    assert page.locator("#wf-version-table tr.wf-version").count() == 6
    assert "Active" in page.locator("#wf-version-table tr.wf-active").inner_text()
    assert page.locator("#wf-invocation-table tr.wf-invocation").count() == 6
    assert "1 of 5 ended (20%)" in page.locator("#wf-recent-failed").inner_text()
    page.screenshot(path=str(tmp_path / "workflow.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "workflow-dark.png")
    assert_fits_the_screen(page)

    # the newest version's page, from the versions table
    page.locator("#wf-version-table tr.wf-version").first.locator("a").click()
    page.locator("#wf-version-stats").wait_for(state="visible")
    assert version.dsl_hash[:12] in page.locator("#content").inner_text()
    page.screenshot(path=str(tmp_path / "version.png"), full_page=True)
    assert_fits_the_screen(page)

    # diff with parent: the writer's prompt changed, red and green
    page.click("#wf-diff-link")
    page.locator("#wf-diff-nodes").wait_for(state="visible")
    writer = page.locator('tr.wf-diff-node[data-node-id="writer"]')
    assert "changed" in writer.inner_text()
    assert writer.locator(".wf-diff-del").first.inner_text() == "-Write the answer in 6 short paragraphs."
    assert writer.locator(".wf-diff-add").first.inner_text() == "+Write the answer in 7 short paragraphs."
    assert page.locator("#wf-dsl-diff .wf-diff-add").count() >= 1
    page.screenshot(path=str(tmp_path / "version-diff.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "version-diff-dark.png")
    assert_fits_the_screen(page)

    # run: the form drawn from the input schema; a bad value is refused on its field, a good one starts
    page.click("text=Back to the version")
    page.click("#wf-run-link")
    form = page.locator("#wf-run-form")
    form.wait_for(state="visible")
    form.locator("textarea[name='input-question']").fill("What is a durable run?")
    form.locator("input[name='input-depth']").fill("9")
    form.locator("select[name='input-tone']").select_option(label="formal")
    form.locator("input[name='input-cite']").check()
    form.locator("#wf-run-submit").click()
    depth = page.locator('.wf-form-row[data-field="input-depth"]')
    depth.locator(".errorlist").wait_for(state="visible")
    assert "less than or equal to 5" in depth.inner_text()
    assert page.locator("textarea[name='input-question']").input_value() == "What is a durable run?"
    page.locator("input[name='input-depth']").fill("3")
    page.screenshot(path=str(tmp_path / "version-run.png"), full_page=True)
    assert_fits_the_screen(page)
    page.locator("#wf-run-submit").click()
    page.wait_for_selector(".messagelist .success")
    assert "Started invocation" in page.locator(".messagelist").inner_text()
    assert "/admin/workflows/workflowinvocation/" in page.url

    # edit as new version: an error is listed by node and field and the text kept; the fix saves a child version
    page.goto(live_server.url + reverse("admin:workflows_workflowversion_change", args=[version.pk]))
    page.click("#wf-edit-link")
    editor = page.locator("textarea[name='dsl']")
    editor.wait_for(state="visible")
    broken = editor.input_value().replace('"end"', '"the-end"')
    editor.fill(broken)
    page.fill("input[name='commit_message']", "writer: eight paragraphs")
    page.click("#wf-edit-submit")
    errors = page.locator("#wf-dsl-errors")
    errors.wait_for(state="visible")
    assert "node writer" in errors.inner_text() and "unknown hand-off target 'the-end'" in errors.inner_text()
    assert page.locator("textarea[name='dsl']").input_value() == broken
    page.screenshot(path=str(tmp_path / "version-edit-errors.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "version-edit-errors-dark.png")
    assert_fits_the_screen(page)
    page.locator("textarea[name='dsl']").fill(broken.replace('"the-end"', '"end"').replace("7 short", "8 short"))
    page.screenshot(path=str(tmp_path / "version-edit.png"), full_page=True)
    page.click("#wf-edit-submit")
    page.wait_for_selector(".messagelist .success")
    assert "Saved version" in page.locator(".messagelist").inner_text()
    assert "Manual edit" in page.locator("#content").inner_text()
    page.screenshot(path=str(tmp_path / "version-edited.png"), full_page=True)
    assert (tmp_path / "workflow.png").stat().st_size > 10_000


@pytest.fixture
def traced_scene(transactional_db, workspace, settings):
    """A completed invocation whose tool result says a rare word, a golden set to add it to, and an invocation
    whose node waits for approval on a real (pending) run, for an operator who may add golden items."""
    from evals.models import GoldenSet

    settings.DURABLE_DISPATCH_ENABLED = False  # the decision's signal is buffered; no worker needed
    operator = get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=["workflows", "evals"]))
    MembershipFactory(user=operator, workspace=workspace)
    workflow = workflow_create(workspace=workspace, name="research")
    version, _ = workflow_version_create(workflow=workflow, dsl=cyclic_dsl())
    GoldenSet.objects.create(workspace=workspace, name="physics questions", workflow=workflow)
    start = timezone.now() - timedelta(seconds=30)
    done = WorkflowInvocation.objects.create(
        workspace=workspace, workflow_version=version, status="completed", usd_budget=Decimal("1"),
        started_at=start, ended_at=start + timedelta(seconds=9), input={"text": "How much power does it need?"},
        output={"text": "It needs 1.21 gigawatts.", "node_id": "orchestrator"}, usd_cost=Decimal("0.004"),
        node_count=2)
    first = NodeInvocation.objects.create(
        workflow_invocation=done, seq=1, node_id="orchestrator", status="completed", model="gpt-4.1-mini",
        started_at=start, ended_at=start + timedelta(seconds=6), llm_calls=2, tool_calls=1, next_nodes=["search"])
    second = NodeInvocation.objects.create(
        workflow_invocation=done, seq=2, node_id="search", status="completed", model="gpt-4.1-mini",
        started_at=start + timedelta(seconds=6), ended_at=start + timedelta(seconds=9), llm_calls=1)
    said = [
        (first, 10_000, "user", {"content": "How much power does it need?"}, 0.2),
        (first, 10_001, "assistant", {"content": "", "model": "gpt-4.1-mini", "latency_ms": 1800,
                                      "tool_calls": [{"id": "c1", "name": "knowledge_search",
                                                      "arguments": {"query": "flux capacitor power"}}],
                                      "usage": {"input_tokens": 320, "output_tokens": 24, "usd_cost": "0.0011"}}, 2),
        (first, 10_002, "tool", {"content": "The flux capacitor needs 1.21 gigawatts.", "name": "knowledge_search",
                                 "tool_call_id": "c1", "latency_ms": 650}, 2.7),
        (first, 10_003, "assistant", {"content": "It needs 1.21 gigawatts.", "model": "gpt-4.1-mini",
                                      "latency_ms": 2400, "cache_hit": True,
                                      "usage": {"input_tokens": 410, "output_tokens": 12, "usd_cost": "0.0014"}}, 5.5),
        (second, 20_000, "assistant", {"content": "Confirmed.", "model": "gpt-4.1-mini", "latency_ms": 2100,
                                       "usage": {"input_tokens": 90, "output_tokens": 4, "usd_cost": "0.0003"}}, 8.5),
    ]
    for node, seq, role, payload, _ in said:
        Message.objects.create(workflow_invocation=done, node_invocation=node, seq=seq, role=role, payload=payload)
    for _node, seq, _role, _payload, at in said:
        Message.objects.filter(workflow_invocation=done, seq=seq).update(created_at=start + timedelta(seconds=at))

    services.run_create(run_id="wfi-revise", workflow="workflows.invoke", input={}, dispatch=False,
                        namespace=workspace.namespace)
    waiting = WorkflowInvocation.objects.create(
        workspace=workspace, workflow_version=version, status="waiting", usd_budget=Decimal("1"),
        started_at=start, durable_run_id="wfi-revise", input={"text": "Draft the announcement."}, node_count=1)
    NodeInvocation.objects.create(workflow_invocation=waiting, seq=1, node_id="merge", status="waiting",
                                  model="gpt-4.1-mini", started_at=start, output="We ship on Friday.",
                                  approval={"pending": True, "run_id": "wfi-revise", "signal": "approval:1"})
    return {"done": done, "waiting": waiting}


@pytest.fixture
def traced_page(traced_scene, browser_page):
    return browser_page


def test_operator_finds_a_trace_reads_its_spans_adds_it_to_a_golden_set_and_asks_for_a_revision(
        live_server, traced_scene, traced_page, tmp_path):
    page = traced_page
    log_in(page, live_server)
    # the search box finds the invocation by a word of its tool result
    page.goto(live_server.url + reverse("admin:workflows_workflowinvocation_changelist"))
    page.fill("#searchbar", "gigawatts")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "research" in rows.first.inner_text()
    assert page.locator("#changelist-filter").is_visible()
    assert "tool" in page.locator("#changelist-filter").inner_text()
    page.screenshot(path=str(tmp_path / "invocation-search.png"), full_page=True)
    assert_fits_the_screen(page)

    # its page: the span tree, node -> model calls -> the tool call of the first round
    rows.first.locator("th a, td a").first.click()
    tree = page.locator("#wf-spans")
    tree.wait_for(state="visible")
    assert tree.locator("li.wf-span-node").count() == 2
    first = tree.locator('li.wf-span-node[data-seq="1"]')
    assert first.locator("li.wf-span-llm").count() == 2
    tool = first.locator("li.wf-span-llm").first.locator("li.wf-span-tool")
    assert tool.count() == 1 and "knowledge_search" in tool.inner_text()
    assert "cached" in first.locator("li.wf-span-llm").nth(1).inner_text()
    bars = [first.locator(".wf-span-bar").nth(index).bounding_box() for index in range(4)]
    assert all(bar["width"] > 0 for bar in bars) and bars[1]["x"] < bars[2]["x"] < bars[3]["x"]
    page.screenshot(path=str(tmp_path / "invocation-spans.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "invocation-spans-dark.png")
    assert_fits_the_screen(page)

    # add it to a golden set: the form is prefilled from the invocation, the expected answer edited
    page.locator("#ev-add-item > summary").click()
    form = page.locator("#ev-add-item-form")
    assert "It needs 1.21 gigawatts." in form.locator("textarea[name=expected_output]").input_value()
    form.locator("textarea[name=expected_output]").fill("1.21 gigawatts")
    form.locator("input[name=tags]").fill("critical")
    page.screenshot(path=str(tmp_path / "invocation-add-to-golden-set.png"), full_page=True)
    form.locator("#ev-add-item-submit").click()
    page.wait_for_selector(".messagelist .success")
    assert "Added item #1" in page.locator(".messagelist").inner_text()
    assert "physics questions" in page.locator(".messagelist").inner_text()

    # a node waiting for approval: Reject with comment, then revise
    page.goto(live_server.url + reverse("admin:workflows_workflowinvocation_change",
                                        args=[traced_scene["waiting"].pk]))
    approval = page.locator("#approval-1")
    approval.wait_for(state="visible")
    assert not approval.locator("button.wf-revise").is_visible()
    approval.locator("summary", has_text="Reject with comment").click()
    approval.locator("textarea[name=comment]").fill("Say which features ship.")
    page.screenshot(path=str(tmp_path / "invocation-reject-with-comment.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "invocation-reject-with-comment-dark.png")
    assert_fits_the_screen(page)
    approval.locator("button.wf-revise").click()
    page.wait_for_selector(".messagelist .success")
    assert "for a revision" in page.locator(".messagelist").inner_text()
    sent = page.locator("#node-1 .wf-decision-sent")
    assert "Decision sent: revise" in sent.inner_text() and "Say which features ship." in sent.inner_text()
    page.screenshot(path=str(tmp_path / "invocation-revise-sent.png"), full_page=True)
