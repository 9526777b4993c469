"""The evolution operators: every offspring is a valid DSL that differs from its parent(s), keeps their
node memory, says what changed, and comes out the same for the same generator state."""

import copy
import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolution import operators
from evolution.operators import Material, crossover, directive_pool, immigrant, mutate, repair, sentences
from llm.offline_directives import find_directives
from workflows.dsl import dsl_hash, parse

MODEL = "gpt-4.1-mini"
INPUT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
OUTPUT_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"},
                                                  "sources": {"type": "array", "items": {"type": "string"}}}}
PROPERTY = settings(max_examples=60, deadline=None, database=None)


def node(node_id, prompt, handoffs, **fields):
    return {"nodeId": node_id, "description": f"Handles the {node_id} part of durable engine questions.",
            "systemPrompt": prompt, "gatewayModelId": MODEL, "handOffs": handoffs,
            "memory": {"owner": node_id, "visits": len(node_id)}, **fields}


def workflow(entry, *nodes, schemas=True):
    dsl = {"entryNodeId": entry, "nodes": list(nodes)}
    if schemas:
        dsl.update(inputSchema=INPUT_SCHEMA, outputSchema=OUTPUT_SCHEMA)
    return dsl


SINGLE = workflow("answer", node("answer", "You answer questions about the durable engine.", ["end"]))
CHAIN = workflow(
    "research",
    node("research", "Research the question. Call knowledge_search before answering.", ["draft"],
         codeTools=["knowledge_search"]),
    node("draft", "Draft an answer from the research.", ["polish"]),
    node("polish", "Polish the draft. Answer in at most 40 words.", ["end"]),
)
FAN = workflow(
    "scope",
    node("scope", "Frame the question for two researchers.", ["engine", "costs"], handOffType="parallel"),
    node("engine", "You research the engine. Quote the retrieved passage.", ["writer"],
         codeTools=["knowledge_search"]),
    node("costs", "You research costs. Cite your sources.", ["writer"], codeTools=["knowledge_search"]),
    node("writer", "Write a brief from both findings. Answer as a bullet list.", ["end"], waitFor=["engine", "costs"]),
)
ROUTER = workflow(
    "triage",
    node("triage", "Classify the question. Answer in one sentence.", ["engine_expert", "knowledge_expert", "end"],
         handOffType="conditional"),
    node("engine_expert", "You answer engine questions. Cite your sources.", ["end"], codeTools=["knowledge_search"]),
    node("knowledge_expert", "You answer knowledge base questions.", ["end"]),
    schemas=False,
)
CYCLE = workflow(
    "plan",
    node("plan", "Plan the work.", ["work"]),
    node("work", "Do the work.", ["review"], codeTools=["skill_load"]),
    node("review", "Review the work. Answer in at most 80 words.", ["work", "end"], handOffType="conditional"),
)
BASES = {"single": SINGLE, "chain": CHAIN, "fan": FAN, "router": ROUTER, "cycle": CYCLE}
# a kind with nothing to change on a base: one node has no hand-off to reorder and nothing to delete
NOT_APPLICABLE = {("single", "structure"), ("single", "delete_node")}
REWRITE = 'Start your answer with "Answer:".'


def rewriter(dsl):
    """A stand-in for the judge-guided rewrite: it adds a directive to the entry node and, like a careless
    rewriter, drops every node's memory."""
    out = copy.deepcopy(dsl)
    for item in out["nodes"]:
        item["memory"] = {}
        if item["nodeId"] == out["entryNodeId"]:
            item["systemPrompt"] = (item["systemPrompt"] + " " + REWRITE).strip()
    return out, "entry: start with Answer:"


def nodes_of(dsl):
    return {item["nodeId"]: item for item in dsl["nodes"]}


def assert_sound(offspring, *parents):
    assert offspring.dsl == parse(offspring.dsl)  # valid and already normalized
    assert dsl_hash(offspring.dsl) not in {dsl_hash(parse(parent)) for parent in parents}
    assert offspring.note and "\n" not in offspring.note


