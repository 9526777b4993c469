"""The genetic operators of an evolution run: mutation, crossover, immigrants and repair on DSL dicts.

Pure functions: no database, no models, no clock, no uuid. Every random choice comes from the
``random.Random`` the caller passes in, and everything they choose from is a list in a fixed order
(the DSL's node order, the order of the tables below), never a set or a dict the caller built, so
a resumed run that re-seeds its generator breeds the same offspring.

Parents must be valid DSL documents (``workflows.dsl.parse``; ``DslError`` otherwise). Every
``Offspring`` is repaired (``repair``), passes ``parse``, differs from its parent(s) by
``dsl_hash`` (a choice that changes nothing is redrawn, at most ``ATTEMPTS`` times), and its
``note`` is one changelog line saying what changed. Every node keeps the ``memory`` of the parent
it comes from (a node a mutation added starts empty).

What each operator changes and why, the mutation weights, the material and the repair: docs/operators.md.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from llm.offline_directives import DIRECTIVES, FoundDirective, find_directives
from workflows.dsl import (
    BUILTIN_CODE_TOOLS,
    END,
    HANDOFF_TYPES,
    LIST_FIELDS,
    MAX_NAME,
    MAX_NODES,
    MAX_STEPS,
    DslError,
    canonical,
    dsl_hash,
    model_name,
    model_provider,
    normalize,
    parse,
)

MUTATION_WEIGHTS = {"model": 0.22, "prompt": 0.18, "tool": 0.18, "iterative": 0.15, "structure": 0.13,
                    "add_node": 0.07, "delete_node": 0.07}
PROMPT_OPERATIONS = (("add", 0.6), ("remove", 0.2), ("replace", 0.2))
FINISHING_BIAS = 0.75  # how often a prompt mutation picks among the nodes whose answer can be the output
TOOL_ADD_CHANCE = 0.6  # a tool mutation adds (when the node can take one) rather than removes
TOOL_DIRECTIVE_CHANCE = 0.5  # adding knowledge_search also adds its tool_first directive
IMMIGRANT_DIRECTIVE_CHANCE = 0.5  # each kind of directive of the pool, on an immigrant's finishing nodes
WORD_LIMITS = (40, 80)
MAX_TOOLS = 3  # tools per node (docs/limits.md)
ATTEMPTS = 12  # draws of one operator before it gives up on a child different from its parent(s)
REMOVABLE_EXTRA_WORDS = 4  # a directive's sentence is removed whole when it has at most this many other words
BEHAVIOUR_FIELDS = ("systemPrompt", "gatewayModelId", "codeTools", "mcpTools", "skills", "maxSteps")
BEHAVIOUR_LABELS = {"systemPrompt": "prompt", "gatewayModelId": "model", "codeTools": "tools", "mcpTools": "tools",
                    "skills": "skills", "maxSteps": "maxSteps"}
FORMAT_KEYS = ("json_fields", "one_sentence", "bullet_list", "max_words", "prefix", "unknown_answer")
# directive kinds that set the same thing: a node states one of them at a time
SLOT_OF_KEY = {"one_sentence": "shape", "bullet_list": "shape"}
_IDENTIFIER = re.compile(r"[A-Za-z_][\w-]*")
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]\u201d]*(?=\s|$)|\n")
_TERMINATED = re.compile(r"[.!?][\"')\]\u201d]*$")


@dataclass(frozen=True)
class Offspring:
    dsl: dict  # normalized and valid (workflows.dsl.parse passes)
    operation: str  # "mutation" | "crossover" | "immigrant"
    kind: str  # the mutation kind, or "crossover" / "immigrant"
    note: str  # one changelog line saying what changed


@dataclass(frozen=True)
class Material:
    """What the offline operators may draw on (docs/operators.md, "Material")."""

    # the model pool of the model mutation (EVOLUTION_MODELS)
    models: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(settings.EVOLUTION_MODELS))
    # names in workflows.dsl.BUILTIN_CODE_TOOLS go to a node's codeTools, any other to its mcpTools
    tools: tuple[str, ...] = ("knowledge_search", "skill_load")
    directives: tuple[str, ...] = ()  # extra canonical directive texts; the default pool is directive_pool(dsl)
    goal: str = ""


# ------------------------------------------------------------------------------------- the directive pool

def _schema_fields(dsl: dict) -> list[str]:
    properties = (dsl.get("outputSchema") or {}).get("properties")
    if not isinstance(properties, dict):
        return []
    return [name for name in properties if isinstance(name, str) and _IDENTIFIER.fullmatch(name)]


def directive_pool(dsl: dict) -> list[str]:
    """The canonical directive phrasings worth trying on this workflow, in a fixed order (see
    docs/operators.md): JSON fields of its output schema (when it has some), then tool, citation,
    quote, shape, length and unknown-answer directives."""
    texts = []
    fields = _schema_fields(dsl)
    if fields:
        texts.append(DIRECTIVES["json_fields"].text(fields=fields))
    texts.append(DIRECTIVES["tool_first"].text(tool="knowledge_search"))
    texts += [DIRECTIVES[key].text() for key in ("cite_sources", "quote_passage", "bullet_list", "one_sentence")]
    texts += [DIRECTIVES["max_words"].text(n=n) for n in WORD_LIMITS]
    texts.append(DIRECTIVES["unknown_answer"].text())
    return texts


def _pool(dsl: dict, material: Material) -> list[str]:
    return _dedupe([*directive_pool(dsl), *(text for text in material.directives if text and text.strip())])


# ------------------------------------------------------------------------------------------------ helpers

def _dedupe(items) -> list:
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _prompt(node: dict) -> str:
    """What the node's model reads as its system prompt (the runner falls back to the description)."""
    return node.get("systemPrompt") or node.get("description") or ""


