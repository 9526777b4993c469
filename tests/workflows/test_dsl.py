"""The workflow DSL: the seed system's exports import unchanged, errors name the node and the field,
and the hash depends on what a workflow does, not on how its JSON is ordered."""

import copy
import functools
import json
from pathlib import Path

import pytest

from workflows import dsl

SEED_EXPORT = json.loads((Path(__file__).parent / "data" / "seed_export.json").read_text())


def two_nodes(**changes):
    document = {
        "entryNodeId": "planner",
        "nodes": [
            {"nodeId": "planner", "systemPrompt": "Plan.", "gatewayModelId": "gpt-4.1-mini",
             "codeTools": ["knowledge_search"], "handOffs": ["writer"], "memory": {"seen": 3}},
            {"nodeId": "writer", "systemPrompt": "Write.", "gatewayModelId": "gpt-4.1-mini", "handOffs": ["end"]},
        ],
    }
    document.update(changes)
    return document


def errors_of(document, **kwargs) -> dict:
    with pytest.raises(dsl.DslError) as error:
        dsl.parse(document, **kwargs)
    return error.value.errors


def test_a_seed_export_imports_unchanged():
    parsed = dsl.parse(SEED_EXPORT)
    researcher, critic, writer = parsed["nodes"]
    assert parsed["__schema_version"] == 1
    assert researcher["gatewayModelId"] == "openrouter#openai/gpt-4.1-mini"
    assert dsl.model_provider(researcher["gatewayModelId"]) == "openrouter"
    assert dsl.model_name(researcher["gatewayModelId"]) == "openai/gpt-4.1-mini"
    assert critic["systemPrompt"] == "" and critic["handOffType"] == "sequential"
    assert writer["waitFor"] == ["critic"] and writer["handOffs"] == ["end"]
    assert dsl.unresolved_tools(parsed) == ["researcher.browserUse", "researcher.csvReader", "researcher.tavily"]
    assert dsl.unresolved_tools(parsed, mcp_tools=["tavily", "browserUse"]) == ["researcher.csvReader"]


@pytest.mark.parametrize(("document", "path", "fragment"), [
    (two_nodes(entryNodeId="nobody"), "entryNodeId", "names no node"),
    (two_nodes(entryNodeId=""), "entryNodeId", "required"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m"}, {"nodeId": "a", "gatewayModelId": "m"}],
               entryNodeId="a"), "nodes[a].nodeId", "duplicate"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m", "handOffs": ["b"]}], entryNodeId="a"),
     "nodes[a].handOffs", "unknown hand-off target 'b'"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m", "waitFor": ["z"]}], entryNodeId="a"),
     "nodes[a].waitFor", "unknown node 'z'"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m", "handOffType": "random"}], entryNodeId="a"),
     "nodes[a].handOffType", "must be one of"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m", "maxSteps": 0}], entryNodeId="a"),
     "nodes[a].maxSteps", "whole number"),
    (two_nodes(nodes=[{"nodeId": "a"}], entryNodeId="a"), "nodes[a].gatewayModelId", "required"),
    (two_nodes(nodes=[{"nodeId": "a", "gatewayModelId": "m", "codeTools": "knowledge_search"}],
               entryNodeId="a"), "nodes[a].codeTools", "list"),
    (two_nodes(nodes=[{"nodeId": "end", "gatewayModelId": "m"}], entryNodeId="end"), "nodes[end].nodeId",
     "reserved"),
    (two_nodes(nodes=[{"gatewayModelId": "m"}], entryNodeId="a"), "nodes[0].nodeId", "required"),
    (two_nodes(nodes=[]), "nodes", "non-empty"),
    ("[1, 2", "dsl", "not JSON"),
    ([], "dsl", "JSON object"),
])
def test_errors_name_the_node_and_the_field(document, path, fragment):
    errors = errors_of(document)
    assert path in errors, errors
    assert any(fragment in message for message in errors[path]), errors


def test_an_unknown_model_is_an_error_only_against_the_installations_models():
    assert dsl.parse(two_nodes())  # no model list: any name is kept
    errors = errors_of(two_nodes(), known_models=["gpt-4o"])
    assert set(errors) == {"nodes[planner].gatewayModelId", "nodes[writer].gatewayModelId"}
    assert dsl.parse(SEED_EXPORT, known_models=["gpt-4.1-mini", "openai/gpt-4.1-mini"])


def test_every_error_of_a_document_is_reported_at_once():
    document = two_nodes(entryNodeId="ghost")
    document["nodes"][1]["handOffs"] = ["nowhere"]
    assert set(errors_of(document)) == {"entryNodeId", "nodes[writer].handOffs"}


