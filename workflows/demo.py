"""Demo workflows for `manage.py seed_demo`: two workflows over the demo knowledge base, and one
invocation of each, started as durable runs that the worker finishes in the background (seen in
the admin under Workflows > Invocations). Idempotent: the same DSL is the same version, and a
version that already has an invocation gets no other."""

from __future__ import annotations

from django.conf import settings

from workflows.models import Workflow, WorkflowInvocation
from workflows.services import invocation_start, workflow_create, workflow_version_create

# the demo's nodes name this model (LLM_DEFAULT_MODEL: answered by the offline model when no key is set)
MODEL = "{model}"

RESEARCH = {
    "entryNodeId": "scope",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "nodes": [
        {"nodeId": "scope", "description": "Frames the question for two researchers.", "modelName": MODEL,
         "systemPrompt": "Frame the question for the researchers. Call knowledge_search before answering. "
                         "Answer in one sentence.",
         "codeTools": ["knowledge_search"], "handOffs": ["engine_research", "cost_research"],
         "handOffType": "parallel"},
        {"nodeId": "engine_research", "description": "Finds how the durable engine behaves.", "modelName": MODEL,
         "systemPrompt": "You research the durable engine. Call knowledge_search before answering. "
                         "Quote the retrieved passage.",
         "codeTools": ["knowledge_search"], "handOffs": ["writer"]},
        {"nodeId": "cost_research", "description": "Finds what the work costs.", "modelName": MODEL,
         "systemPrompt": "You research costs and tokens. Call knowledge_search before answering. Cite your sources.",
         "codeTools": ["knowledge_search"], "handOffs": ["writer"]},
        {"nodeId": "writer", "description": "Writes the brief from both findings.", "modelName": MODEL,
         "systemPrompt": "Write a short brief from the researchers' findings. Answer as a bullet list.",
         "waitFor": ["engine_research", "cost_research"], "handOffs": ["end"]},
    ],
}

SUPPORT = {
    "entryNodeId": "triage",
    "nodes": [
        {"nodeId": "triage", "description": "Reads the question and routes it.", "modelName": MODEL,
         "systemPrompt": "Classify the question in one sentence. Answer in one sentence.",
         "handOffs": ["engine_expert", "knowledge_expert", "end"], "handOffType": "conditional"},
        {"nodeId": "engine_expert",
         "description": "durable engine runs, steps, checkpoints, crashes, workers, retries, signals and timers",
         "modelName": MODEL, "codeTools": ["knowledge_search"],
         "systemPrompt": "You answer questions about the durable engine. Call knowledge_search before answering. "
                         "Cite your sources.",
         "handOffs": ["end"]},
        {"nodeId": "knowledge_expert",
         "description": "knowledge base documents, ingestion, chunks, embeddings and search",
         "modelName": MODEL, "codeTools": ["knowledge_search"],
         "systemPrompt": "You answer questions about the knowledge base. Call knowledge_search before answering. "
                         "Cite your sources.",
         "handOffs": ["end"]},
    ],
}

DEMOS = [
    ("Research brief (parallel fan)", "Two researchers search the knowledge base at once; a writer joins them.",
     RESEARCH, {"text": "What happens to a durable run when a worker crashes, and what does a model call cost?"}),
    ("Support router (conditional)", "A triage node routes each question to the right expert.",
     SUPPORT, {"text": "What happens to the checkpoints of a run when a worker crashes?"}),
]


def with_model(dsl: dict, model: str) -> dict:
    """`dsl` with the model placeholder of its nodes replaced by `model`."""
    return {**dsl, "nodes": [{**node, "modelName": model} if node.get("modelName") == MODEL else node
                             for node in dsl["nodes"]]}


def seed(stdout) -> None:
    from workspaces.demo import demo_workspace

    workspace = demo_workspace()
    for name, description, template, example in DEMOS:
        dsl = with_model(template, settings.LLM_DEFAULT_MODEL)
        workflow = Workflow.objects.filter(workspace=workspace, name=name).first() or workflow_create(
            workspace=workspace, name=name, description=description)
        version, created = workflow_version_create(workflow=workflow, dsl=dsl, commit_message="demo seed")
        started = ""
        if not WorkflowInvocation.objects.filter(workflow_version=version).exists():
            invocation = invocation_start(version=version, input=example)
            started = f"; invocation {invocation.pk} started (the worker runs it)"
        stdout.write(f"workflows: {name!r} version {version.pk} {'created' if created else 'unchanged'}{started}")
