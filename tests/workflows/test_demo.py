"""The demo workflows of `make run`: seeded once, each with one invocation that completes."""

from io import StringIO

import pytest

from durable.inprocess import run_until_settled
from knowledge import demo as knowledge_demo
from workflows import demo
from workflows.models import NodeInvocation, NodeVersion, WorkflowInvocation

pytestmark = pytest.mark.django_db


def test_the_demo_workflows_are_seeded_once_and_their_invocations_complete():
    knowledge_demo.seed(stdout=StringIO())
    demo.seed(stdout=StringIO())
    demo.seed(stdout=StringIO())  # idempotent: no second version, no second invocation
    invocations = list(WorkflowInvocation.objects.select_related("workflow_version__workflow").order_by("pk"))
    assert len(invocations) == 2
    for invocation in invocations:
        run_until_settled(invocation.durable_run_id, max_wait=60)
        invocation.refresh_from_db()
        assert invocation.status == "completed", invocation.error
    fan, router = invocations
    fan_nodes = list(NodeInvocation.objects.filter(workflow_invocation=fan).order_by("seq").values_list("node_id",
                                                                                                          "tool_calls"))
    assert fan_nodes == [("scope", 1), ("engine_research", 1), ("cost_research", 1), ("writer", 0)]
    assert fan.output["text"].startswith("- ")  # the writer's bullet list
    router_nodes = list(NodeInvocation.objects.filter(workflow_invocation=router).order_by("seq")
                        .values_list("node_id", flat=True))
    assert router_nodes == ["triage", "engine_expert"]
    assert "Sources: [1]" in router.output["text"]


def test_the_demo_workflows_name_the_default_model(settings):
    settings.LLM_DEFAULT_MODEL = "ollama#llama3.2"
    knowledge_demo.seed(stdout=StringIO())
    demo.seed(stdout=StringIO())
    models = set(NodeVersion.objects.values_list("llm_model", flat=True))
    assert models == {"ollama#llama3.2"}