def assert_memory_kept(child, parent):
    parent_nodes = nodes_of(parse(parent))
    for node_id, item in nodes_of(child).items():
        if node_id in parent_nodes:
            assert item["memory"] == parent_nodes[node_id]["memory"], node_id


# ---------------------------------------------------------------------------------------------- the pool

def test_the_directive_pool_speaks_the_offline_models_vocabulary():
    pool = directive_pool(CHAIN)
    found = [find_directives(text) for text in pool]
    assert all(len(items) == 1 for items in found), pool
    assert [items[0].key for items in found] == [
        "json_fields", "tool_first", "cite_sources", "quote_passage", "bullet_list", "one_sentence", "max_words",
        "max_words", "unknown_answer"]
    assert found[0][0].arguments == {"fields": ["answer", "sources"]}
    assert found[1][0].arguments == {"tool": "knowledge_search"}
    assert [items[0].arguments["n"] for items in found if items[0].key == "max_words"] == [40, 80]
    # no output schema, no JSON directive; the same workflow, the same pool
    assert [find_directives(text)[0].key for text in directive_pool(ROUTER)] == [
        "tool_first", "cite_sources", "quote_passage", "bullet_list", "one_sentence", "max_words", "max_words",
        "unknown_answer"]
    assert directive_pool(copy.deepcopy(CHAIN)) == pool


def test_node_patterns_state_the_directives_they_are_for():
    chain = parse(CHAIN)
    after = nodes_of(chain)["polish"]
    researcher, tools = operators.NODE_PATTERNS["researcher"].build(chain, after)
    assert [f.key for f in find_directives(researcher)] == ["tool_first", "quote_passage"]
    assert tools == ("knowledge_search",)
    reviewer, _ = operators.NODE_PATTERNS["reviewer"].build(chain, after)
    assert [(f.key, f.arguments) for f in find_directives(reviewer)] == [("max_words", {"n": 40})]  # polish's
    formatter, _ = operators.NODE_PATTERNS["formatter"].build(chain, after)
    assert [(f.key, f.arguments) for f in find_directives(formatter)] == [
        ("json_fields", {"fields": ["answer", "sources"]})]
    assert operators.NODE_PATTERNS["formatter"].build(parse(ROUTER), nodes_of(ROUTER)["triage"]) is None


# ------------------------------------------------------------------------------------------------ mutation

@PROPERTY
@given(seed=st.integers(0, 2**32), base=st.sampled_from(sorted(BASES)),
       kind=st.sampled_from(list(operators.MUTATION_WEIGHTS)))
def test_each_kind_keeps_the_dsl_valid_and_changes_it(seed, base, kind):
    parent = BASES[base]
    offspring = mutate(parent, random.Random(seed), kind=kind, iterative=rewriter)
    if (base, kind) in NOT_APPLICABLE:
        assert offspring is None
        return
    assert offspring is not None
    assert (offspring.operation, offspring.kind) == ("mutation", kind)
    assert_sound(offspring, parent)
    assert_memory_kept(offspring.dsl, parent)


@PROPERTY
@given(seed=st.integers(0, 2**32), base=st.sampled_from(sorted(BASES)))
def test_a_drawn_kind_always_gives_a_valid_mutant(seed, base):
    offspring = mutate(BASES[base], random.Random(seed))
    assert offspring is not None
    assert offspring.kind in operators.MUTATION_WEIGHTS
    assert_sound(offspring, BASES[base])
    assert_memory_kept(offspring.dsl, BASES[base])


def test_iterative_uses_the_rewrite_and_falls_back_to_a_prompt_mutation():
    offspring = mutate(CHAIN, random.Random(1), kind="iterative", iterative=rewriter)
    assert offspring.kind == "iterative" and offspring.note == "entry: start with Answer:"
    assert nodes_of(offspring.dsl)["research"]["systemPrompt"].endswith(REWRITE)
    assert_memory_kept(offspring.dsl, CHAIN)  # the rewriter dropped it; the operator put it back
    for rewrite in (None, lambda dsl: None, lambda dsl: (copy.deepcopy(dsl), "nothing new")):
        offspring = mutate(CHAIN, random.Random(1), kind="iterative", iterative=rewrite)
        assert offspring.kind == "prompt"
        assert_sound(offspring, CHAIN)


