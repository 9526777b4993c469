"""The tools a node can call: the built-in code tools and the MCP tools of the workspace's servers.

A node's tools are resolved once, when the node starts (``node_tools``), into JSON bindings that
the durable checkpoint keeps, so a replay offers the model exactly the same tools. ``tool_run``
executes one call of a binding and returns its text; a tool that fails returns an error text the
model reads (an agent recovers from a bad argument as it would with a real tool), and the call is
recorded as failed.

Built-in code tools:
- ``knowledge_search(query, k=5)``: hybrid search of the workspace's knowledge base; the result is
  ``{"hits": [{"title", "content", "source_id", "chunk_id", "score"}]}``.
- ``skill_load(name)``: the markdown body of the workspace's active skill of that name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from workflows.dsl import BUILTIN_CODE_TOOLS

KNOWLEDGE_SEARCH_SPEC = {
    "name": "knowledge_search",
    "description": "Search the workspace's knowledge base (hybrid vector + full-text) and return the best passages "
                   "with their source titles.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "How many passages (default 5)."},
        },
        "required": ["query"],
    },
}
SKILL_LOAD_SPEC = {
    "name": "skill_load",
    "description": "Load the instructions of a skill from the workspace's skill library by name.",
    "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "The skill's name."}},
        "required": ["name"],
    },
}
BUILTIN_SPECS = {"knowledge_search": KNOWLEDGE_SEARCH_SPEC, "skill_load": SKILL_LOAD_SPEC}
assert set(BUILTIN_SPECS) == set(BUILTIN_CODE_TOOLS)

_FUNCTION_NAME = re.compile(r"[^a-zA-Z0-9_-]")


class ToolError(Exception):
    """A tool call that could not do its work; its message is what the model reads."""


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    error: bool = False
    content_type: str = "text/plain"


def function_name(server_slug: str, tool: str) -> str:
    """The name an MCP tool is offered under: `<server>__<tool>`, restricted to what chat APIs accept."""
    return _FUNCTION_NAME.sub("_", f"{server_slug}__{tool}")[:64]


def node_tools(*, workspace_id: int, code_tools: list[str], mcp_tools: list[str]) -> list[dict]:
    """The bindings of a node's tools (built-ins first, then MCP tools in the order the DSL names
    them). Raises ToolError naming a tool this installation lacks (the start of an invocation
    refuses such versions; this catches a server deleted since)."""
    bindings = []
    for name in code_tools:
        if name not in BUILTIN_SPECS:
            raise ToolError(f"code tool {name!r} is not available on this installation")
        spec = BUILTIN_SPECS[name]
        bindings.append({"kind": "code", "name": name, "tool": name, "description": spec["description"],
                         "parameters": spec["parameters"]})
    if mcp_tools:
        from workflows.mcp_services import mcp_available_tools

        available = mcp_available_tools(workspace=workspace_id)
        seen = set()
        for entry in mcp_tools:
            if entry not in available:
                raise ToolError(f"MCP tool {entry!r} is not registered in this workspace (run `manage.py mcp_sync`)")
            for tool in available[entry]:
                server = tool.server_version.server
                name = function_name(server.slug, tool.name)
                if name in seen:
                    continue
                seen.add(name)
                bindings.append({"kind": "mcp", "name": name, "tool": tool.name, "server_id": server.pk,
                                 "description": tool.description or tool.name,
                                 "parameters": tool.input_schema or {"type": "object", "properties": {}}})
    return bindings


def tool_run(binding: dict, arguments: dict, *, workspace_id: int, user_id: int | None) -> ToolOutcome:
    """Execute one tool call. Raises ToolError with the message the model should read."""
    if binding["kind"] == "code":
        if binding["tool"] == "knowledge_search":
            return _knowledge_search(workspace_id, arguments)
        if binding["tool"] == "skill_load":
            return _skill_load(workspace_id, arguments)
        raise ToolError(f"unknown code tool {binding['tool']!r}")
    return _mcp_call(binding, arguments, workspace_id=workspace_id, user_id=user_id)


def _knowledge_search(workspace_id: int, arguments: dict) -> ToolOutcome:
    from knowledge.search import SearchError
    from knowledge.selectors import knowledge_search

    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("knowledge_search needs a non-empty string `query`")
    k = arguments.get("k", 5)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 20:
        k = 5
    try:
        result = knowledge_search(workspace=workspace_id, query=query, k=k)
    except SearchError as exc:
        raise ToolError(f"knowledge_search: {exc}") from None
    hits = [{"title": hit.source_title, "content": hit.content, "source_id": hit.source_id,
             "chunk_id": hit.chunk_id, "score": round(hit.score, 6)} for hit in result.hits]
    return ToolOutcome(json.dumps({"hits": hits}, ensure_ascii=False), content_type="application/json")


def _skill_load(workspace_id: int, arguments: dict) -> ToolOutcome:
    from knowledge.models import Skill

    name = arguments.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolError("skill_load needs a string `name`")
    skill = Skill.objects.filter(workspace_id=workspace_id, name=name.strip(), active=True) \
        .only("name", "version", "content_md").first()
    if skill is None:
        names = list(Skill.objects.filter(workspace_id=workspace_id, active=True).order_by("name")
                     .values_list("name", flat=True)[:50])
        raise ToolError(f"no active skill named {name!r}; available: {', '.join(names) or 'none'}")
    return ToolOutcome(f"# Skill: {skill.name} (version {skill.version})\n\n{skill.content_md}",
                       content_type="text/markdown")


def _mcp_call(binding: dict, arguments: dict, *, workspace_id: int, user_id: int | None) -> ToolOutcome:
    from django.contrib.auth import get_user_model

    from workflows.mcp import McpError
    from workflows.mcp_services import mcp_tool_call
    from workflows.models import McpServer

    server = McpServer.objects.filter(pk=binding["server_id"], workspace_id=workspace_id).first()
    if server is None:
        raise ToolError(f"MCP server of tool {binding['name']!r} is no longer registered")
    user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
    try:
        result = mcp_tool_call(server=server, tool=binding["tool"], arguments=arguments, user=user)
    except McpError as exc:
        raise ToolError(f"{binding['name']}: {exc}") from None
    text = result.text
    if not text and result.structured is not None:
        text = json.dumps(result.structured, ensure_ascii=False)
    return ToolOutcome(text, error=result.is_error)
