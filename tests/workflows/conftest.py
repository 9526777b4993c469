"""Builders of workflow DSL documents for the tests (the workflow fixtures are in tests/conftest.py)."""

import pytest


def node(node_id: str, *, prompt: str = "", handoffs=(), kind: str = "sequential", wait_for=(), tools=(),
         mcp=(), model: str = "gpt-4.1-mini", description: str = "", approval: bool = False, max_steps: int = 5,
         skills=()) -> dict:
    return {"nodeId": node_id, "description": description, "systemPrompt": prompt, "modelName": model,
            "codeTools": list(tools), "mcpTools": list(mcp), "handOffs": list(handoffs), "handOffType": kind,
            "waitFor": list(wait_for), "requiresApproval": approval, "maxSteps": max_steps, "skills": list(skills)}


def graph(entry: str, *nodes: dict) -> dict:
    return {"entryNodeId": entry, "nodes": list(nodes)}


@pytest.fixture
def in_process(settings, tmp_path):
    """Runs driven in-process (run_until_settled), no worker dispatch; blobs in a temporary media root."""
    settings.DURABLE_DISPATCH_ENABLED = False
    settings.MEDIA_ROOT = str(tmp_path / "media")