def test_the_same_seed_breeds_the_same_offspring():
    def draws(seed, weights=None):
        rng = random.Random(seed)
        out = []
        for index in range(50):
            parent = list(BASES.values())[index % len(BASES)]
            child = mutate(parent, rng, iterative=rewriter, weights=weights)
            out.append((dsl_hash(child.dsl), child.kind, child.note))
        out.append(dsl_hash(crossover(CHAIN, FAN, rng).dsl))
        out.append(dsl_hash(immigrant(CHAIN, rng).dsl))
        return out

    first = draws(7)
    assert draws(7) == first
    assert draws(8) != first
    assert len({item[0] for item in first[:50]}) > 25  # varied, not one child again and again
    reversed_weights = dict(reversed(list(operators.MUTATION_WEIGHTS.items())))
    assert draws(7, reversed_weights) == first  # the weights' order does not matter


def test_kinds_are_drawn_by_their_weights():
    rng = random.Random(11)
    draws = 3000
    counts = Counter(mutate(CHAIN, rng, iterative=rewriter).kind for _ in range(draws))
    for kind, weight in operators.MUTATION_WEIGHTS.items():
        assert 0.7 * weight * draws <= counts[kind] <= 1.3 * weight * draws, (kind, counts)
    only = Counter(mutate(CHAIN, rng, weights={"tool": 1, "model": 3}).kind for _ in range(400))
    assert set(only) == {"tool", "model"} and 240 <= only["model"] <= 360
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        mutate(CHAIN, rng, weights={"crossover": 1})
    with pytest.raises(ValueError, match="unknown mutation kind"):
        mutate(CHAIN, rng, kind="rewrite")


def test_a_kind_that_cannot_apply_is_redrawn():
    counts = Counter(mutate(SINGLE, random.Random(seed), weights={"delete_node": 5, "structure": 5, "model": 1}).kind
                     for seed in range(20))
    assert counts == {"model": 20}


def test_a_model_mutation_keeps_the_provider_prefix():
    prefixed = workflow("answer", node("answer", "Answer.", ["end"], gatewayModelId="openrouter#openai/gpt-4.1-mini"))
    models = {nodes_of(mutate(prefixed, random.Random(seed), kind="model").dsl)["answer"]["gatewayModelId"]
              for seed in range(20)}
    assert models == {"openrouter#openai/gpt-4.1-nano", "openrouter#openai/gpt-4o-mini"}
    assert mutate(SINGLE, random.Random(0), kind="model", material=Material(models=(MODEL,))) is None


def test_prompt_mutations_add_remove_and_replace_directives_mostly_on_the_finishing_node():
    notes = [mutate(CHAIN, random.Random(seed), kind="prompt").note for seed in range(300)]
    assert sum(note.startswith("polish:") for note in notes) > 0.6 * len(notes)
    assert any(": added 'Cite your sources.'" in note for note in notes)
    assert "polish: removed 'Answer in at most 40 words.'" in notes
    assert "polish: replaced 'Answer in at most 40 words.' with 'Answer in at most 80 words.'" in notes
    added = sum(": added " in note for note in notes)
    assert added > sum(": removed " in note or ": replaced " in note for note in notes)
    for seed in range(60):  # a removal takes the directive's sentence and nothing else
        child = mutate(CHAIN, random.Random(seed), kind="prompt")
        if child.note == "polish: removed 'Answer in at most 40 words.'":
            assert nodes_of(child.dsl)["polish"]["systemPrompt"] == "Polish the draft."