def _finishes(node: dict) -> bool:
    return not node["handOffs"] or END in node["handOffs"]


def _by_id(dsl: dict) -> dict[str, dict]:
    return {node["nodeId"]: node for node in dsl["nodes"]}


def _node_tools(node: dict) -> list[str]:
    return [*node["codeTools"], *node["mcpTools"]]


def _slot(found: FoundDirective) -> str:
    if found.key == "tool_first":
        return "tool_first:" + str(found.arguments.get("tool", "")).casefold()
    return SLOT_OF_KEY.get(found.key, found.key)


def _slots(text: str) -> list[str]:
    """The kinds of directive `text` states (a text stating none is its own kind)."""
    return _dedupe(_slot(found) for found in find_directives(text)) or ["text:" + text]


def _canonical_text(found: FoundDirective) -> str | None:
    try:
        return DIRECTIVES[found.key].text(**found.arguments)
    except (TypeError, ValueError):
        return None


def _tools_named(text: str) -> list[str]:
    return _dedupe(found.arguments["tool"] for found in find_directives(text) if found.key == "tool_first")


def _can_offer(node: dict, tool: str, material: Material) -> bool:
    tools = _node_tools(node)
    return tool in tools or ((tool in BUILTIN_CODE_TOOLS or tool in material.tools) and len(tools) < MAX_TOOLS)


def _offer(node: dict, tool: str) -> bool:
    """Give the node the tool; whether it lacked it."""
    if tool in _node_tools(node):
        return False
    field = "codeTools" if tool in BUILTIN_CODE_TOOLS else "mcpTools"
    node[field] = [*node[field], tool]
    return True


