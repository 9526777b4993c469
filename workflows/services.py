"""Writes on workflows and their versions."""

from __future__ import annotations

import json
from typing import NamedTuple

import jsonschema
from django.db import IntegrityError, transaction
from django.utils import timezone

from config import user_regex
from config.errors import Conflict, Invalid
from workflows import dsl as dsl_module
from workflows import selectors
from workflows.models import NodeVersion, VersionActivation, Workflow, WorkflowVersion
from workspaces.models import Workspace


def workflow_create(*, workspace: Workspace, name: str, description: str = "", owner=None) -> Workflow:
    """Create a workflow in a workspace (names are unique per workspace)."""
    return Workflow.objects.create(workspace=workspace, name=name, description=description, owner=owner)


def workflow_version_create(*, workflow: Workflow, dsl, operation: str = WorkflowVersion.Operation.INIT,
                            parents: tuple[WorkflowVersion, ...] = (), commit_message: str = "",
                            created_by=None, generation: int | None = None) -> tuple[WorkflowVersion, bool]:
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
                parent2=parent2, commit_message=commit_message, created_by=created_by, generation=generation,
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


def workflow_version_activate(*, version: WorkflowVersion, user=None) -> WorkflowVersion:
    """Make `version` its workflow's active version, archiving the one active before, and record the
    activation in the workflow's history (``VersionActivation``) in the same transaction; the version
    already active changes and records nothing. Concurrent activations of one workflow are serialised
    on the workflow's row; the partial unique constraint guarantees at most one active version
    whatever happens."""
    with transaction.atomic():
        Workflow.objects.select_for_update().get(pk=version.workflow_id)
        current = selectors.activation_current(workflow_id=version.workflow_id)
        _switch(version=version, kind=VersionActivation.Kind.ACTIVATE, parent=current, user=user)
    version.refresh_from_db(fields=["status"])
    return version


def workflow_version_rollback(*, workflow: Workflow, user=None) -> VersionActivation | None:
    """Re-activate the version that was active before the current one, by the activation history (a
    second rollback goes back one more activation). Returns the rollback's activation, or None (and
    nothing changes) when there is no earlier activation. Serialised with activations on the
    workflow's row."""
    with transaction.atomic():
        Workflow.objects.select_for_update().get(pk=workflow.pk)
        current = selectors.activation_current(workflow_id=workflow.pk)
        if current is None or current.parent is None:
            return None
        target = current.parent
        return _switch(version=target.workflow_version, kind=VersionActivation.Kind.ROLLBACK, parent=target.parent,
                       user=user)


def _switch(*, version: WorkflowVersion, kind: str, parent: VersionActivation | None,
            user) -> VersionActivation | None:
    """The status change and its history row; the caller holds the workflow's row lock."""
    active = WorkflowVersion.objects.filter(workflow_id=version.workflow_id, status=WorkflowVersion.Status.ACTIVE) \
        .values_list("pk", flat=True).first()
    if active == version.pk:
        return None
    changed = timezone.now()
    WorkflowVersion.objects.filter(pk=active).update(status=WorkflowVersion.Status.ARCHIVED, updated_at=changed)
    WorkflowVersion.objects.filter(pk=version.pk).update(status=WorkflowVersion.Status.ACTIVE, updated_at=changed)
    return VersionActivation.objects.create(
        workflow_id=version.workflow_id, workflow_version=version, previous_version_id=active, parent=parent,
        kind=kind, created_by=user if getattr(user, "pk", None) else None, created_at=changed)


# --------------------------------------------------------------------------------------- invocations

class InvocationRefused(Invalid):
    """A version that cannot run here (tools or models this installation lacks), or a bad request;
    `errors` maps a field to its messages, naming each node."""


class InvalidInvocationState(Conflict, ValueError):
    """The invocation is not in a state that allows the operation (approve a node that is not waiting...)."""


