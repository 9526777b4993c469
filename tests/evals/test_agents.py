"""The 7 canonical agents: their files, `seed_agents` (idempotent, updates, prune, the command), and their
golden sets scored offline: each base leaves room to improve, and a variant with the directives the offline
model obeys scores higher on the same set."""

import copy
import dataclasses
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from jsonschema import Draft202012Validator

from evals import agents
from evals.agents import load_agents, model_tiers, seed_agents
from evals.graders import validate_graders
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet
from evals.selectors import split_plan
from llm.chat import model_problem
from llm.offline_directives import DIRECTIVES
from workflows import dsl as dsl_module
from workflows.models import NodeInvocation, Workflow, WorkflowVersion

pytestmark = pytest.mark.django_db

CANONICAL = {  # docs/canonical-agents.md: name -> (model tier, temperature)
    "General Assistant": ("haiku", 0.6), "Research Analyst": ("sonnet", 0.2), "Code Review Agent": ("sonnet", 0.1),
    "Data Analyst": ("sonnet", 0.15), "Content Strategist": ("sonnet", 0.5), "Meeting Summarizer": ("haiku", 0.2),
    "Bug Triage Assistant": ("sonnet", 0.1),
}
# the agents evolution is benchmarked on (bench/evolution.py): their sets are split into train, validation and test
BENCHMARK_AGENTS = ("Research Analyst", "Content Strategist", "Bug Triage Assistant")
SPECIALISTS = {"research": "research-analyst", "code_review": "code-review-agent", "data_analysis": "data-analyst",
               "content": "content-strategist", "meeting": "meeting-summarizer", "bug_triage": "bug-triage-assistant"}


def _text(key: str, **arguments) -> str:
    return DIRECTIVES[key].text(**arguments)


SEARCH = _text("tool_first", tool="knowledge_search")
# what the offline rewriter and evolution can add: directives of the offline vocabulary and the knowledge_search
# tool; per agent file, node -> (directives appended to its prompt, tools added)
IMPROVEMENTS = {
    "general-assistant": {"content": ([SEARCH], ["knowledge_search"]),
                          "bug_triage": ([SEARCH], ["knowledge_search"]),
                          "meeting": ([_text("bullet_list")], [])},
    "research-analyst": {"research": ([_text("json_fields", fields=["summary", "key_findings", "sources",
                                                                    "confidence"])], [])},
    "code-review-agent": {"review": ([_text("json_fields", fields=["verdict", "score", "summary", "findings",
                                                                   "sources"])], [])},
    "data-analyst": {"analyse": ([_text("json_fields", fields=["metrics", "insights", "anomalies", "sources"])], [])},
    "content-strategist": {"brief": ([SEARCH, _text("json_fields", fields=["audience", "goal", "key_messages",
                                                                           "call_to_action", "sources"])],
                                     ["knowledge_search"])},
    "meeting-summarizer": {"summarize": ([_text("bullet_list")], [])},
    "bug-triage-assistant": {"triage": ([SEARCH, _text("json_fields", fields=["severity", "reproduction_steps",
                                                                              "root_cause", "fix_approach",
                                                                              "sources"])],
                                        ["knowledge_search"])},
}


def improved(dsl: dict, changes: dict) -> dict:
    dsl = copy.deepcopy(dsl)
    for node in dsl["nodes"]:
        if node["nodeId"] in changes:
            directives, tools = changes[node["nodeId"]]
            node["systemPrompt"] = " ".join([node["systemPrompt"].strip(), *directives])
            node["codeTools"] = [*node.get("codeTools", []), *(t for t in tools if t not in node.get("codeTools", []))]
    return dsl


# ------------------------------------------------------------------------------------------------ the files


