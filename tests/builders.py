"""Builders of workflow DSL documents for the tests: `graph(entry, *nodes)` of `node(...)` dicts (the workflow
fixtures that turn them into versions and invocations are in tests/conftest.py)."""


def node(node_id: str, *, prompt: str = "", handoffs=(), kind: str = "sequential", wait_for=(), tools=(),
         mcp=(), model: str = "gpt-4.1-mini", description: str = "", approval: bool = False, max_steps: int = 5,
         skills=()) -> dict:
    return {"nodeId": node_id, "description": description, "systemPrompt": prompt, "modelName": model,
            "codeTools": list(tools), "mcpTools": list(mcp), "handOffs": list(handoffs), "handOffType": kind,
            "waitFor": list(wait_for), "requiresApproval": approval, "maxSteps": max_steps, "skills": list(skills)}


def graph(entry: str, *nodes: dict) -> dict:
    return {"entryNodeId": entry, "nodes": list(nodes)}