def version_problems(version: WorkflowVersion) -> dict[str, list[str]]:
    """What stops `version` from running on this installation now: each tool it names that no
    built-in or registered MCP server provides, each model no configured provider serves, and each
    model with no known price (every run has a USD budget, which such a model would never count against)."""
    from llm.chat import model_problem
    from llm.prices import price_problem

    available = {}
    if any(node["mcpTools"] for node in version.dsl["nodes"]):
        # imported here alone: the MCP client's import takes seconds, which a version naming no MCP tool skips
        from workflows.mcp_services import mcp_available_tools

        available = mcp_available_tools(workspace=version.workflow.workspace_id)
    problems: dict[str, list[str]] = {}
    missing = dsl_module.unresolved_tools(version.dsl, mcp_tools=available.keys())
    if missing:
        problems["tools"] = [f"{name} is not available (a built-in code tool or a synced MCP server)"
                             for name in missing]
    models = []
    for node in version.dsl["nodes"]:
        # every run has a USD budget: a model with no price would never count against it
        problem = model_problem(node["gatewayModelId"]) or price_problem(node["gatewayModelId"])
        if problem:
            models.append(f"{node['nodeId']}.{node['gatewayModelId']}: {problem}")
    if models:
        problems["models"] = models
    return problems


INPUT_PATTERN_TIMEOUT_SECONDS = 2.0  # an input schema's patterns (user regexes), all of one check, in the web process


class InputCheck(NamedTuple):
    """What a version's input schema says of an input: each error with its path into the input, or why the
    input could not be checked (`refused`; `timed_out` when a pattern ran out of time). An unusable schema
    judges nothing (the DSL's own checks own it)."""

    errors: list[tuple[list, str]]
    refused: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors and not self.refused

    def messages(self) -> list[str]:
        """One line per problem, each error led by where it is ("n", "items/0", "(the input)")."""
        where = [f"{'/'.join(map(str, path)) or '(the input)'}: {message}" for path, message in self.errors]
        return [self.refused] if self.refused else where


def input_check(schema, value) -> InputCheck:
    """`value` checked against the input schema `schema` (JSON Schema), its patterns time-limited."""
    if not isinstance(schema, dict) or not schema:
        return InputCheck([])
    try:
        validator = user_regex.schema_validator(schema)
    except (jsonschema.SchemaError, RecursionError):
        return InputCheck([])
    try:
        errors = user_regex.schema_errors(validator, value, timeout=INPUT_PATTERN_TIMEOUT_SECONDS)
    except user_regex.PatternTimeout as exc:
        return InputCheck([], f"Not checked: a pattern of the input schema {exc}.", timed_out=True)
    except jsonschema.SchemaError as exc:
        return InputCheck([], f"Not checked: {exc.message}.")
    except RecursionError:
        return InputCheck([], "Not checked: the input schema refers to itself without end ($ref).")
    ordered = sorted(errors, key=lambda error: list(map(str, error.absolute_path)))
    return InputCheck([(list(error.absolute_path), error.message) for error in ordered])


def invocation_start(*, version: WorkflowVersion, input=None, user=None, node_budget: int | None = None,
                     usd_budget=None):
    """Start an invocation of `version` on `input` as a durable run; returns the WorkflowInvocation
    (queued; the worker takes it from there). A version with missing tools or models, an input its
    inputSchema refuses, or a bad budget is refused with InvocationRefused (each on its field) before anything
    is written or paid."""
    from decimal import Decimal, InvalidOperation

    from durable.services import run_start
    from workflows.conf import workflow_settings
    from workflows.durable_workflows import INVOKE_WORKFLOW
    from workflows.models import WorkflowInvocation

    problems = version_problems(version)
    conf = workflow_settings()
    errors = dict(problems)
    if node_budget is None:
        node_budget = conf.node_budget
    elif not isinstance(node_budget, int) or isinstance(node_budget, bool) or not 1 <= node_budget <= 1000:
        errors["node_budget"] = ["must be a whole number from 1 to 1000"]
    try:
        usd = conf.usd_budget if usd_budget is None else Decimal(str(usd_budget))
        if not usd.is_finite() or usd <= 0 or usd > 1_000_000:
            raise InvalidOperation
    except (InvalidOperation, ValueError):
        errors["usd_budget"] = ["must be a positive amount of USD up to 1,000,000"]
        usd = conf.usd_budget
    if input is None:
        input = {}
    try:
        json.dumps(input)
    except (TypeError, ValueError):
        errors["input"] = ["must be JSON"]
    else:
        check = input_check(version.input_schema, input)
        if not check.ok:
            errors["input"] = check.messages()
    if errors:
        raise InvocationRefused(errors)
    workspace = version.workflow.workspace
    with transaction.atomic():
        invocation = WorkflowInvocation.objects.create(
            workspace=workspace, workflow_version=version, input=input, node_budget=node_budget, usd_budget=usd,
            created_by=user if getattr(user, "pk", None) else None)
        run = run_start(workflow=INVOKE_WORKFLOW, input={"invocation_id": invocation.pk}, run_id=f"wfi-{invocation.pk}",
                        namespace=workspace.namespace, tags=["workflow", f"workflow:{version.workflow_id}"])
        invocation.durable_run_id = run.pk
        invocation.save(update_fields=["durable_run", "updated_at"])
    return invocation