def test_one_shape_directive_at_a_time():
    for seed in range(100):
        child = mutate(FAN, random.Random(seed), kind="prompt")
        writer = nodes_of(child.dsl)["writer"]["systemPrompt"]
        keys = [f.key for f in find_directives(writer)]
        assert not {"one_sentence", "bullet_list"} <= set(keys), writer


def test_asking_for_knowledge_search_offers_it():
    """A prompt mutation adding "Call knowledge_search before answering." gives the node the tool (the
    offline model ignores a directive naming a tool it is not offered); a node that cannot take another
    tool is never asked for it."""
    seen = 0
    for seed in range(200):
        child = mutate(SINGLE, random.Random(seed), kind="prompt")
        answer = nodes_of(child.dsl)["answer"]
        if any(f.key == "tool_first" for f in find_directives(answer["systemPrompt"])):
            seen += 1
            assert "knowledge_search" in answer["codeTools"]
            assert child.note.endswith("and added the tool knowledge_search")
    assert seen
    full = workflow("answer", node("answer", "Answer.", ["end"], codeTools=["skill_load"], mcpTools=["a", "b"]))
    for seed in range(100):
        child = mutate(full, random.Random(seed), kind="prompt")
        assert "knowledge_search" not in child.dsl["nodes"][0]["systemPrompt"]
        assert len(child.dsl["nodes"][0]["codeTools"] + child.dsl["nodes"][0]["mcpTools"]) == 3


def test_tool_mutations_add_and_remove_tools_with_their_directive():
    notes = Counter(mutate(CHAIN, random.Random(seed), kind="tool").note for seed in range(300))
    assert "research: removed the tool knowledge_search and 'Call knowledge_search before answering.'" in notes
    assert "draft: added the tool knowledge_search and 'Call knowledge_search before answering.'" in notes
    assert "draft: added the tool knowledge_search" in notes
    assert "draft: added the tool skill_load" in notes
    for seed in range(50):
        child = mutate(CHAIN, random.Random(seed), kind="tool")
        if child.note.startswith("research: removed the tool knowledge_search"):
            assert nodes_of(child.dsl)["research"]["systemPrompt"] == "Research the question."


def test_structure_changes_keep_routers_and_joins_sound():
    notes = Counter(mutate(FAN, random.Random(seed), kind="structure").note for seed in range(100))
    # engine and costs are both awaited by the writer: a router choosing one would leave the join waiting
    assert set(notes) == {"scope: handOffType parallel -> sequential (to engine, costs)"}
    undescribed = copy.deepcopy(ROUTER)
    undescribed["nodes"][2]["description"] = ""
    undescribed["nodes"][0]["handOffType"] = "sequential"
    notes = {mutate(undescribed, random.Random(seed), kind="structure").note for seed in range(50)}
    assert notes == {"triage: handOffType sequential -> parallel (to engine_expert, knowledge_expert, end)"}
    notes = {mutate(ROUTER, random.Random(seed), kind="structure").note for seed in range(50)}
    assert "triage: handOffType conditional -> parallel (to engine_expert, knowledge_expert, end)" in notes
    swapped = next(child for seed in range(50) if "swapped research and draft" in
                   (child := mutate(CHAIN, random.Random(seed), kind="structure")).note)
    assert swapped.dsl["entryNodeId"] == "draft"
    assert [(n["nodeId"], n["handOffs"]) for n in swapped.dsl["nodes"]] == [
        ("research", ["polish"]), ("draft", ["research"]), ("polish", ["end"])]