def test_the_files_describe_the_seven_canonical_agents():
    specs = load_agents()
    assert [spec.name for spec in specs] == list(CANONICAL)
    assert set(IMPROVEMENTS) == {spec.path.stem for spec in specs}
    for spec in specs:
        tier, temperature = CANONICAL[spec.name]
        assert (spec.tier, spec.temperature) == (tier, temperature), spec.name
        assert spec.dsl["agent"] == {"template": spec.template, "modelTier": f"{tier}-class",
                                     "temperature": temperature}
        parsed = dsl_module.parse(spec.dsl)
        assert dsl_module.unresolved_tools(parsed) == [], spec.name
        for node in parsed["nodes"]:
            assert node["gatewayModelId"] in model_tiers().values() and model_problem(node["gatewayModelId"]) is None
            assert node["description"], f"{spec.name}.{node['nodeId']} needs a description"
            assert set(node["skills"]) <= {path.parent.name for path in _skill_pack()}, node["skills"]
        entry = next(node for node in parsed["nodes"] if node["nodeId"] == parsed["entryNodeId"])
        assert entry["gatewayModelId"] == model_tiers()[tier]
        schema = spec.output_schema
        Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and schema["required"], spec.name
        graders = validate_graders(spec.graders)
        assert {grader["kind"] for grader in graders} >= {"token_f1", "llm_judge"}, spec.name
        if spec.name in BENCHMARK_AGENTS:  # big enough for a held-out test split of 8 items or more
            assert len(spec.items) >= 30, spec.name
            assert sum("critical" in item.tags for item in spec.items) >= 3, spec.name
            assert len({item.tags[0] for item in spec.items if item.tags}) >= 5, spec.name  # strata to deal
        else:
            assert 6 <= len(spec.items) <= 10, spec.name
        assert any("critical" in item.tags for item in spec.items), spec.name
        assert len({item.key for item in spec.items}) == len(spec.items)
        fields = next((g.get("fields") for g in graders if g["kind"] == "json_fields"), None)
        for item in spec.items:
            assert item.input and item.input.get("text"), (spec.name, item.key)
            if fields:  # every item has the fields its set grades, and they are fields of the output schema
                expected = json.loads(item.expected_output)
                assert set(expected) <= set(schema["properties"]), (spec.name, item.key)
                for path in fields:
                    head, *rest = path.split(".")
                    assert head in expected and head in schema["properties"], (spec.name, item.key, path)
                    if rest:
                        assert expected[head], (spec.name, item.key, path)


def _skill_pack():
    from knowledge.services import SKILL_PACK_DIR, skill_files

    return skill_files(SKILL_PACK_DIR)


def test_the_general_assistant_routes_to_the_six_specialists_by_their_descriptions():
    specs = {spec.path.stem: spec for spec in load_agents()}
    assistant = specs["general-assistant"].dsl
    router = next(node for node in assistant["nodes"] if node["nodeId"] == assistant["entryNodeId"])
    assert router["handOffType"] == "conditional" and router["handOffs"] == list(SPECIALISTS)
    for node_id, stem in SPECIALISTS.items():
        node = next(node for node in assistant["nodes"] if node["nodeId"] == node_id)
        own = specs[stem].dsl
        base = next(n for n in own["nodes"] if n["nodeId"] == own["entryNodeId"])
        # the same node the specialist agent runs on its own, under the router's name for it
        assert {**node, "nodeId": base["nodeId"]} == base
        assert node["handOffs"] == ["end"]


# ---------------------------------------------------------------------------------------------- seeding


def _counts():
    return (Workflow.objects.count(), WorkflowVersion.objects.count(), GoldenSet.objects.count(),
            GoldenItem.objects.count())