def test_the_hash_ignores_ordering_memory_duplicates_and_unknown_node_fields():
    base = dsl.dsl_hash(dsl.parse(two_nodes()))
    reordered = two_nodes()
    reordered["nodes"].reverse()
    reordered = json.loads(json.dumps(reordered, sort_keys=False))
    reordered["nodes"][1] = dict(reversed(list(reordered["nodes"][1].items())))
    assert dsl.dsl_hash(dsl.parse(reordered)) == base
    noisy = copy.deepcopy(two_nodes())
    noisy["nodes"][0]["memory"] = {"seen": 999}
    noisy["nodes"][0]["codeTools"] = ["knowledge_search", "knowledge_search"]
    noisy["nodes"][0]["uiPosition"] = {"x": 10}  # an editor's field: not part of the workflow
    assert dsl.dsl_hash(dsl.parse(noisy)) == base
    aliased = copy.deepcopy(two_nodes())
    aliased["nodes"][1]["modelName"] = aliased["nodes"][1].pop("gatewayModelId")
    assert dsl.dsl_hash(dsl.parse(aliased)) == base


def test_the_hash_changes_with_what_the_workflow_does():
    base = dsl.dsl_hash(dsl.parse(two_nodes()))
    changed_prompt = two_nodes()
    changed_prompt["nodes"][0]["systemPrompt"] = "Plan carefully."
    changed_tools = two_nodes()
    changed_tools["nodes"][1]["codeTools"] = ["skill_load"]
    changed_model = two_nodes()
    changed_model["nodes"][1]["gatewayModelId"] = "gpt-4o"
    hashes = {dsl.dsl_hash(dsl.parse(doc)) for doc in (changed_prompt, changed_tools, changed_model)}
    assert base not in hashes and len(hashes) == 3


def test_wait_for_spellings_are_merged():
    document = two_nodes()
    document["nodes"][1]["waitFor"] = ["planner"]
    document["nodes"][1]["waitingFor"] = ["planner"]
    assert dsl.parse(document)["nodes"][1]["waitFor"] == ["planner"]


@pytest.mark.parametrize("node, path", [
    ({"waitFor": 5, "waitingFor": ["a"]}, "nodes[a].waitFor"),
    ({"waitFor": ["a"], "waitingFor": "a"}, "nodes[a].waitFor"),
    ({"nodeId": "n" * 201}, "nodes[" + "n" * 201 + "].nodeId"),
    ({"gatewayModelId": "m" * 201}, "nodes[a].gatewayModelId"),
    ({"codeTools": ["t" * 201]}, "nodes[a].codeTools"),
])
def test_malformed_lists_and_overlong_names_are_errors_not_crashes(node, path):
    document = {"entryNodeId": node.get("nodeId", "a"),
                "nodes": [{"nodeId": "a", "gatewayModelId": "gpt-4.1-mini", **node}]}
    with pytest.raises(dsl.DslError) as error:
        dsl.parse(document)
    assert path in error.value.errors


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("description", 5, "must be text"),
    ("description", 0, "must be text"),
    ("description", ["x"], "must be text"),
    ("systemPrompt", 0, "must be text"),
    ("systemPrompt", {"text": "x"}, "must be text"),
    ("gatewayModelId", 5, "must be text"),
    ("gatewayModelId", ["m"], "must be text"),
    ("modelName", 7, "must be text"),
    ("handOffType", 0, "must be one of"),
    ("handOffType", ["parallel"], "must be one of"),
    ("requiresApproval", "false", "true or false"),
    ("requiresApproval", 1, "true or false"),
    ("maxSteps", "5", "whole number"),
    ("maxSteps", True, "whole number"),
    ("memory", ["x"], "must be an object"),
    ("memory", "notes", "must be an object"),
    ("nodeId", 5, "must be text"),
])
def test_every_node_field_of_the_wrong_type_is_refused_naming_the_node_and_field(field, value, fragment):
    """A wrong type is refused when the version is written, never accepted and failing (or silently
    replaced by a default) when an invocation reaches the node."""
    target = {"nodeId": "b"} if field == "modelName" else {"nodeId": "b", "gatewayModelId": "gpt-4.1-mini"}
    document = {"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "gpt-4.1-mini", "handOffs": ["b"]},
                                              {**target, field: value}]}
    errors = errors_of(document)
    path = "nodes[1]" if field == "nodeId" else "nodes[b]"
    path += ".gatewayModelId" if field == "modelName" else f".{field}"
    assert path in errors, errors
    assert any(fragment in message for message in errors[path]), errors


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("entryNodeId", 5, "must be text"),
    ("inputSchema", [], "must be an object"),
    ("outputSchema", "json", "must be an object"),
    ("__schema_version", "1", "must be 1"),
    ("__schema_version", 2, "must be 1"),
])
def test_every_workflow_field_of_the_wrong_type_is_refused_naming_it(field, value, fragment):
    errors = errors_of(two_nodes(**{field: value}))
    assert field in errors, errors
    assert any(fragment in message for message in errors[field]), errors


