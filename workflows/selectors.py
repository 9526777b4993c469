"""Reads on workflows and their versions."""

from __future__ import annotations

import difflib
import json

from workflows import dsl as dsl_module
from workflows.models import WorkflowVersion

NODE_FIELDS_COMPARED = ("description", "gatewayModelId", "mcpTools", "codeTools", "handOffs", "handOffType",
                        "waitFor", "skills", "maxSteps", "requiresApproval")


def _pretty(dsl: dict) -> list[str]:
    return json.dumps(dsl_module.canonical(dsl), indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def version_diff(old: WorkflowVersion, new: WorkflowVersion) -> dict:
    """What changed from `old` to `new`: a unified diff of their canonical DSL, and per node whether it
    was added, removed, changed (with the fields that changed and a diff of its system prompt) or kept."""
    dsl_diff = list(difflib.unified_diff(_pretty(old.dsl), _pretty(new.dsl), fromfile=old.dsl_hash[:12],
                                         tofile=new.dsl_hash[:12], lineterm=""))
    before = {node["nodeId"]: node for node in old.dsl["nodes"]}
    after = {node["nodeId"]: node for node in new.dsl["nodes"]}
    nodes = {}
    for node_id in sorted(before.keys() | after.keys()):
        if node_id not in before:
            nodes[node_id] = {"change": "added"}
            continue
        if node_id not in after:
            nodes[node_id] = {"change": "removed"}
            continue
        a, b = before[node_id], after[node_id]
        fields = [field for field in NODE_FIELDS_COMPARED
                  if (sorted(a[field]) if isinstance(a[field], list) else a[field])
                  != (sorted(b[field]) if isinstance(b[field], list) else b[field])]
        prompt = list(difflib.unified_diff(a["systemPrompt"].splitlines(), b["systemPrompt"].splitlines(),
                                           fromfile=f"{node_id} (old)", tofile=f"{node_id} (new)", lineterm=""))
        if prompt:
            fields.append("systemPrompt")
        nodes[node_id] = {"change": "changed" if fields else "same", "fields": fields, "prompt_diff": prompt}
    if old.dsl.get("entryNodeId") != new.dsl.get("entryNodeId"):
        nodes.setdefault("__entry__", {"change": "changed", "fields": ["entryNodeId"], "prompt_diff": []})
    return {"from": old.dsl_hash, "to": new.dsl_hash, "same": old.dsl_hash == new.dsl_hash,
            "dsl_diff": dsl_diff, "nodes": nodes}


def version_lookup(ref: str) -> WorkflowVersion:
    """A version by its id or by a prefix of its hash (at least 6 characters), in any workspace (the
    operator's CLI); LookupError with the reason when none or several match."""
    queryset = WorkflowVersion.objects.select_related("workflow")
    if ref.isdigit() and ref.isascii():
        match = queryset.filter(pk=int(ref)).first()
        if match is not None:
            return match
    if len(ref) < 6:
        raise LookupError(f"no version {ref!r} (give an id, or at least 6 characters of a hash)")
    matches = list(queryset.filter(dsl_hash__startswith=ref.lower())[:2])
    if not matches:
        raise LookupError(f"no version {ref!r}")
    if len(matches) > 1:
        raise LookupError(f"{ref!r} matches several versions; give more of the hash")
    return matches[0]