DECISIONS = ("approve", "reject", "revise")


def invocation_decide(*, invocation, decision: str, comment: str = "", user=None, node_seq: int | None = None):
    """Approve, reject or revise the answer of the node of `invocation` that waits for approval (the one
    numbered `node_seq`, when given). "revise" needs a comment: the model reads it and answers again, and
    the node waits for a decision on its new answer. Each answer waiting takes one decision: a second is
    refused with InvalidInvocationState. Returns the node invocation."""
    from django.utils import timezone

    from durable.errors import InvalidRunState, RunNotFound
    from durable.services import signal_send
    from workflows.durable_workflows import REVISIONS_PER_NODE
    from workflows.models import NodeInvocation

    if decision not in DECISIONS:
        raise InvocationRefused({"decision": ["must be approve, reject or revise"]})
    if not isinstance(comment, str) or len(comment) > 10_000:
        raise InvocationRefused({"comment": ["must be text of at most 10,000 characters"]})
    if decision == "revise" and not comment.strip():
        raise InvocationRefused({"comment": ["a revision needs a comment: what the model should change"]})
    with transaction.atomic():
        nodes = NodeInvocation.objects.select_for_update().filter(
            workflow_invocation=invocation, status=NodeInvocation.Status.WAITING).order_by("seq")
        if node_seq is not None:
            nodes = nodes.filter(seq=node_seq)
        node = nodes.first()
        if node is None or not (node.approval or {}).get("pending"):
            raise InvalidInvocationState("no node of this invocation is waiting for approval"
                                         + (f" at seq {node_seq}" if node_seq is not None else ""))
        if (node.approval or {}).get("sent"):
            raise InvalidInvocationState(f"node {node.node_id} already received a decision")
        if decision == "revise" and node.approval.get("revision", 0) >= REVISIONS_PER_NODE:
            raise InvocationRefused({"decision": [f"node {node.node_id} was revised {REVISIONS_PER_NODE} times, "
                                                  "the most a node takes: approve or reject its answer"]})
        payload = {"decision": decision, "comment": comment, "by": getattr(user, "pk", None),
                   "by_name": getattr(user, "username", "") or "", "at": timezone.now().isoformat()}
        try:
            signal_send(run_id=node.approval["run_id"], name=node.approval["signal"], payload=payload)
        except (RunNotFound, InvalidRunState) as exc:
            raise InvalidInvocationState(f"the invocation's run cannot take a decision: {exc}") from None
        node.approval = {**node.approval, "sent": payload}
        node.save(update_fields=["approval"])
    return node


def invocation_cancel(*, invocation, reason: str = "cancelled by an operator") -> bool:
    """Cancel a running invocation (its durable run and branches). False when it had already ended."""
    from durable import owners
    from durable.services import run_cancel
    from workflows.models import WorkflowInvocation

    if invocation.status in WorkflowInvocation.TERMINAL:
        return False
    cancelled = run_cancel(run_id=invocation.durable_run_id, reason=reason) if invocation.durable_run_id else True
    if cancelled:
        owners.fail(WorkflowInvocation, invocation.pk, reason, status=WorkflowInvocation.Status.CANCELLED)
    invocation.refresh_from_db()
    return cancelled
