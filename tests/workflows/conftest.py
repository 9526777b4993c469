import pytest


@pytest.fixture
def make_version(workspace):
    """A workflow version of `workspace` from a DSL document (a new workflow each call)."""
    from workflows.services import workflow_create, workflow_version_create

    counter = {"n": 0}

    def make(dsl: dict, *, name: str | None = None, workspace_=None):
        counter["n"] += 1
        workflow = workflow_create(workspace=workspace_ or workspace, name=name or f"workflow {counter['n']}")
        version, _ = workflow_version_create(workflow=workflow, dsl=dsl)
        return version

    return make


@pytest.fixture
def invoke():
    """Start an invocation of a version and drive its durable run in-process until it ends or
    waits for the outside world; returns the refreshed invocation."""
    from durable.inprocess import run_until_settled
    from workflows.services import invocation_start

    def run(version, input=None, **kwargs):
        invocation = invocation_start(version=version, input=input if input is not None else {"text": "hello"},
                                      **kwargs)
        run_until_settled(invocation.durable_run_id, max_wait=30)
        invocation.refresh_from_db()
        return invocation

    return run


@pytest.fixture
def settle():
    from durable.inprocess import run_until_settled

    def drive(invocation):
        run_until_settled(invocation.durable_run_id, max_wait=30)
        invocation.refresh_from_db()
        return invocation

    return drive


def node(node_id: str, *, prompt: str = "", handoffs=(), kind: str = "sequential", wait_for=(), tools=(),
         mcp=(), model: str = "gpt-4.1-mini", description: str = "", approval: bool = False, max_steps: int = 5,
         skills=()) -> dict:
    return {"nodeId": node_id, "description": description, "systemPrompt": prompt, "modelName": model,
            "codeTools": list(tools), "mcpTools": list(mcp), "handOffs": list(handoffs), "handOffType": kind,
            "waitFor": list(wait_for), "requiresApproval": approval, "maxSteps": max_steps, "skills": list(skills)}


def graph(entry: str, *nodes: dict) -> dict:
    return {"entryNodeId": entry, "nodes": list(nodes)}