@pytest.mark.parametrize(("field", "schema", "fragment"), [
    ("inputSchema", {"type": "strng"}, "'strng' is not valid"),
    ("inputSchema", {"type": "object", "properties": []}, "is not of type 'object'"),
    ("outputSchema", {"type": "object", "properties": {"code": {"type": "string", "pattern": "(unclosed"}}},
     "the pattern '(unclosed' at properties/code/pattern"),
    ("outputSchema", {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}, "unevaluatedProperties"),
    ("inputSchema", functools.reduce(lambda inner, _: {"items": inner}, range(400), {}), "nested too deeply"),
])
def test_a_schema_that_is_not_a_usable_json_schema_is_refused_naming_its_field(field, schema, fragment):
    """Refused when the version is written: stored, an input schema that cannot be used checks no input,
    and an output schema the provider cannot read fails every structured-output call."""
    errors = errors_of(two_nodes(**{field: schema}))
    assert list(errors) == [field], errors
    assert errors[field][0].startswith("is not a usable JSON Schema (Draft 2020-12): "), errors
    assert fragment in errors[field][0], errors


def test_a_schema_that_refers_to_itself_without_end_is_stored_as_a_json_schema_may():
    schema = {"$defs": {"node": {"$ref": "#/$defs/node"}}, "$ref": "#/$defs/node"}
    assert dsl.parse(two_nodes(inputSchema=schema))["inputSchema"] == schema


def test_missing_and_null_fields_take_their_defaults():
    document = {"entryNodeId": "a", "nodes": [{"nodeId": "a", "gatewayModelId": "m", "description": None,
                                               "systemPrompt": None, "requiresApproval": None, "memory": None,
                                               "handOffType": None, "maxSteps": None}]}
    node = dsl.parse(document)["nodes"][0]
    assert (node["description"], node["systemPrompt"], node["requiresApproval"], node["memory"],
            node["handOffType"], node["maxSteps"]) == ("", "", False, {}, "sequential", 5)


def test_the_hash_keeps_the_order_of_hand_offs_and_wait_for_and_ignores_the_order_of_sets():
    def fan(handoffs, wait_for, tools, skills):
        return {"entryNodeId": "a", "nodes": [
            {"nodeId": "a", "gatewayModelId": "m", "handOffs": handoffs},
            {"nodeId": "b", "gatewayModelId": "m", "handOffs": ["d"]},
            {"nodeId": "c", "gatewayModelId": "m", "handOffs": ["d"]},
            {"nodeId": "d", "gatewayModelId": "m", "waitFor": wait_for, "codeTools": tools, "skills": skills,
             "mcpTools": list(reversed(tools))}]}

    base = dsl.dsl_hash(dsl.parse(fan(["b", "c"], ["b", "c"], ["knowledge_search", "skill_load"], ["x", "y"])))
    # sequential targets run in list order and the answer is the last to reach `end`; a join reads in waitFor order
    assert dsl.dsl_hash(dsl.parse(fan(["c", "b"], ["b", "c"], ["knowledge_search", "skill_load"], ["x", "y"]))) != base
    assert dsl.dsl_hash(dsl.parse(fan(["b", "c"], ["c", "b"], ["knowledge_search", "skill_load"], ["x", "y"]))) != base
    # the tools offered and the skills named are sets: stored sorted, so the same hash runs the same
    shuffled = dsl.parse(fan(["b", "c"], ["b", "c"], ["skill_load", "knowledge_search"], ["y", "x"]))
    assert dsl.dsl_hash(shuffled) == base
    joined = shuffled["nodes"][3]
    assert (joined["codeTools"], joined["mcpTools"], joined["skills"]) == (
        ["knowledge_search", "skill_load"], ["knowledge_search", "skill_load"], ["x", "y"])
    assert shuffled["nodes"][0]["handOffs"] == ["b", "c"] and joined["waitFor"] == ["b", "c"]