def test_seeding_is_idempotent(workspace):
    first = seed_agents(workspace=workspace)
    assert [o.name for o in first.agents] == list(CANONICAL)
    assert all(o.workflow == "created" and o.golden_set == "created" and o.version_status == "active"
               for o in first.agents)
    counts = _counts()
    specs = load_agents()
    assert counts == (7, 7, 7, sum(len(spec.items) for spec in specs))
    for spec in specs:
        workflow = Workflow.objects.get(workspace=workspace, name=spec.name)
        version = workflow.versions.get()
        assert version.status == "active" and version.operation == "init"
        assert version.commit_message.startswith("seed_agents:") and version.output_schema == spec.output_schema
        golden = GoldenSet.objects.get(workspace=workspace, name=f"{spec.name} golden set")
        assert golden.workflow == workflow and golden.graders == validate_graders(spec.graders)
        items = list(golden.items.order_by("position"))
        assert [item.metadata["key"] for item in items] == [item.key for item in spec.items]
        assert any(item.critical for item in items)
        plan = split_plan(golden)  # the benchmark sets are split for a held-out claim; the others are too small
        assert plan.held_out is (spec.name in BENCHMARK_AGENTS), (spec.name, plan.reason)
        if plan.held_out:
            assert plan.counts["test"] >= 8 and plan.counts["validation"] >= 7, (spec.name, plan.counts)
            assert {item.split for item in items if item.critical} >= {"train", "test"}, spec.name
    splits = dict(GoldenItem.objects.values_list("pk", "split"))

    again = seed_agents(workspace=workspace)
    assert not again.changed
    assert dict(GoldenItem.objects.values_list("pk", "split")) == splits
    assert all(o.workflow == "unchanged" and o.golden_set == "unchanged" and o.items_unchanged > 0
               for o in again.agents)
    assert [o.version_id for o in again.agents] == [o.version_id for o in first.agents]
    assert _counts() == counts


def _patched(monkeypatch, change):
    """Make seed_agents read the shipped files changed by `change(stem, spec) -> spec`."""
    real = load_agents()
    monkeypatch.setattr(agents, "load_agents", lambda root=None: [change(spec.path.stem, spec) for spec in real])


def _reworded(stem, spec, words="Be brief."):
    if stem != "research-analyst":
        return spec
    dsl = copy.deepcopy(spec.dsl)
    dsl["nodes"][0]["systemPrompt"] += f" {words}"
    return dataclasses.replace(spec, dsl=dsl)


def test_a_changed_agent_is_a_new_version_that_never_replaces_an_operators_choice(workspace, monkeypatch):
    from workflows.services import workflow_version_activate, workflow_version_create

    seed_agents(workspace=workspace)
    workflow = Workflow.objects.get(workspace=workspace, name="Research Analyst")
    seeded = workflow.versions.get()

    _patched(monkeypatch, _reworded)  # the shipped base changed: it replaces the seeded base nobody chose over
    report = seed_agents(workspace=workspace)
    outcome = next(o for o in report.agents if o.name == "Research Analyst")
    assert (outcome.workflow, outcome.version_status) == ("updated", "active")
    assert [o.workflow for o in report.agents if o.name != "Research Analyst"] == ["unchanged"] * 6
    second = WorkflowVersion.objects.get(pk=outcome.version_id)
    seeded.refresh_from_db()
    assert seeded.status == "archived" and second.parent1 == seeded and second.operation == "init"

    # an operator makes their own version active: the next shipped change stays a candidate
    mine, _ = workflow_version_create(workflow=workflow, dsl={**second.dsl, "description": "mine"},
                                      operation=WorkflowVersion.Operation.MANUAL, parents=(second,))
    workflow_version_activate(version=mine)
    _patched(monkeypatch, lambda stem, spec: _reworded(stem, spec, "Be very brief."))
    report = seed_agents(workspace=workspace)
    outcome = next(o for o in report.agents if o.name == "Research Analyst")
    assert (outcome.workflow, outcome.version_status) == ("updated", "candidate")
    assert f"{mine.pk} was chosen by an operator" in outcome.note
    mine.refresh_from_db()
    assert mine.status == "active"


