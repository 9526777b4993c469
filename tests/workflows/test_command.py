"""manage.py workflow: import DSL files, export a version, diff two versions."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.workflows.test_dsl import two_nodes
from workflows.models import Workflow, WorkflowVersion

SEED_FILE = Path(__file__).parent / "data" / "seed_export.json"
pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("workflow", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_import_export_round_trip_and_idempotence(workspace, tmp_path):
    first = run("import", str(SEED_FILE), "--workspace", workspace.slug)
    assert "imported as version" in first and "researcher.tavily" in first
    assert "already there" in run("import", str(SEED_FILE), "--workspace", workspace.slug)
    version = WorkflowVersion.objects.get(workflow__name="seed_export")
    exported = json.loads(run("export", version.dsl_hash[:10]))
    assert exported == version.dsl
    path = tmp_path / "again.json"
    path.write_text(json.dumps(exported))
    assert "already there" in run("import", str(path), "--workspace", workspace.slug, "--workflow", "seed_export")


def test_a_bad_file_is_reported_by_field_and_the_others_still_import(workspace, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(two_nodes(entryNodeId="ghost")))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(two_nodes()))
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 2"):
        call_command("workflow", "import", str(bad), str(good), "--workspace", workspace.slug, stdout=out,
                     stderr=out)
    assert "entryNodeId: names no node: 'ghost'" in out.getvalue()
    assert Workflow.objects.filter(name="good").exists() and not WorkflowVersion.objects.filter(
        workflow__name="bad").exists()


def test_diff_names_changed_nodes_and_shows_the_prompt_change(workspace, tmp_path):
    old = tmp_path / "flow.json"
    old.write_text(json.dumps(two_nodes()))
    run("import", str(old), "--workspace", workspace.slug)
    changed = two_nodes()
    changed["nodes"][0]["systemPrompt"] = "Plan in three steps."
    changed["nodes"][1]["codeTools"] = ["skill_load"]
    new = tmp_path / "flow2.json"
    new.write_text(json.dumps(changed))
    run("import", str(new), "--workspace", workspace.slug, "--workflow", "flow")
    a, b = WorkflowVersion.objects.filter(workflow__name="flow").order_by("pk")
    out = run("diff", str(a.pk), str(b.pk))
    assert "planner: changed (systemPrompt)" in out
    assert "-Plan." in out and "+Plan in three steps." in out
    assert "writer: changed (codeTools)" in out
    assert "The two versions are the same" in run("diff", str(a.pk), str(a.pk))


def test_unknown_references_are_clear_errors(workspace):
    with pytest.raises(CommandError, match="no version"):
        run("export", "abcdef")
    with pytest.raises(CommandError, match="at least 6"):
        run("export", "abc")
    with pytest.raises(CommandError, match="No workspace"):
        run("import", str(SEED_FILE), "--workspace", "nowhere")


@pytest.mark.django_db(transaction=True)
def test_run_prints_each_node_then_the_output(workspace):
    from tests.builders import graph, node
    from workflows.services import workflow_create, workflow_version_create

    workflow = workflow_create(workspace=workspace, name="two steps")
    version, _ = workflow_version_create(workflow=workflow, dsl=graph(
        "plan", node("plan", prompt="Answer in one sentence.", handoffs=["write"]),
        node("write", prompt="Answer as a bullet list.", handoffs=["end"])))
    out = run("run", str(version.pk), "--input", json.dumps({"text": "What is a durable run?"}))
    assert "[1] plan: completed (offline-directive-v1, 1 calls" in out and "-> write" in out
    assert "[2] write: completed" in out and "-> end" in out
    assert "completed: 2 node invocations, 2 model calls" in out
    assert out.rstrip().splitlines()[-1].startswith("- ")  # the writer's bullet list is the output


@pytest.mark.django_db(transaction=True)
def test_run_refuses_bad_input_and_a_version_that_cannot_run(workspace):
    from tests.builders import graph, node
    from workflows.services import workflow_create, workflow_version_create

    workflow = workflow_create(workspace=workspace, name="lacking")
    version, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", tools=["tavily"])))
    with pytest.raises(CommandError, match="--input is not JSON"):
        run("run", str(version.pk), "--input", "{nope")
    with pytest.raises(CommandError, match=r"tools: a\.tavily"):
        run("run", str(version.pk))
    typed = workflow_create(workspace=workspace, name="typed")
    schema = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
    typed_version, _ = workflow_version_create(workflow=typed, dsl={**graph("a", node("a")), "inputSchema": schema})
    with pytest.raises(CommandError, match=r"input: \(the input\): 'text' is a required property"):
        run("run", str(typed_version.pk), "--input", json.dumps({"question": "?"}))
    with pytest.raises(CommandError, match="node budget exceeded"):
        cyclic, _ = workflow_version_create(workflow=workflow, dsl=graph(
            "a", node("a", handoffs=["b"]), node("b", handoffs=["a"])))
        run("run", str(cyclic.pk), "--node-budget", "3")
