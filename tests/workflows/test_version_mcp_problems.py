"""Review of 106537c: version_problems imports the MCP client only for a version naming an MCP tool; a
version that names one, in any node and as a server or a server's tool, still has it checked."""

import pytest

from tests.builders import graph, node
from workflows.services import version_problems

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["nosuch", "nosuch/search"], ids=["a-server", "a-servers-tool"])
def test_an_mcp_tool_named_only_by_a_later_node_is_reported_missing(make_version, name):
    version = make_version(graph("a", node("a", handoffs=["b"], tools=["knowledge_search"], skills=["triage"]),
                                 node("b", mcp=[name])))
    assert version_problems(version)["tools"] == [
        f"b.{name} is not available (a built-in code tool or a synced MCP server)"]


def test_a_version_naming_no_mcp_tool_reports_an_unknown_code_tool_without_the_mcp_client(make_version,
                                                                                           monkeypatch):
    import sys

    version = make_version(graph("a", node("a", tools=["no_such_tool"], skills=["triage"])))
    monkeypatch.setitem(sys.modules, "workflows.mcp_services", None)  # importing it now raises ImportError
    assert version_problems(version)["tools"] == [
        "a.no_such_tool is not available (a built-in code tool or a synced MCP server)"]
