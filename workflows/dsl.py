"""The workflow DSL: parsing, validation and the canonical form a version is addressed by.

The format is a superset of the seed system's exported workflows, which import unchanged:
`modelName` is an alias of `gatewayModelId` and `waitingFor` of `waitFor`; `__schema_version`,
`handOffType` and `systemPrompt` may be missing; a model name may carry a provider prefix
(`openrouter#openai/gpt-4.1-mini`); the hand-off target `end` finishes the invocation. Tools a
fresh install lacks are not errors here: they are listed as unresolved, and an invocation of such
a version is refused before anything is paid.

``normalize`` turns a document into the stored DSL (aliases resolved, defaults filled in, the type of
every field checked: a missing or null field takes its default, any other wrong type is an error);
``validate`` raises ``DslError`` naming the node and the field; ``dsl_hash`` is the SHA-256 of the
canonical form (docs/content-hash.md): keys sorted recursively, nodes sorted by id, node `memory` and
unknown node fields dropped, lists de-duplicated, the tool and skill lists (sets to the runner) sorted
and the hand-off and waitFor lists kept in their order (the runner's order).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from config.errors import Invalid

SCHEMA_VERSION = 1
END = "end"
HANDOFF_TYPES = ("sequential", "parallel", "conditional")
MAX_NODES = 20
MAX_STEPS = 50
MAX_NAME = 200  # node ids, model names, tool and skill names
# the code tools the platform provides; anything else in `codeTools` is unresolved on a fresh install
BUILTIN_CODE_TOOLS = frozenset({"knowledge_search", "skill_load"})

NODE_FIELDS = ("nodeId", "description", "systemPrompt", "gatewayModelId", "mcpTools", "codeTools", "handOffs",
               "handOffType", "waitFor", "skills", "maxSteps", "requiresApproval", "memory")
# fields of a node that take part in its identity (everything but `memory`)
HASHED_NODE_FIELDS = tuple(field for field in NODE_FIELDS if field != "memory")
LIST_FIELDS = ("mcpTools", "codeTools", "handOffs", "waitFor", "skills")
# lists whose order means nothing to the runner (the tools offered, the skills named): stored and hashed
# sorted. The others keep their order in both: sequential hand-offs run in it and the invocation answers
# from the last node to reach `end`; a join reads its inputs in its waitFor order.
SET_FIELDS = ("mcpTools", "codeTools", "skills")
ALIASES = {"modelName": "gatewayModelId", "waitingFor": "waitFor"}


class DslError(Invalid):
    """A DSL document that cannot be a workflow; `errors` maps a field path to its messages. Bad input (a 400
    naming each path wherever it reaches the API's handler: a rewrite or an evolution copies a stored DSL)."""


class _Errors:
    def __init__(self):
        self.items: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.items.setdefault(path, []).append(message)

    def raise_if_any(self) -> None:
        if self.items:
            raise DslError(self.items)


def _node_path(index: int, node_id) -> str:
    return f"nodes[{node_id}]" if isinstance(node_id, str) and node_id else f"nodes[{index}]"


def _string_list(value, path: str, errors: _Errors) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        errors.add(path, "must be a list of non-empty names")
        return []
    if any(len(item) > MAX_NAME for item in value):
        errors.add(path, f"names are at most {MAX_NAME} characters")
        return []
    seen: list[str] = []
    for item in value:
        if item not in seen:
            seen.append(item)
    return seen


# what each typed field must be: (the type, the error message); a missing or null field takes its default
_TEXT = (str, "must be text")
_OBJECT = (dict, "must be an object")
NODE_TYPES = {
    "nodeId": _TEXT, "description": _TEXT, "systemPrompt": _TEXT, "gatewayModelId": _TEXT,
    "handOffType": (str, f"must be one of {', '.join(HANDOFF_TYPES)}"),
    "maxSteps": (int, f"must be a whole number from 1 to {MAX_STEPS}"),
    "requiresApproval": (bool, "must be true or false"), "memory": _OBJECT,
}
NODE_DEFAULTS = {"nodeId": None, "description": "", "systemPrompt": "", "gatewayModelId": "",
                 "handOffType": "sequential", "maxSteps": 5, "requiresApproval": False, "memory": dict}
WORKFLOW_TYPES = {"entryNodeId": _TEXT, "inputSchema": _OBJECT, "outputSchema": _OBJECT}
WORKFLOW_DEFAULTS = {"entryNodeId": "", "inputSchema": dict, "outputSchema": dict}


def _typed(value, expected: tuple[type, str], default, path: str, errors: _Errors):
    """`value` when it has the field's type (a bool is not a number), the default when it is missing
    or null (`dict`: a new object); any other value is an error naming the field (and the default
    stands in, so every error of the document is found at once)."""
    kind, message = expected
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        errors.add(path, message)
        value = None
    if value is None:
        return default() if default is dict else default
    return value


def normalize(document) -> dict:
    """The stored form of a DSL document: aliases resolved, defaults filled in, every field's type
    checked, unknown node fields dropped (a workflow's own top-level extras are kept), lists de-duplicated
    and the sets among them (``SET_FIELDS``) sorted. Raises DslError
    on a document that is not a workflow at all, naming each field of the wrong type (validation of
    the graph is ``validate``'s)."""
    errors = _Errors()
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise DslError({"dsl": [f"is not JSON: {exc}"]}) from None
    if not isinstance(document, dict):
        raise DslError({"dsl": ["must be a JSON object with `entryNodeId` and `nodes`"]})
    nodes = document.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        errors.add("nodes", "must be a non-empty list of nodes")
        errors.raise_if_any()
    out = {key: value for key, value in document.items() if key not in ("nodes",)}
    version = document.get("__schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or isinstance(version, bool):
        errors.add("__schema_version", f"must be {SCHEMA_VERSION} (the only version this installation reads)")
    out["__schema_version"] = SCHEMA_VERSION
    for field, expected in WORKFLOW_TYPES.items():
        out[field] = _typed(document.get(field), expected, WORKFLOW_DEFAULTS[field], field, errors)
    normalized = []
    for index, raw in enumerate(nodes):
        if not isinstance(raw, dict):
            errors.add(f"nodes[{index}]", "must be an object")
            continue
        node = {ALIASES.get(key, key): value for key, value in raw.items() if key not in ALIASES}
        path = _node_path(index, node.get("nodeId"))
        for alias, field in ALIASES.items():
            if alias in raw:
                if field == "waitFor" and field in node:  # both spellings: merged (each must be a list)
                    lists = [value for value in (node[field], raw[alias]) if value is not None]
                    if not all(isinstance(value, list) for value in lists):
                        errors.add(f"{path}.waitFor", "must be a list of node ids (waitFor and waitingFor)")
                        node[field] = []
                        continue
                    node[field] = [item for value in lists for item in value]
                elif node.get(field) is None:
                    node[field] = raw[alias]
        clean = {field: _typed(node.get(field), expected, NODE_DEFAULTS[field], f"{path}.{field}", errors)
                 for field, expected in NODE_TYPES.items()}
        for field in LIST_FIELDS:
            clean[field] = _string_list(node.get(field), f"{path}.{field}", errors)
            if field in SET_FIELDS:
                clean[field].sort()
        normalized.append(clean)
    errors.raise_if_any()
    out["nodes"] = normalized
    return out


def validate(dsl: dict, *, known_models: Iterable[str] | None = None) -> None:
    """Check a normalized DSL's graph; raises DslError naming each node and field at fault.

    Unknown tools are not errors (``unresolved_tools`` lists them); an unknown model is one only when
    `known_models` is given (the models the installation can call)."""
    errors = _Errors()
    nodes = dsl.get("nodes") or []
    ids: list[str] = []
    for index, node in enumerate(nodes):
        node_id = node.get("nodeId")
        path = _node_path(index, node_id)
        if not isinstance(node_id, str) or not node_id.strip():
            errors.add(f"{path}.nodeId", "is required")
            continue
        if len(node_id) > MAX_NAME:
            errors.add(f"{path}.nodeId", f"at most {MAX_NAME} characters")
        if node_id == END:
            errors.add(f"{path}.nodeId", f"`{END}` is reserved for the hand-off that finishes the invocation")
        if node_id in ids:
            errors.add(f"{path}.nodeId", f"duplicate node id {node_id!r}")
        ids.append(node_id)
    if len(nodes) > MAX_NODES:
        errors.add("nodes", f"at most {MAX_NODES} nodes, not {len(nodes)}")
    entry = dsl.get("entryNodeId")
    if not isinstance(entry, str) or not entry:
        errors.add("entryNodeId", "is required")
    elif entry not in ids:
        errors.add("entryNodeId", f"names no node: {entry!r}")
    for field in ("inputSchema", "outputSchema"):
        _check_json_schema(dsl.get(field), field, errors)
    models = set(known_models) if known_models is not None else None
    for index, node in enumerate(nodes):
        node_id = node.get("nodeId")
        if not isinstance(node_id, str) or not node_id:
            continue
        path = _node_path(index, node_id)
        for target in node["handOffs"]:
            if target != END and target not in ids:
                errors.add(f"{path}.handOffs", f"unknown hand-off target {target!r}")
            if target == node_id and node["handOffType"] == "parallel":
                errors.add(f"{path}.handOffs", "a parallel hand-off cannot target its own node")
        for source in node["waitFor"]:
            if source not in ids:
                errors.add(f"{path}.waitFor", f"waits for an unknown node {source!r}")
        if node["handOffType"] not in HANDOFF_TYPES:
            errors.add(f"{path}.handOffType", f"must be one of {', '.join(HANDOFF_TYPES)}, "
                                              f"not {node['handOffType']!r}")
        steps = node["maxSteps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
            errors.add(f"{path}.maxSteps", f"must be a whole number from 1 to {MAX_STEPS}")
        model = node["gatewayModelId"]
        if not isinstance(model, str) or not model:
            errors.add(f"{path}.gatewayModelId", "is required (or `modelName`)")
        elif len(model) > MAX_NAME:
            errors.add(f"{path}.gatewayModelId", f"at most {MAX_NAME} characters")
        elif models is not None and model_name(model) not in models:
            errors.add(f"{path}.gatewayModelId", f"unknown model {model!r}")
    errors.raise_if_any()


def _check_json_schema(schema, field: str, errors: _Errors) -> None:
    """An input or output schema that cannot be used is an error naming its field: stored, an input schema
    would check no input and an output schema fail every structured-output call. A schema that refers to
    itself without end is valid JSON Schema; an input it meets is refused when checked (services.input_check)."""
    from jsonschema.exceptions import SchemaError

    from config.user_regex import check_schema

    if not isinstance(schema, dict) or not schema:
        return
    try:
        check_schema(schema)
    except SchemaError as exc:
        errors.add(field, f"is not a usable JSON Schema (Draft 2020-12): {exc.message}")
    except RecursionError:
        errors.add(field, "is not a usable JSON Schema (Draft 2020-12): nested too deeply to be checked")


def parse(document, *, known_models: Iterable[str] | None = None) -> dict:
    """normalize + validate: the stored DSL of a document, or DslError."""
    dsl = normalize(document)
    validate(dsl, known_models=known_models)
    return dsl


def model_name(model: str) -> str:
    """The model part of a possibly provider-prefixed name: `openrouter#openai/gpt-4.1-mini` ->
    `openai/gpt-4.1-mini`."""
    return model.split("#", 1)[1] if "#" in model else model


def model_provider(model: str) -> str:
    """The provider of a model name ("" for a bare name: the default provider)."""
    return model.split("#", 1)[0] if "#" in model else ""


def unresolved_tools(dsl: dict, *, mcp_tools: Iterable[str] = ()) -> list[str]:
    """Tools the DSL names that this installation does not provide, sorted (`node.tool`)."""
    available_mcp = set(mcp_tools)
    missing = set()
    for node in dsl["nodes"]:
        missing.update(f"{node['nodeId']}.{tool}" for tool in node["codeTools"] if tool not in BUILTIN_CODE_TOOLS)
        missing.update(f"{node['nodeId']}.{tool}" for tool in node["mcpTools"] if tool not in available_mcp)
    return sorted(missing)


def canonical(dsl: dict) -> dict:
    """The form a version is addressed by: nodes sorted by id with their hashed fields only, every
    list de-duplicated, the sets among them (``SET_FIELDS``) sorted and the others in their order,
    keys sorted recursively (by the serialisation)."""
    nodes = []
    for node in dsl["nodes"]:
        item = {field: node.get(field) for field in HASHED_NODE_FIELDS}
        for field in LIST_FIELDS:
            values = dict.fromkeys(node.get(field) or [])
            item[field] = sorted(values) if field in SET_FIELDS else list(values)
        nodes.append(item)
    out = {key: value for key, value in dsl.items() if key != "nodes"}
    out["nodes"] = sorted(nodes, key=lambda node: node["nodeId"])
    return out


def dsl_hash(dsl: dict) -> str:
    """SHA-256 of the canonical form: the same workflow however its keys, nodes or lists are ordered."""
    text = json.dumps(canonical(dsl), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