def test_add_node_inserts_a_pattern_between_a_node_and_its_successor():
    notes = Counter()
    for seed in range(120):
        child = mutate(FAN, random.Random(seed), kind="add_node")
        notes[child.note.split(" (")[1].split(")")[0]] += 1
        added = [n for n in child.dsl["nodes"] if n["nodeId"] not in nodes_of(FAN)]
        assert len(added) == 1 and added[0]["memory"] == {}
        new = added[0]
        predecessors = [n["nodeId"] for n in child.dsl["nodes"] if new["nodeId"] in n["handOffs"]]
        assert len(predecessors) == 1 and len(new["handOffs"]) == 1
        writer = nodes_of(child.dsl)["writer"]
        for source in writer["waitFor"]:  # the join still hears from everything it waits for
            assert "writer" in nodes_of(child.dsl)[source]["handOffs"]
        if new["nodeId"].startswith("researcher"):
            assert new["codeTools"] == ["knowledge_search"]
    assert set(notes) == {"researcher", "reviewer", "formatter"}
    taken = workflow("researcher", node("researcher", "Look it up.", ["end"]))
    ids = {mutate(taken, random.Random(seed), kind="add_node").dsl["nodes"][1]["nodeId"] for seed in range(40)}
    assert "researcher_2" in ids and "researcher" not in ids
    # never on a router's branches: the new node's description would take the target's place in its choice
    for seed in range(60):
        child = mutate(ROUTER, random.Random(seed), kind="add_node")
        assert nodes_of(child.dsl)["triage"]["handOffs"] == ["engine_expert", "knowledge_expert", "end"]


def test_delete_node_rewires_around_the_deleted_node():
    children = {}
    for seed in range(60):
        child = mutate(FAN, random.Random(seed), kind="delete_node")
        children[child.note.split(";")[0]] = child.dsl
    assert set(children) == {"deleted node engine", "deleted node costs", "deleted node writer"}
    without_engine = nodes_of(children["deleted node engine"])
    assert without_engine["scope"]["handOffs"] == ["writer", "costs"]
    assert without_engine["writer"]["waitFor"] == ["scope", "costs"]
    without_writer = nodes_of(children["deleted node writer"])
    assert without_writer["engine"]["handOffs"] == ["end"] and without_writer["costs"]["handOffs"] == ["end"]
    cycle = {mutate(CYCLE, random.Random(seed), kind="delete_node").note for seed in range(40)}
    # plan -> work -> review -> work: deleting review leaves work finishing, not looping on itself
    assert cycle == {"deleted node work; plan now hands off to review; review now hands off to end",
                     "deleted node review; work now hands off to end"}
    assert mutate(SINGLE, random.Random(0), kind="delete_node") is None


# ----------------------------------------------------------------------------------------------- crossover

def features(dsl):
    out = set()
    for item in parse(dsl)["nodes"]:
        for field in ("description", "gatewayModelId", "codeTools", "handOffs", "handOffType", "waitFor"):
            out.add((item["nodeId"], field, json.dumps(item[field])))
        out.update(("sentence", sentence) for sentence in sentences(item["systemPrompt"]))
    return out


def variant(dsl, **prompts):
    out = copy.deepcopy(dsl)
    for item in out["nodes"]:
        item["memory"] = {"from": "b"}
        if item["nodeId"] in prompts:
            item["systemPrompt"] = prompts[item["nodeId"]]
    return out


CHAIN_B = variant(CHAIN, research="Research the question in depth. Call knowledge_search before answering.",
                  draft="Draft the answer. Cite your sources.",
                  polish="Polish it for the reader. Answer as a bullet list. Answer in at most 80 words.")
CHAIN_B["nodes"][1]["gatewayModelId"] = "gpt-4o-mini"
CHAIN_B["nodes"][1]["handOffs"] = ["polish", "check"]
CHAIN_B["nodes"].append(node("check", "Check the facts. Call knowledge_search before answering.", ["end"],
                             codeTools=["knowledge_search"]))
FAN_B = variant(FAN, writer="Write one brief. Answer in one sentence.", engine="Research the engine runs.")
PAIRS = [(CHAIN, CHAIN_B), (CHAIN_B, CHAIN), (FAN, FAN_B), (CHAIN, FAN), (ROUTER, CYCLE), (SINGLE, CHAIN_B)]