def test_items_are_updated_in_place_by_key_and_pruned_only_when_asked(workspace, monkeypatch):
    from evals.services import golden_item_add

    seed_agents(workspace=workspace)
    golden = GoldenSet.objects.get(workspace=workspace, name="Data Analyst golden set")
    by_key = {item.metadata["key"]: item for item in golden.items.all()}
    by_hand = golden_item_add(golden_set=golden, input={"text": "an operator's own case"}, expected_output="{}")
    dropped, edited = "dead-runs-after-recoveries", "reingest-costs-nothing"

    def change(stem, spec):
        if stem != "data-analyst":
            return spec
        items = [dataclasses.replace(item, tags=(*item.tags, "edited")) if item.key == edited else item
                 for item in spec.items if item.key != dropped]
        return dataclasses.replace(spec, items=tuple(items))

    _patched(monkeypatch, change)
    kept = seed_agents(workspace=workspace)
    outcome = next(o for o in kept.agents if o.name == "Data Analyst")
    assert (outcome.items_updated, outcome.items_removed, outcome.items_added) == (1, 0, 0)
    assert GoldenItem.objects.filter(pk=by_key[dropped].pk).exists()  # without --prune nothing is deleted
    item = GoldenItem.objects.get(pk=by_key[edited].pk)  # the same row, updated
    assert "edited" in item.tags and item.split == by_key[edited].split  # its split stays where it was dealt

    pruned = seed_agents(workspace=workspace, prune=True)
    outcome = next(o for o in pruned.agents if o.name == "Data Analyst")
    assert (outcome.items_removed, outcome.items_updated) == (1, 0)
    assert not GoldenItem.objects.filter(pk=by_key[dropped].pk).exists()
    assert GoldenItem.objects.filter(pk=by_hand.pk).exists()  # an item added by hand has no key: never pruned
    assert all(o.items_removed == 0 for o in pruned.agents if o.name != "Data Analyst")


def test_an_invalid_file_writes_nothing_and_is_named(workspace, monkeypatch, tmp_path):
    real = load_agents()
    broken = copy.deepcopy(real[-1].dsl)
    broken["nodes"][0]["handOffs"] = ["nowhere"]
    monkeypatch.setattr(agents, "load_agents",
                        lambda root=None: [*real[:-1], dataclasses.replace(real[-1], dsl=broken)])
    with pytest.raises(dsl_module.DslError, match="nowhere"):
        seed_agents(workspace=workspace)
    assert _counts() == (0, 0, 0, 0)  # the valid agents before it were not written either
    with pytest.raises(CommandError, match=r"bug-triage-assistant\.yaml.*nowhere"):
        call_command("seed_agents", "--workspace", workspace.slug, stdout=StringIO())
    (tmp_path / "half.yaml").write_text("name: Half an agent\ntier: sonnet\n")
    with pytest.raises(agents.AgentFileError, match=r"half\.yaml: missing description"):
        agents.load_agent(tmp_path / "half.yaml")


def test_the_command_reports_each_agent_and_refuses_an_unknown_workspace(workspace):
    out, err = StringIO(), StringIO()
    call_command("seed_agents", "--workspace", workspace.slug, stdout=out, stderr=err)
    lines = out.getvalue().splitlines()
    for name in CANONICAL:
        line = next(line for line in lines if line.strip().startswith(f"{name}:"))
        assert "workflow created" in line and "active" in line and "added" in line
    assert "7 agents, 7 changed" in out.getvalue()
    assert "seed_skills" in err.getvalue()  # this workspace has no skill library yet
    out = StringIO()
    call_command("seed_agents", "--workspace", workspace.slug, "--prune", stdout=out, stderr=StringIO())
    assert "7 agents, 0 changed" in out.getvalue() and "0 removed" in out.getvalue()
    with pytest.raises(CommandError, match="No workspace"):
        call_command("seed_agents", "--workspace", "nowhere", stdout=StringIO())