def _offer_named(node: dict, text: str, material: Material) -> list[str]:
    """Offer the tools the tool_first directives of `text` name; the ones added."""
    return [tool for tool in _tools_named(text) if _can_offer(node, tool, material) and _offer(node, tool)]


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`: cut after . ! ? (and closing quotes) before a space,
    and at line breaks, never inside a directive."""
    protected = [(found.start, found.end) for found in find_directives(text)]
    cuts, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        cut = match.end()
        if any(low < cut < high for low, high in protected):
            continue
        cuts.append((start, cut))
        start = cut
    cuts.append((start, len(text)))
    spans = []
    for low, high in cuts:
        piece = text[low:high]
        if piece.strip():
            spans.append((low + len(piece) - len(piece.lstrip()), low + len(piece.rstrip())))
    return spans


def sentences(text: str) -> list[str]:
    """`text` as sentences, directives kept whole (the unit of prompt crossover)."""
    return [text[low:high] for low, high in _sentence_spans(text or "")]


def _append_sentence(prompt: str, sentence: str) -> str:
    """`sentence` after `prompt`, the prompt ended first so no negation of its last clause reaches it."""
    base = (prompt or "").rstrip()
    if not base:
        return sentence
    if not _TERMINATED.search(base):
        base += "."
    return f"{base} {sentence}"


def _cut(prompt: str, low: int, high: int, insert: str = "") -> str:
    before, after = prompt[:low], prompt[high:]
    if insert:
        return (before + insert + after).strip()
    if not before.strip() or not after.strip():
        return (before + after).strip()
    broke = "\n" in before[len(before.rstrip()):] or "\n" in after[: len(after) - len(after.lstrip())]
    return before.rstrip() + ("\n" if broke else " ") + after.lstrip()


def _removable(prompt: str) -> list[tuple[FoundDirective, int, int]]:
    """The directives of `prompt` stated in a sentence of their own (at most a few other words), with the
    sentence's span: what a prompt mutation may remove or replace."""
    found = find_directives(prompt)
    out = []
    for low, high in _sentence_spans(prompt):
        inside = [item for item in found if low <= item.start < high]
        if len(inside) != 1:
            continue
        item = inside[0]
        extra = len(prompt[low:item.start].split()) + len(prompt[min(item.end, high):high].split())
        if extra <= REMOVABLE_EXTRA_WORDS:
            out.append((item, low, high))
    return out


def _weighted(rng: random.Random, items: list[tuple[str, float]]) -> str:
    total = sum(weight for _, weight in items)
    point = rng.random() * total
    for name, weight in items:
        point -= weight
        if point < 0:
            return name
    return items[-1][0]


def _shuffled(rng: random.Random, items: list) -> list:
    return rng.sample(items, len(items))


def _fresh_id(dsl: dict, base: str) -> str:
    taken = {node["nodeId"] for node in dsl["nodes"]}
    if base not in taken:
        return base
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"


def _new_node(node_id: str, description: str, prompt: str, model: str, handoffs: list[str], *,
              handoff_type: str = "sequential") -> dict:
    return {"nodeId": node_id, "description": description, "systemPrompt": prompt, "gatewayModelId": model,
            "mcpTools": [], "codeTools": [], "handOffs": list(handoffs), "handOffType": handoff_type,
            "waitFor": [], "skills": [], "maxSteps": 5, "requiresApproval": False, "memory": {}}


def _compose(parts: list[str]) -> str:
    """Sentences joined; a directive whose kind the text already states is left out."""
    text, stated = "", []
    for part in parts:
        if not part:
            continue
        slots = [slot for slot in _slots(part) if not slot.startswith("text:")]
        if slots and all(slot in stated for slot in slots):
            continue
        stated += slots
        text = _append_sentence(text, part)
    return text


def _quote(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return f"'{text if len(text) <= limit else text[: limit - 3] + '...'}'"


def _reachable(dsl: dict, start: str) -> list[str]:
    nodes = _by_id(dsl)
    order, queue = [], [start]
    while queue:
        node_id = queue.pop(0)
        if node_id in order or node_id not in nodes:
            continue
        order.append(node_id)
        queue.extend(target for target in nodes[node_id]["handOffs"] if target != END)
    return order


def _fix_joins(dsl: dict) -> None:
    """A join waits only for nodes that hand off to it (any other wait would never be met)."""
    nodes = _by_id(dsl)
    for node in dsl["nodes"]:
        node["waitFor"] = [source for source in node["waitFor"]
                           if source in nodes and node["nodeId"] in nodes[source]["handOffs"]]


def _behaviour(node: dict) -> str:
    return json.dumps({field: sorted(node[field]) if field in LIST_FIELDS else node[field]
                       for field in BEHAVIOUR_FIELDS}, sort_keys=True)


def _subgraph_key(dsl: dict, node_ids: list[str]) -> str:
    nodes = _by_id(dsl)
    return json.dumps(canonical({"nodes": [nodes[node_id] for node_id in node_ids]}), sort_keys=True, default=str)


# ------------------------------------------------------------------------------------------------- repair

def _clean_node(raw: dict) -> dict:
    node = dict(raw)
    for field in (*LIST_FIELDS, "waitingFor"):
        value = node.get(field)
        if value is None:
            continue
        if not isinstance(value, list):
            node.pop(field)
            continue
        node[field] = [item for item in value if isinstance(item, str) and item and len(item) <= MAX_NAME]
    for field in ("description", "systemPrompt"):
        if field in node and not isinstance(node[field], str):
            node[field] = ""
    for field in ("gatewayModelId", "modelName"):
        if field in node and (not isinstance(node[field], str) or len(node[field]) > MAX_NAME):
            node.pop(field)
    if "memory" in node and not isinstance(node["memory"], dict):
        node["memory"] = {}
    return node


def _repair_pass(document: dict) -> dict | None:
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list):
        return None
    nodes = []
    for raw in raw_nodes:
        if not isinstance(raw, dict):
            continue
        node_id = raw.get("nodeId")
        if not isinstance(node_id, str) or not node_id.strip() or len(node_id) > MAX_NAME or node_id == END:
            continue
        nodes.append(_clean_node(raw))
    if not nodes:
        return None
    try:
        dsl = normalize({**document, "nodes": nodes})
    except DslError:
        return None
    unique, seen = [], []
    for node in dsl["nodes"]:
        if node["nodeId"] not in seen:
            seen.append(node["nodeId"])
            unique.append(node)
    entry = dsl.get("entryNodeId")
    if not isinstance(entry, str) or entry not in seen:
        entry = seen[0]
    if len(unique) > MAX_NODES:
        unique = [node for node in unique if node["nodeId"] == entry] + [
            node for node in unique if node["nodeId"] != entry][: MAX_NODES - 1]
    ids = [node["nodeId"] for node in unique]
    models = [node["gatewayModelId"] for node in unique if node["gatewayModelId"]]
    for node in unique:
        if node["handOffType"] not in HANDOFF_TYPES:
            node["handOffType"] = "sequential"
        kept = [target for target in node["handOffs"] if target == END or target in ids]
        if node["handOffType"] == "parallel":
            kept = [target for target in kept if target != node["nodeId"]]
        node["handOffs"] = kept if kept or not node["handOffs"] else [END]
        node["waitFor"] = [source for source in node["waitFor"] if source in ids and source != node["nodeId"]]
        steps = node["maxSteps"]
        if isinstance(steps, bool) or not isinstance(steps, int | float):
            node["maxSteps"] = 5
        else:
            node["maxSteps"] = min(MAX_STEPS, max(1, int(steps)))
        if not node["gatewayModelId"]:
            if not models:
                return None
            node["gatewayModelId"] = models[0]
        if not isinstance(node["systemPrompt"], str):
            node["systemPrompt"] = ""
        if not isinstance(node["memory"], dict):
            node["memory"] = {}
    dsl["nodes"] = unique
    dsl["entryNodeId"] = entry
    return dsl


def repair(dsl) -> dict | None:
    """The nearest valid DSL (docs/operators.md, "Repair"), normalized; None when there is none."""
    document = dsl
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document)
        except ValueError:
            return None
    if not isinstance(document, dict):
        return None
    document = copy.deepcopy(document)
    for _ in range(2):
        fixed = _repair_pass(document)
        if fixed is None:
            return None
        try:
            return parse(fixed)
        except DslError:
            document = fixed
    return None


# ---------------------------------------------------------------------------------------- mutation kinds

def _mutate_model(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    def bare(name: str) -> str:
        return model_name(name).rsplit("/", 1)[-1]

    options = []
    for node in dsl["nodes"]:
        current = node["gatewayModelId"]
        others = [model for model in _dedupe(material.models) if model and bare(model) != bare(current)]
        if others:
            options.append((node, others))
    if not options:
        return None
    node, others = rng.choice(options)
    current, choice = node["gatewayModelId"], rng.choice(others)
    if "#" not in choice:
        name = model_name(current)
        if "/" in name and "/" not in choice:
            choice = name.rsplit("/", 1)[0] + "/" + choice
        if model_provider(current):
            choice = f"{model_provider(current)}#{choice}"
    node["gatewayModelId"] = choice
    return dsl, f"{node['nodeId']}: model {current} -> {choice}"


def _prompt_options(node: dict, pool: list[str], material: Material) -> dict[str, list]:
    prompt = _prompt(node)
    present = {_slot(found) for found in find_directives(prompt)}

    def offerable(text: str) -> bool:
        return all(_can_offer(node, tool, material) for tool in _tools_named(text))

    add = [text for text in pool if not set(_slots(text)) & present and text not in prompt and offerable(text)]
    removable = _removable(prompt)
    replace = [(found, low, high, text) for found, low, high in removable for text in pool
               if _slots(text) == [_slot(found)] and text not in (prompt[low:high], _canonical_text(found))
               and offerable(text)]
    if not replace:
        replace = [(found, low, high, text) for found, low, high in removable for text in add]
    return {"add": add, "remove": removable, "replace": replace}


def _mutate_prompt(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    pool = _pool(dsl, material)
    nodes = dsl["nodes"]
    finishing = [node for node in nodes if _finishes(node)]
    first = finishing if finishing and rng.random() < FINISHING_BIAS else nodes
    first_ids = [node["nodeId"] for node in first]
    order = _shuffled(rng, first) + _shuffled(rng, [node for node in nodes if node["nodeId"] not in first_ids])
    for node in order:
        options = _prompt_options(node, pool, material)
        available = [(name, weight) for name, weight in PROMPT_OPERATIONS if options[name]]
        if not available:
            continue
        operation = _weighted(rng, available)
        prompt, node_id = _prompt(node), node["nodeId"]
        if operation == "add":
            text = rng.choice(options["add"])
            node["systemPrompt"] = _append_sentence(prompt, text)
            note = f"{node_id}: added {_quote(text)}"
        elif operation == "remove":
            _found, low, high = rng.choice(options["remove"])
            node["systemPrompt"] = _cut(prompt, low, high)
            return dsl, f"{node_id}: removed {_quote(prompt[low:high])}"
        else:
            _found, low, high, text = rng.choice(options["replace"])
            node["systemPrompt"] = _cut(prompt, low, high, text)
            note = f"{node_id}: replaced {_quote(prompt[low:high])} with {_quote(text)}"
        added = _offer_named(node, text, material)
        if added:
            note += " and added the tool " + ", ".join(added)
        return dsl, note
    return None


def _drop_tool_directives(node: dict, tool: str) -> list[str]:
    """Remove the tool_first sentences naming `tool`; the sentences removed."""
    removed = []
    while True:
        prompt = _prompt(node)
        match = next(((low, high) for found, low, high in _removable(prompt) if found.key == "tool_first"
                      and str(found.arguments.get("tool", "")).casefold() == tool.casefold()), None)
        if match is None:
            return removed
        removed.append(prompt[match[0]:match[1]])
        node["systemPrompt"] = _cut(prompt, *match)


def _mutate_tool(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    options = []
    for node in dsl["nodes"]:
        tools = _node_tools(node)
        adds = [tool for tool in _dedupe(material.tools) if tool not in tools] if len(tools) < MAX_TOOLS else []
        if adds or tools:
            options.append((node, adds, tools))
    if not options:
        return None
    node, adds, tools = rng.choice(options)
    node_id = node["nodeId"]
    if adds and (not tools or rng.random() < TOOL_ADD_CHANCE):
        tool = rng.choice(adds)
        _offer(node, tool)
        note = f"{node_id}: added the tool {tool}"
        if tool == "knowledge_search" and rng.random() < TOOL_DIRECTIVE_CHANCE:
            text = DIRECTIVES["tool_first"].text(tool=tool)
            if "tool_first:" + tool.casefold() not in {_slot(found) for found in find_directives(_prompt(node))}:
                node["systemPrompt"] = _append_sentence(_prompt(node), text)
                note += f" and {_quote(text)}"
        return dsl, note
    tool = rng.choice(tools)
    for field in ("codeTools", "mcpTools"):
        node[field] = [name for name in node[field] if name != tool]
    note = f"{node_id}: removed the tool {tool}"
    removed = _drop_tool_directives(node, tool)
    if removed:
        note += " and " + ", ".join(_quote(text) for text in removed)
    return dsl, note


def _structure_options(dsl: dict) -> list[tuple]:
    nodes = _by_id(dsl)
    awaited = [source for node in dsl["nodes"] for source in node["waitFor"]]
    options = []
    for node in dsl["nodes"]:
        targets = node["handOffs"]
        if len(targets) < 2:
            continue
        # a router runs one target: each must say what it is for, and no join may wait for one of them
        described = all(target == END or (nodes[target]["description"].strip() and target not in awaited)
                        for target in targets)
        for kind in HANDOFF_TYPES:
            if kind == node["handOffType"]:
                continue
            if kind == "parallel" and node["nodeId"] in targets:
                continue
            if kind == "conditional" and not described:
                continue
            options.append(("type", node["nodeId"], kind))
    predecessors: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    for node in dsl["nodes"]:
        for target in node["handOffs"]:
            if target in predecessors:
                predecessors[target].append(node["nodeId"])
    for node in dsl["nodes"]:
        if len(node["handOffs"]) != 1:
            continue
        first, second = node["nodeId"], node["handOffs"][0]
        if second in (END, first) or second == dsl["entryNodeId"] or predecessors[second] != [first]:
            continue
        after = nodes[second]
        if node["waitFor"] or after["waitFor"] or first in after["handOffs"] or second in after["handOffs"]:
            continue
        options.append(("swap", first, second))
    return options


def _mutate_structure(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    options = _structure_options(dsl)
    if not options:
        return None
    action, first, second = rng.choice(options)
    nodes = _by_id(dsl)
    if action == "type":
        node = nodes[first]
        before, node["handOffType"] = node["handOffType"], second
        return dsl, f"{first}: handOffType {before} -> {second} (to {', '.join(node['handOffs'])})"
    # swap two adjacent nodes of a chain: ... -> first -> second -> T  becomes  ... -> second -> first -> T
    u, v = nodes[first], nodes[second]
    for node in dsl["nodes"]:
        if node is not u and first in node["handOffs"]:
            node["handOffs"] = [second if target == first else target for target in node["handOffs"]]
    targets, kind = v["handOffs"], v["handOffType"]
    v["handOffs"], v["handOffType"] = [first], u["handOffType"]
    u["handOffs"], u["handOffType"] = targets, kind
    for node in dsl["nodes"]:
        if second in node["waitFor"]:
            node["waitFor"] = [first if source == second else source for source in node["waitFor"]]
    if dsl["entryNodeId"] == first:
        dsl["entryNodeId"] = second
    return dsl, f"swapped {first} and {second} in their chain: {second} now runs before {first}"


# ------------------------------------------------------------------------------------------ node patterns

@dataclass(frozen=True)
class NodePattern:
    """A node add_node can insert: `build(dsl, after)` gives its prompt and tools (None: not for this
    workflow), `after` being the node it follows."""

    name: str
    description: str
    build: Callable[[dict, dict], tuple[str, tuple[str, ...]] | None]


def _format_directives(node: dict) -> list[str]:
    texts = []
    for found in find_directives(_prompt(node)):
        if found.key in FORMAT_KEYS:
            text = _canonical_text(found)
            if text:
                texts.append(text)
    return _dedupe(texts)


def _build_researcher(dsl: dict, after: dict) -> tuple[str, tuple[str, ...]]:
    return _compose(["You research the question in the knowledge base.",
                     DIRECTIVES["tool_first"].text(tool="knowledge_search"),
                     DIRECTIVES["quote_passage"].text()]), ("knowledge_search",)


def _build_reviewer(dsl: dict, after: dict) -> tuple[str, tuple[str, ...]]:
    formats = _format_directives(after)
    if not formats:
        formats = next((found for node in dsl["nodes"] if _finishes(node)
                        for found in [_format_directives(node)] if found), [])
    if not formats and _schema_fields(dsl):
        formats = [DIRECTIVES["json_fields"].text(fields=_schema_fields(dsl))]
    if not formats:
        formats = [DIRECTIVES["max_words"].text(n=WORD_LIMITS[-1])]
    return _compose(["You review the draft answer you are given and rewrite it so that it answers the question.",
                     *formats]), ()


def _build_formatter(dsl: dict, after: dict) -> tuple[str, tuple[str, ...]] | None:
    fields = _schema_fields(dsl)
    if not fields:
        return None
    return _compose(["You turn the answer you are given into the workflow's output.",
                     DIRECTIVES["json_fields"].text(fields=fields)]), ()


NODE_PATTERNS: dict[str, NodePattern] = {pattern.name: pattern for pattern in (
    NodePattern("researcher", "Searches the knowledge base and quotes the passages that answer the question.",
                _build_researcher),
    NodePattern("reviewer", "Reviews the draft answer and rewrites it in the workflow's output format.",
                _build_reviewer),
    NodePattern("formatter", "Turns the answer into JSON with the fields of the workflow's output schema.",
                _build_formatter),
)}


def _insertion_points(dsl: dict) -> list[tuple[str, str]]:
    points = []
    for node in dsl["nodes"]:
        if node["handOffType"] == "conditional" and len(node["handOffs"]) > 1:
            continue
        points += [(node["nodeId"], target) for target in (node["handOffs"] or [END])]
    return points


def _mutate_add_node(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    if len(dsl["nodes"]) >= MAX_NODES:
        return None
    points = _insertion_points(dsl)
    if not points:
        return None
    before_id, target = rng.choice(points)
    nodes = _by_id(dsl)
    after = nodes[before_id]
    built = [(pattern, result) for pattern in NODE_PATTERNS.values()
             for result in [pattern.build(dsl, after)] if result is not None]
    pattern, (prompt, tools) = rng.choice(built)
    new_id = _fresh_id(dsl, pattern.name)
    node = _new_node(new_id, pattern.description, prompt, after["gatewayModelId"], [target])
    for tool in tools:
        _offer(node, tool)
    if not after["handOffs"]:
        after["handOffs"] = [new_id]
    else:
        after["handOffs"] = [new_id if name == target else name for name in after["handOffs"]]
    if target != END:
        joined = nodes[target]
        joined["waitFor"] = [new_id if source == before_id else source for source in joined["waitFor"]]
    dsl["nodes"].insert([n["nodeId"] for n in dsl["nodes"]].index(before_id) + 1, node)
    where = f"between {before_id} and {target}" if target != END else f"after {before_id}, before end"
    return dsl, f"added node {new_id} ({pattern.name}) {where}"


def _mutate_delete_node(dsl: dict, rng: random.Random, material: Material) -> tuple[dict, str] | None:
    candidates = [node for node in dsl["nodes"] if node["nodeId"] != dsl["entryNodeId"]]
    if not candidates:
        return None
    gone = rng.choice(candidates)
    gone_id = gone["nodeId"]
    successors = [target for target in gone["handOffs"] if target != gone_id] or [END]
    dsl["nodes"] = [node for node in dsl["nodes"] if node is not gone]
    predecessors = [node for node in dsl["nodes"] if gone_id in node["handOffs"]]
    changes = []
    for node in predecessors:
        own = node["nodeId"] in node["handOffs"]
        targets = _dedupe(name for target in node["handOffs"]
                          for name in (successors if target == gone_id else [target]))
        targets = [name for name in targets if name != node["nodeId"] or own] or [END]
        node["handOffs"] = targets
        changes.append(f"{node['nodeId']} now hands off to {', '.join(targets)}")
    for node in dsl["nodes"]:
        if gone_id in node["waitFor"]:
            instead = [p["nodeId"] for p in predecessors if node["nodeId"] in p["handOffs"]]
            waits = _dedupe(name for source in node["waitFor"] for name in (instead if source == gone_id else [source]))
            node["waitFor"] = [name for name in waits if name != node["nodeId"]]
    return dsl, f"deleted node {gone_id}" + (f"; {'; '.join(changes)}" if changes else "")


_KINDS: dict[str, Callable[[dict, random.Random, Material], tuple[dict, str] | None]] = {
    "model": _mutate_model,
    "prompt": _mutate_prompt,
    "tool": _mutate_tool,
    "structure": _mutate_structure,
    "add_node": _mutate_add_node,
    "delete_node": _mutate_delete_node,
}


# ---------------------------------------------------------------------------------------------- mutation

def _keep_memory(child: dict, parent: dict) -> None:
    memories = {node["nodeId"]: node["memory"] for node in parent["nodes"]}
    for node in child["nodes"]:
        if node["nodeId"] in memories:
            node["memory"] = copy.deepcopy(memories[node["nodeId"]])


def _kind_weights(weights: dict | None) -> list[tuple[str, float]]:
    table = MUTATION_WEIGHTS if weights is None else weights
    unknown = sorted(str(kind) for kind in table if kind not in MUTATION_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown mutation kinds {', '.join(unknown)}; the kinds are {', '.join(MUTATION_WEIGHTS)}")
    items = [(kind, float(table.get(kind, 0) or 0)) for kind in MUTATION_WEIGHTS]  # docs/operators.md's order, always
    if any(weight < 0 for _, weight in items):
        raise ValueError("mutation weights are at least 0")
    items = [(kind, weight) for kind, weight in items if weight > 0]
    if not items:
        raise ValueError("at least one mutation weight must be above 0")
    return items


def _finish_child(candidate: dict, parent: dict, parent_hash: str) -> dict | None:
    child = repair(candidate)
    if child is None or dsl_hash(child) == parent_hash:
        return None
    _keep_memory(child, parent)
    return child


def _mutate_kind(parent: dict, parent_hash: str, kind: str, rng: random.Random, material: Material,
                 iterative: Callable[[dict], tuple[dict, str] | None] | None) -> Offspring | None:
    if kind == "iterative":
        if iterative is not None:
            result = iterative(copy.deepcopy(parent))
            if result:
                proposed, note = result
                child = _finish_child(proposed, parent, parent_hash)
                if child is not None:
                    return Offspring(child, "mutation", "iterative", str(note) or "judge-guided rewrite")
        kind = "prompt"  # nothing (new) from the rewriter: a prompt mutation instead, reported as one
    operator = _KINDS[kind]
    for _ in range(ATTEMPTS):
        result = operator(copy.deepcopy(parent), rng, material)
        if result is None:  # the kind has no choice on this workflow
            return None
        candidate, note = result
        child = _finish_child(candidate, parent, parent_hash)
        if child is not None:
            return Offspring(child, "mutation", kind, note)
    return None


def mutate(dsl: dict, rng: random.Random, *, material: Material | None = None, kind: str | None = None,
           weights: dict | None = None,
           iterative: Callable[[dict], tuple[dict, str] | None] | None = None) -> Offspring | None:
    """A mutant of `dsl` (docs/operators.md): of `kind`, else of a kind drawn by `weights`
    (default ``MUTATION_WEIGHTS``; a kind that cannot apply is left out and another drawn). None when
    nothing applies. `iterative(dsl)` returns (dsl, changelog line) or None."""
    material = material or Material()
    parent = parse(dsl)
    parent_hash = dsl_hash(parent)
    if kind is not None:
        if kind not in MUTATION_WEIGHTS:
            raise ValueError(f"unknown mutation kind {kind!r}; the kinds are {', '.join(MUTATION_WEIGHTS)}")
        return _mutate_kind(parent, parent_hash, kind, rng, material, iterative)
    remaining = _kind_weights(weights)
    while remaining:
        chosen = _weighted(rng, remaining)
        offspring = _mutate_kind(parent, parent_hash, chosen, rng, material, iterative)
        if offspring is not None:
            return offspring
        remaining = [(name, weight) for name, weight in remaining if name != chosen]
    return None


# --------------------------------------------------------------------------------------------- crossover

def _cross_uniform(a: dict, b: dict, rng: random.Random) -> tuple[dict, str] | None:
    donors = _by_id(b)
    differing = [node for node in a["nodes"]
                 if node["nodeId"] in donors and _behaviour(node) != _behaviour(donors[node["nodeId"]])]
    if not differing:
        return None
    picks = [rng.random() < 0.5 for _ in differing]
    if not any(picks):
        picks[rng.randrange(len(picks))] = True
    if len(picks) > 1 and all(picks):
        picks[rng.randrange(len(picks))] = False
    taken = []
    for node, pick in zip(differing, picks, strict=True):
        if not pick:
            continue
        donor = donors[node["nodeId"]]
        changed = _dedupe(BEHAVIOUR_LABELS[field] for field in BEHAVIOUR_FIELDS if node[field] != donor[field])
        for field in BEHAVIOUR_FIELDS:
            node[field] = copy.deepcopy(donor[field])
        taken.append(f"{node['nodeId']} ({', '.join(changed)})")
    return a, "uniform crossover of nodes: from b " + ", ".join(taken) + "; the rest from a"


def _cross_splice(a: dict, b: dict, rng: random.Random) -> tuple[dict, str] | None:
    donors = _by_id(b)
    a_ids = [node["nodeId"] for node in a["nodes"]]
    points = []
    for node_id in a_ids:
        if node_id not in donors or node_id == a["entryNodeId"]:
            continue
        ours, theirs = _reachable(a, node_id), _reachable(b, node_id)
        if len(ours) == len(a_ids) or _subgraph_key(a, ours) == _subgraph_key(b, theirs):
            continue
        points.append((node_id, ours, theirs))
    if not points:
        return None
    at, ours, theirs = rng.choice(points)
    nodes, placed = [], []
    for node in a["nodes"]:
        node_id = node["nodeId"]
        if node_id in theirs:
            nodes.append(copy.deepcopy(donors[node_id]))
            placed.append(node_id)
        elif node_id not in ours:
            nodes.append(node)
    nodes += [copy.deepcopy(node) for node in b["nodes"] if node["nodeId"] in theirs and node["nodeId"] not in placed]
    a["nodes"] = nodes
    _fix_joins(a)
    return a, f"splice at {at}: b's subgraph from {at} ({', '.join(theirs)}) in place of a's ({', '.join(ours)})"


def _cross_prompt(a: dict, b: dict, rng: random.Random) -> tuple[dict, str] | None:
    donors = _by_id(b)
    pairs = [(node, donors[node["nodeId"]]) for node in a["nodes"] if node["nodeId"] in donors
             and _prompt(node) != _prompt(donors[node["nodeId"]]) and sentences(_prompt(donors[node["nodeId"]]))]
    if not any(node["nodeId"] in donors for node in a["nodes"]):  # nothing to pair by id: pair by role
        pairs = [(node, donor) for node in a["nodes"] if _finishes(node) for donor in b["nodes"]
                 if _finishes(donor) and _prompt(node) != _prompt(donor) and sentences(_prompt(donor))]
    if not pairs:
        return None
    node, donor = rng.choice(pairs)
    ours, theirs = sentences(_prompt(node)), sentences(_prompt(donor))
    keep = rng.randint(1, len(ours)) if ours else 0
    start = rng.randrange(len(theirs))
    head = ours[:keep]
    stated = [slot for sentence in head for slot in _slots(sentence) if not slot.startswith("text:")]
    tail = []
    for sentence in theirs[start:]:
        slots = [slot for slot in _slots(sentence) if not slot.startswith("text:")]
        if sentence in head or sentence in tail or (slots and all(slot in stated for slot in slots)):
            continue
        tail.append(sentence)
        stated += slots
    node["systemPrompt"] = " ".join(head + tail)
    added = []
    for tool in _tools_named(" ".join(tail)):
        if (tool in _node_tools(donor) or tool in BUILTIN_CODE_TOOLS) and len(_node_tools(node)) < MAX_TOOLS \
                and _offer(node, tool):
            added.append(tool)
    paired = "" if donor["nodeId"] == node["nodeId"] else f" (b's {donor['nodeId']})"
    note = (f"{node['nodeId']}: prompt crossover: a's first {keep} of {len(ours)} sentences + b's{paired} "
            f"{_quote(' '.join(tail))}")
    if added:
        note += " and the tool " + ", ".join(added)
    return a, note


CROSSOVERS: dict[str, Callable[[dict, dict, random.Random], tuple[dict, str] | None]] = {
    "uniform": _cross_uniform,
    "splice": _cross_splice,
    "prompt": _cross_prompt,
}


def crossover(dsl_a: dict, dsl_b: dict, rng: random.Random) -> Offspring | None:
    """A child of two parents (docs/operators.md), different from both; None when none comes out."""
    a, b = parse(dsl_a), parse(dsl_b)
    hashes = (dsl_hash(a), dsl_hash(b))
    modes = list(CROSSOVERS)
    for _ in range(ATTEMPTS):
        if not modes:
            return None
        mode = rng.choice(modes)
        result = CROSSOVERS[mode](copy.deepcopy(a), b, rng)
        if result is None:  # this mode has no choice on these parents
            modes.remove(mode)
            continue
        candidate, note = result
        child = repair(candidate)
        if child is not None and dsl_hash(child) not in hashes:
            return Offspring(child, "crossover", "crossover", note)
    return None


# -------------------------------------------------------------------------------------------- immigrants

@dataclass(frozen=True)
class ImmigrantTemplate:
    """A fresh workflow shape: `build(model, goal, extras)` gives (entry id, nodes); `model()` draws a
    model for each node, `goal` is the goal sentence, `extras` the directives for the nodes that finish."""

    name: str
    summary: str
    build: Callable[[Callable[[], str], str, list[str]], tuple[str, list[dict]]]


def _single(model: Callable[[], str], goal: str, extras: list[str]) -> tuple[str, list[dict]]:
    return "answerer", [_new_node("answerer", "Answers the request.",
                                  _compose(["You answer the request.", goal, *extras]), model(), [END])]


def _pipeline(model: Callable[[], str], goal: str, extras: list[str]) -> tuple[str, list[dict]]:
    researcher = _new_node(
        "researcher", NODE_PATTERNS["researcher"].description,
        _compose(["You research the request in the knowledge base.", goal,
                  DIRECTIVES["tool_first"].text(tool="knowledge_search"), DIRECTIVES["quote_passage"].text()]),
        model(), ["writer"])
    writer = _new_node("writer", "Writes the answer from the researcher's findings.",
                       _compose(["You write the answer from the researcher's findings.", goal, *extras]),
                       model(), [END])
    return "researcher", [researcher, writer]


def _router(model: Callable[[], str], goal: str, extras: list[str]) -> tuple[str, list[dict]]:
    router = _new_node("router", "Reads the request and chooses the specialist who answers it.",
                       _compose(["You read the request and decide who answers it.", goal]), model(),
                       ["search_specialist", "direct_specialist"], handoff_type="conditional")
    search = _new_node(
        "search_specialist",
        "Answers questions whose facts are in the knowledge base: it searches, quotes and cites the passages.",
        _compose(["You answer from the knowledge base.", goal, DIRECTIVES["tool_first"].text(tool="knowledge_search"),
                  DIRECTIVES["cite_sources"].text(), *extras]), model(), [END])
    direct = _new_node(
        "direct_specialist",
        "Answers from the text the request itself holds: summaries, rewrites and extraction from given notes or data.",
        _compose(["You answer from the text of the request itself.", goal, *extras]), model(), [END])
    return "router", [router, search, direct]


IMMIGRANT_TEMPLATES: dict[str, ImmigrantTemplate] = {template.name: template for template in (
    ImmigrantTemplate("single", "one node answers", _single),
    ImmigrantTemplate("pipeline", "a researcher retrieves and quotes, a writer answers", _pipeline),
    ImmigrantTemplate("router", "a router chooses a knowledge-base specialist or a direct one", _router),
)}


def _goal_sentence(base: dict, material: Material) -> str:
    entry = _by_id(base).get(base["entryNodeId"], {})
    goal = " ".join((material.goal or entry.get("description") or "").split())
    if not goal:
        return ""
    return f"Your goal: {goal}" if _TERMINATED.search(goal) else f"Your goal: {goal}."


def _extras(rng: random.Random, pool: list[str]) -> list[str]:
    groups: list[tuple[str, list[str]]] = []
    for text in pool:
        slot = "+".join(_slots(text))
        for name, texts in groups:
            if name == slot:
                texts.append(text)
                break
        else:
            groups.append((slot, [text]))
    return [rng.choice(texts) for _slot_name, texts in groups if rng.random() < IMMIGRANT_DIRECTIVE_CHANCE]


def _instantiate(base: dict, template: ImmigrantTemplate, rng: random.Random, material: Material, goal: str,
                 extras: list[str]) -> dict:
    models = _dedupe(node["gatewayModelId"] for node in base["nodes"]) or list(material.models)
    entry, nodes = template.build(lambda: rng.choice(models), goal, extras)
    for node in nodes:
        _offer_named(node, node["systemPrompt"], material)
    out = {key: copy.deepcopy(value) for key, value in base.items() if key not in ("nodes", "entryNodeId")}
    out["entryNodeId"] = entry
    out["nodes"] = nodes
    return out


def immigrant(dsl: dict, rng: random.Random, *, material: Material | None = None) -> Offspring:
    """A fresh workflow from ``IMMIGRANT_TEMPLATES`` for the base `dsl` (docs/operators.md),
    different from the base."""
    material = material or Material()
    base = parse(dsl)
    base_hash = dsl_hash(base)
    pool, goal, names = _pool(base, material), _goal_sentence(base, material), list(IMMIGRANT_TEMPLATES)
    for _ in range(ATTEMPTS):
        template = IMMIGRANT_TEMPLATES[rng.choice(names)]
        extras = _extras(rng, pool)
        child = repair(_instantiate(base, template, rng, material, goal, extras))
        if child is not None and dsl_hash(child) != base_hash:
            chosen = ", ".join(_quote(text) for text in extras) or "no extra directives"
            ids = " -> ".join(node["nodeId"] for node in child["nodes"])
            return Offspring(child, "immigrant", "immigrant", f"immigrant ({template.name}: {ids}) with {chosen}")
    # the templates differ in their node ids, so at most one of them, bare, can equal the base
    for name in names:
        template = IMMIGRANT_TEMPLATES[name]
        child = repair(_instantiate(base, template, rng, material, goal, []))
        if child is not None and dsl_hash(child) != base_hash:
            ids = " -> ".join(node["nodeId"] for node in child["nodes"])
            return Offspring(child, "immigrant", "immigrant", f"immigrant ({name}: {ids}) with no extra directives")
    raise AssertionError("every immigrant template equals the base")  # unreachable: the templates differ