@PROPERTY
@given(seed=st.integers(0, 2**32), pair=st.sampled_from(range(len(PAIRS))))
def test_crossover_children_are_valid_and_mix_both_parents(seed, pair):
    a, b = PAIRS[pair]
    child = crossover(a, b, random.Random(seed))
    assert child is not None
    assert (child.operation, child.kind) == ("crossover", "crossover")
    assert_sound(child, a, b)
    mine, theirs, own = features(a), features(b), features(child.dsl)
    assert own & (mine - theirs), child.note
    assert own & (theirs - mine), child.note
    for item in child.dsl["nodes"]:  # each node's memory is that of the parent it came from
        memories = [n["memory"] for parent in (a, b) for n in parse(parent)["nodes"] if n["nodeId"] == item["nodeId"]]
        assert not memories or item["memory"] in memories


def test_crossover_uses_every_mode():
    notes = [crossover(CHAIN, CHAIN_B, random.Random(seed)).note for seed in range(60)]
    assert any(note.startswith("uniform crossover of nodes: from b") for note in notes)
    assert any(note.startswith("splice at draft: b's subgraph from draft (draft, polish, check)") for note in notes)
    assert any(": prompt crossover: a's first" in note for note in notes)
    splice = next(crossover(CHAIN, CHAIN_B, random.Random(seed)) for seed in range(60)
                  if crossover(CHAIN, CHAIN_B, random.Random(seed)).note.startswith("splice at draft"))
    assert [n["nodeId"] for n in splice.dsl["nodes"]] == ["research", "draft", "polish", "check"]
    assert nodes_of(splice.dsl)["research"]["memory"] == nodes_of(CHAIN)["research"]["memory"]
    assert nodes_of(splice.dsl)["polish"]["memory"] == {"from": "b"}  # grafted from b, with b's memory
    assert nodes_of(splice.dsl)["check"]["memory"] == nodes_of(CHAIN_B)["check"]["memory"]


def test_prompt_crossover_keeps_directives_whole_and_brings_their_tool():
    a = workflow("answer", node("answer", "You answer. Answer in one sentence.", ["end"]))
    b = workflow("answer", node("answer", 'Look it up. Call knowledge_search before answering. If the sources do '
                                          'not contain the answer, say "I don\'t know. Sorry."', ["end"],
                                codeTools=["knowledge_search"]))
    seen = set()
    for seed in range(80):
        child = crossover(a, b, random.Random(seed))
        if child is None:
            continue
        prompt = child.dsl["nodes"][0]["systemPrompt"]
        for sentence in sentences(prompt):
            assert sentence in sentences(a["nodes"][0]["systemPrompt"]) + sentences(b["nodes"][0]["systemPrompt"])
        if "Call knowledge_search before answering." in prompt:
            assert "knowledge_search" in child.dsl["nodes"][0]["codeTools"]
        seen.add(prompt)
    assert 'If the sources do not contain the answer, say "I don\'t know. Sorry."' in sentences(
        b["nodes"][0]["systemPrompt"])
    assert len(seen) >= 3


def test_crossover_of_identical_parents_is_none():
    for base in BASES.values():
        assert crossover(base, copy.deepcopy(base), random.Random(0)) is None


# ---------------------------------------------------------------------------------------------- immigrants

@PROPERTY
@given(seed=st.integers(0, 2**32), base=st.sampled_from(sorted(BASES)))
def test_immigrants_are_valid_and_use_the_base_schemas_models_and_goal(seed, base):
    parent = copy.deepcopy(BASES[base])
    parent["nodes"][0]["gatewayModelId"] = "gpt-4.1-nano"
    goal = "Answer operators' questions about durable runs"
    child = immigrant(parent, random.Random(seed), material=Material(goal=goal))
    assert (child.operation, child.kind) == ("immigrant", "immigrant")
    assert_sound(child, parent)
    assert child.dsl["inputSchema"] == parse(parent)["inputSchema"]
    assert child.dsl["outputSchema"] == parse(parent)["outputSchema"]
    models = {n["gatewayModelId"] for n in parse(parent)["nodes"]}
    for item in child.dsl["nodes"]:
        assert item["gatewayModelId"] in models
        assert f"Your goal: {goal}." in item["systemPrompt"]
        for found in find_directives(item["systemPrompt"]):
            if found.key == "tool_first":
                assert found.arguments["tool"] in item["codeTools"]