def test_without_a_workspace_the_command_seeds_the_demo_workspace():
    call_command("seed_agents", stdout=StringIO(), stderr=StringIO())
    assert Workflow.objects.filter(workspace__slug="demo").count() == 7


# ------------------------------------------------------------------------------------ scores, offline


def test_each_base_leaves_room_and_a_variant_with_offline_directives_scores_higher(capsys):
    """With the demo knowledge base ingested, each agent's base version scores between 0 and 1 on its golden
    set, and the same DSL with directives the offline model obeys (JSON fields, knowledge_search, bullets)
    scores strictly higher on the same set. The General Assistant routes each item to its specialist."""
    from durable.inprocess import run_until_settled
    from evals.services import eval_run_start
    from knowledge import demo
    from workflows.services import workflow_version_create

    demo.seed(stdout=StringIO())
    workspace = demo.demo_workspace()
    seed_agents(workspace=workspace)

    def evaluate(golden, version):
        run = eval_run_start(golden_set=golden, version=version)
        run_until_settled(run.durable_run_id, max_wait=120)
        run.refresh_from_db()
        assert run.status == EvalRun.Status.COMPLETED, run.error
        assert run.items_done == run.items_total == golden.items.count() and run.grading_errors == 0
        return run

    scores, problems = {}, []
    for spec in load_agents():
        golden = GoldenSet.objects.get(workspace=workspace, name=spec.set_name)
        base = WorkflowVersion.objects.get(workflow=golden.workflow, status="active")
        variant, _ = workflow_version_create(workflow=golden.workflow, operation=WorkflowVersion.Operation.MUTATION,
                                             dsl=improved(base.dsl, IMPROVEMENTS[spec.path.stem]), parents=(base,))
        before, after = evaluate(golden, base), evaluate(golden, variant)
        scores[spec.name] = (before.avg_score, after.avg_score)
        if not 0 < before.avg_score < 1:
            problems.append(f"{spec.name}: the base scores {before.avg_score}")
        if not after.avg_score > before.avg_score:
            problems.append(f"{spec.name}: the variant scores {after.avg_score}, the base {before.avg_score}")
        if spec.path.stem == "general-assistant":
            expected = {"research": "research", "triage": "bug_triage", "content": "content",
                        "code-review": "code_review", "meeting": "meeting", "data": "data_analysis"}
            for result in GoldenResult.objects.filter(eval_run=before).select_related("golden_item"):
                route = list(NodeInvocation.objects.filter(workflow_invocation=result.workflow_invocation_id)
                             .order_by("seq").values_list("node_id", flat=True))
                domain = next(tag for tag in result.golden_item.tags if tag in expected)
                assert route == ["assistant", expected[domain]], (result.golden_item.metadata["key"], route)
    with capsys.disabled():
        print("\nagent golden set scores offline (base -> variant):")
        for name, (before, after) in scores.items():
            print(f"  {name:22} {before:.3f} -> {after:.3f}")
    assert not problems, problems


def test_the_tiers_models_come_from_the_settings(settings):
    """LLM_MODEL_TIERS names each tier's model; a tier it leaves out is LLM_DEFAULT_MODEL."""
    settings.LLM_DEFAULT_MODEL = "ollama#llama3.2"
    settings.LLM_MODEL_TIERS = {"sonnet": "ollama#qwen2.5:14b"}
    by_name = {spec.name: spec for spec in load_agents()}
    for spec in by_name.values():
        models = {node["gatewayModelId"] for node in spec.dsl["nodes"]}
        assert models <= {"ollama#llama3.2", "ollama#qwen2.5:14b"}, spec.name
    entry = next(n for n in by_name["Research Analyst"].dsl["nodes"]
                 if n["nodeId"] == by_name["Research Analyst"].dsl["entryNodeId"])
    assert entry["gatewayModelId"] == ("ollama#qwen2.5:14b" if by_name["Research Analyst"].tier == "sonnet"
                                       else "ollama#llama3.2")
