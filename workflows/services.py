"""Writes on workflows and their versions."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from workflows import dsl as dsl_module
from workflows.models import NodeVersion, Workflow, WorkflowVersion
from workspaces.models import Workspace


def workflow_create(*, workspace: Workspace, name: str, description: str = "", owner=None) -> Workflow:
    """Create a workflow in a workspace (names are unique per workspace)."""
    return Workflow.objects.create(workspace=workspace, name=name, description=description, owner=owner)


def workflow_version_create(*, workflow: Workflow, dsl, operation: str = WorkflowVersion.Operation.INIT,
                            parents: tuple[WorkflowVersion, ...] = (), commit_message: str = "",
                            created_by=None) -> tuple[WorkflowVersion, bool]:
    """Write a version of `workflow` from a DSL document (validated; DslError names the node and field).

    Content-addressed: the same DSL (by its canonical hash) in the same workflow returns the existing
    version and False. Its nodes are derived in the same transaction. Parents must be versions of the
    same workflow. Returns (version, created)."""
    parsed = dsl_module.parse(dsl)
    digest = dsl_module.dsl_hash(parsed)
    if len(parents) > 2:
        raise dsl_module.DslError({"parents": ["a version has at most two parents"]})
    for parent in parents:
        if parent.workflow_id != workflow.pk:
            raise dsl_module.DslError({"parents": [f"version {parent.pk} belongs to another workflow"]})
    existing = WorkflowVersion.objects.filter(workflow=workflow, dsl_hash=digest).first()
    if existing is not None:
        return existing, False
    parent1, parent2 = [*parents, None, None][:2]
    try:
        with transaction.atomic():
            version = WorkflowVersion.objects.create(
                workflow=workflow, dsl=parsed, dsl_hash=digest, operation=operation, parent1=parent1,
                parent2=parent2, commit_message=commit_message, created_by=created_by,
                input_schema=parsed.get("inputSchema") or {}, output_schema=parsed.get("outputSchema") or {},
                unresolved_tools=dsl_module.unresolved_tools(parsed),
            )
            NodeVersion.objects.bulk_create(_node_versions(version, parsed))
    except IntegrityError:
        # written at the same moment by another caller: that one is the version
        existing = WorkflowVersion.objects.filter(workflow=workflow, dsl_hash=digest).first()
        if existing is None:
            raise
        return existing, False
    return version, True


def _node_versions(version: WorkflowVersion, parsed: dict) -> list[NodeVersion]:
    return [
        NodeVersion(
            workflow_version=version, node_id=node["nodeId"], description=node["description"],
            system_prompt=node["systemPrompt"], llm_model=node["gatewayModelId"],
            tools=[{"kind": "code", "name": name} for name in node["codeTools"]]
            + [{"kind": "mcp", "name": name} for name in node["mcpTools"]],
            handoffs=node["handOffs"], handoff_type=node["handOffType"], waiting_for=node["waitFor"],
            skills=node["skills"], max_steps=node["maxSteps"], requires_approval=node["requiresApproval"],
            memory=node["memory"],
        )
        for node in parsed["nodes"]
    ]


def workflow_version_activate(*, version: WorkflowVersion) -> WorkflowVersion:
    """Make `version` its workflow's active version, archiving the one active before. Concurrent
    activations of one workflow are serialised on the workflow's row; the partial unique constraint
    guarantees at most one active version whatever happens."""
    with transaction.atomic():
        Workflow.objects.select_for_update().get(pk=version.workflow_id)
        WorkflowVersion.objects.filter(workflow_id=version.workflow_id, status=WorkflowVersion.Status.ACTIVE) \
            .exclude(pk=version.pk).update(status=WorkflowVersion.Status.ARCHIVED)
        WorkflowVersion.objects.filter(pk=version.pk).update(status=WorkflowVersion.Status.ACTIVE)
    version.refresh_from_db(fields=["status"])
    return version