def test_immigrants_come_from_every_template_with_varied_directives():
    rng = random.Random(3)
    children = [immigrant(CHAIN, rng) for _ in range(60)]
    assert {child.note.split(":")[0] for child in children} == {
        "immigrant (single", "immigrant (pipeline", "immigrant (router"}
    assert len({dsl_hash(child.dsl) for child in children}) > 30
    router = next(child.dsl for child in children if child.note.startswith("immigrant (router"))
    assert nodes_of(router)["router"]["handOffType"] == "conditional"
    # without a goal, the base's entry description is the goal
    child = immigrant(CHAIN, random.Random(0))
    assert "Your goal: Handles the research part of durable engine questions." in child.dsl["nodes"][0]["systemPrompt"]


# -------------------------------------------------------------------------------------------------- repair

def test_repair_fixes_dangling_references_and_a_missing_entry():
    broken = {
        "entryNodeId": "gone",
        "nodes": [
            {"nodeId": "a", "modelName": MODEL, "handOffs": ["b", "ghost"], "memory": {"kept": True}},
            {"nodeId": "b", "handOffs": ["ghost"], "waitFor": ["a", "phantom"], "maxSteps": 500},
            {"nodeId": "a", "modelName": "gpt-4o-mini", "handOffs": []},
            {"nodeId": "c", "modelName": MODEL, "handOffs": ["c", "a"], "handOffType": "parallel"},
            {"nodeId": "d", "modelName": MODEL, "handOffType": "whatever"},
            "not a node",
        ],
    }
    fixed = repair(broken)
    assert fixed == parse(fixed)
    nodes = nodes_of(fixed)
    assert fixed["entryNodeId"] == "a"
    assert [n["nodeId"] for n in fixed["nodes"]] == ["a", "b", "c", "d"]
    assert nodes["a"]["handOffs"] == ["b"] and nodes["a"]["memory"] == {"kept": True}
    assert nodes["a"]["gatewayModelId"] == MODEL  # the first `a`, not its duplicate
    assert nodes["b"]["handOffs"] == ["end"]  # its only target was missing: it finishes
    assert nodes["b"]["waitFor"] == ["a"] and nodes["b"]["maxSteps"] == 50
    assert nodes["b"]["gatewayModelId"] == MODEL  # no model: the first node's
    assert nodes["c"]["handOffs"] == ["a"]  # a parallel hand-off onto itself dropped
    assert nodes["d"]["handOffType"] == "sequential" and nodes["d"]["handOffs"] == []


def test_repair_keeps_a_valid_dsl_as_it_is():
    for base in BASES.values():
        assert repair(base) == parse(base)
        assert repair(json.dumps(base)) == parse(base)


@pytest.mark.parametrize("hopeless", [
    None, "not json", [], {}, {"nodes": []}, {"nodes": "a"}, {"nodes": [{"nodeId": "end", "modelName": MODEL}]},
    {"nodes": [{"nodeId": "a"}, {"nodeId": "b"}]},  # no model anywhere
    {"nodes": [{"description": "no id", "modelName": MODEL}]},
])
def test_repair_gives_up_on_hopeless_input(hopeless):
    assert repair(hopeless) is None


def test_the_model_pool_is_the_evolution_models_setting(settings):
    """An operator on Ollama sets EVOLUTION_MODELS; the model mutation draws from it, not from OpenAI names."""
    settings.EVOLUTION_MODELS = ["ollama#llama3.2", "ollama#qwen2.5:14b", MODEL]
    models = {nodes_of(mutate(SINGLE, random.Random(seed), kind="model").dsl)["answer"]["gatewayModelId"]
              for seed in range(20)}
    assert models == {"ollama#llama3.2", "ollama#qwen2.5:14b"}
