"""Workflows and their immutable, content-addressed versions.

A `WorkflowVersion` is written once: its DSL and everything derived from it (the hash, the nodes)
never change; only its status (candidate / active / archived) and its scores move. The same DSL in
the same workflow is the same version (unique on the canonical hash), so an identical genome is
never stored or evaluated twice.

The MCP registry's models live in `workflows/mcp_models.py`, imported here so the app registers them.
"""

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Func, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left
from django.utils import timezone

from durable.owners import RunOwner
from knowledge.models import SEARCH_CONFIG
from workflows.mcp_models import McpServer, McpServerVersion, McpTool, UserServerConfig  # noqa: F401
from workspaces.models import Workspace


class Workflow(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="workflows")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="%(app_label)s_%(class)s_unique_name",
                                    violation_error_message="A workflow with this name exists in the workspace."),
        ]

    def __str__(self) -> str:
        return self.name


class WorkflowVersion(models.Model):
    class Status(models.TextChoices):
        CANDIDATE = "candidate", "Candidate"
        ACTIVE = "active", "Active"
        ARCHIVED = "archived", "Archived"

    class Operation(models.TextChoices):
        INIT = "init", "Initial"
        MUTATION = "mutation", "Mutation"
        CROSSOVER = "crossover", "Crossover"
        IMMIGRANT = "immigrant", "Immigrant"
        MANUAL = "manual", "Manual edit"

    # fields a saved version may still change; everything else is its immutable content
    MUTABLE_FIELDS = frozenset({"status", "avg_score", "pass_rate", "updated_at"})

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="versions")
    dsl = models.JSONField()
    dsl_hash = models.CharField(max_length=64)
    operation = models.CharField(max_length=10, choices=Operation.choices, default=Operation.INIT)
    parent1 = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    parent2 = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # the evolution generation that bred it (a number: `evolution` sits above this app and links back)
    generation = models.PositiveIntegerField(null=True, blank=True)
    commit_message = models.TextField(blank=True, default="")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.CANDIDATE)
    input_schema = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(default=dict, blank=True)
    # tools the DSL names that this installation lacked when the version was written (`node.tool`)
    unresolved_tools = models.JSONField(default=list, blank=True)
    avg_score = models.FloatField(null=True, blank=True)
    pass_rate = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "dsl_hash"], name="%(app_label)s_%(class)s_unique_dsl",
                                    violation_error_message="This workflow already has a version with this DSL."),
            models.UniqueConstraint(fields=["workflow"], condition=Q(status="active"),
                                    name="%(app_label)s_%(class)s_one_active_version",
                                    violation_error_message="A workflow has at most one active version."),
        ]
        indexes = [
            # genealogy walks: a version's children by either parent
            models.Index(fields=["parent1"], name="workflows_version_parent1_idx"),
            models.Index(fields=["parent2"], name="workflows_version_parent2_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} @ {self.dsl_hash[:12]}"

    def save(self, *args, **kwargs):
        """A version is immutable once written: an update may only touch its status and scores."""
        if self.pk is not None and not self._state.adding:
            fields = kwargs.get("update_fields")
            if fields is None or not set(fields) <= self.MUTABLE_FIELDS:
                raise ValueError("A workflow version is immutable: only its status and scores can change "
                                 "(save with update_fields).")
        super().save(*args, **kwargs)


class VersionActivation(models.Model):
    """One activation of a workflow version: the workflow's activation history, append-only, written
    with the status change it records (``workflows.services``). The latest row of a workflow is the
    activation in effect, its version the active one; `parent` is the activation in effect before it.
    A rollback re-activates the version of the current row's parent and takes that parent's own parent,
    so rollbacks walk back one activation at a time, and nothing written later on a version (its
    scores) moves the history."""

    class Kind(models.TextChoices):
        ACTIVATE = "activate", "Activation"
        ROLLBACK = "rollback", "Rollback"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="activations")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="activations")
    # the version it replaced (none for a workflow's first activation)
    previous_version = models.ForeignKey(WorkflowVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.ACTIVATE)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # the activation in effect (a workflow's latest row) and its history, newest first
            models.Index(fields=["workflow", "-id"], name="workflows_activation_wf_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.workflow_version_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise ValueError("An activation is history: it is never rewritten.")
        super().save(*args, **kwargs)


class NodeVersion(models.Model):
    """A node of a version as the DSL defines it, derived when the version is written."""

    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="nodes")
    node_id = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    llm_model = models.CharField(max_length=200)
    tools = models.JSONField(default=list, blank=True)  # {"kind": "code"|"mcp", "name": ...}
    handoffs = models.JSONField(default=list, blank=True)
    handoff_type = models.CharField(max_length=20, default="sequential")
    waiting_for = models.JSONField(default=list, blank=True)
    skills = models.JSONField(default=list, blank=True)
    max_steps = models.PositiveSmallIntegerField(default=5)
    requires_approval = models.BooleanField(default=False)
    memory = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow_version", "node_id"],
                                    name="%(app_label)s_%(class)s_unique_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} ({self.llm_model})"


# Full-text search over traces (the invocation list's search box): GIN indexes on expressions, not stored
# vectors. Postgres computes an expression index's entry inside the statement that writes the row, so it is
# right whatever runs at the same time, costs the writer no statement of its own (a message is one multi-row
# INSERT of the runner, never updated afterwards), and has nothing to backfill or keep in step; a vector stored
# on the invocation would be rewritten by every message of every parallel branch, under that row's lock. A query
# is served by an index only when it builds the same expression: the two functions below are the one home of
# each. Only the first TRACE_SEARCH_CHARS characters of a text are indexed, so no message is too long to
# write (a tsvector holds at most 1 MB).
TRACE_SEARCH_CHARS = 100_000


def message_search_vector() -> SearchVector:
    """The words of a message: a conversation's content (user, assistant, tool result) or a hand-off's text."""
    return SearchVector(Left(KT("payload__content"), TRACE_SEARCH_CHARS), Left(KT("payload__text"), TRACE_SEARCH_CHARS),
                        config=SEARCH_CONFIG)


class JsonWords(Func):
    """The words of a JSON document's string values (its keys left out), none for a missing or oversized one."""

    function = "to_tsvector"
    template = (f"%(function)s('{SEARCH_CONFIG}'::regconfig, CASE WHEN octet_length((%(expressions)s)::text) <= "
                f"{TRACE_SEARCH_CHARS} THEN %(expressions)s ELSE 'null'::jsonb END)")
    output_field = SearchVectorField()


def invocation_search_vector():
    """The words of an invocation's input and output."""
    from django.db.models.expressions import CombinedExpression

    return CombinedExpression(JsonWords("input"), "||", JsonWords("output"), output_field=SearchVectorField())


class InvocationStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class WorkflowInvocation(RunOwner):
    """One run of a workflow version on an input: a durable run (`durable_run`) drives it; this row
    is what an operator reads (status, output, totals), updated by the runner's checkpointed steps."""

    Status = InvocationStatus
    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.WAITING)

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="workflow_invocations")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="invocations")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    input = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    # limits this invocation ran under (docs/limits.md; their defaults from settings)
    node_budget = models.PositiveIntegerField(default=14)
    usd_budget = models.DecimalField(max_digits=18, decimal_places=10)
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    cache_hits = models.PositiveIntegerField(default=0)
    node_count = models.PositiveIntegerField(default=0)
    fitness_score = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="workflows_inv_ws_created_idx"),
            models.Index(fields=["workflow_version", "-created_at"], name="workflows_inv_version_idx"),
            # the operator console's window over every workspace (a superuser's home: counts, spend, failures)
            models.Index(fields=["created_at"], name="workflows_inv_created_idx"),
            # the reconcile's scan of active invocations (ACTIVE), oldest first (durable.owners.reconcile)
            models.Index(fields=["id"], name="workflows_inv_active_idx",
                         condition=Q(status__in=["queued", "running", "waiting"])),
            # the invocation list's search for words of its input or output (invocation_search_vector)
            GinIndex(invocation_search_vector(), name="workflows_inv_search_idx"),
        ]

    def __str__(self) -> str:
        return f"invocation {self.pk}"


class NodeInvocation(models.Model):
    """One execution of a node inside an invocation (`seq` orders them; a node in a cycle runs
    several times). Inserted running when the node starts, completed or failed when it ends."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        WAITING = "waiting", "Waiting for approval"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        REJECTED = "rejected", "Rejected"

    workflow_invocation = models.ForeignKey(WorkflowInvocation, on_delete=models.CASCADE,
                                            related_name="node_invocations")
    seq = models.PositiveIntegerField()
    node_id = models.CharField(max_length=200)
    node_version = models.ForeignKey(NodeVersion, null=True, on_delete=models.SET_NULL, related_name="invocations")
    attempt = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    input = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    summary = models.TextField(blank=True, default="")
    large_summary = models.TextField(blank=True, default="")
    next_nodes = models.JSONField(default=list, blank=True)
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    cache_hits = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    model = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # requiresApproval: {"decision": "approve"|"reject", "comment": ..., "by": user id}
    approval = models.JSONField(null=True, blank=True)
    # a model call of the node waiting on a durable timer (a provider limit, a 429): why, and until when
    throttled_until = models.DateTimeField(null=True, blank=True)
    throttle_reason = models.CharField(max_length=500, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow_invocation", "seq"], name="%(app_label)s_%(class)s_unique_seq"),
        ]
        ordering = ["workflow_invocation", "seq"]
        indexes = [
            # the operator console's spend by model over its window
            models.Index(fields=["started_at"], name="workflows_node_started_idx"),
            # the operator console's approvals waiting, oldest first
            models.Index(fields=["started_at"], name="workflows_node_waiting_idx", condition=Q(status="waiting")),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} #{self.seq}"

    @property
    def duration_ms(self) -> float | None:
        if self.started_at and self.ended_at:
            return (self.ended_at - self.started_at).total_seconds() * 1000
        return None

    @property
    def throttled(self) -> bool:
        """A model call of this running node waits for a provider limit or a rate limit's end (a wait that
        is over, its call asked again or failed since, is not a throttle)."""
        return (self.status == self.Status.RUNNING and self.throttled_until is not None
                and self.throttled_until > timezone.now())


class Message(models.Model):
    """What an invocation said, in order (`seq` per invocation): hand-offs between nodes (roles from
    the seed system: delegation, result, ...) and each node's conversation with its model
    (system, user, assistant, tool)."""

    class Role(models.TextChoices):
        DELEGATION = "delegation", "Delegation"
        RESULT = "result", "Result"
        FEEDBACK = "feedback", "Feedback"
        DATA = "data", "Data"
        ERROR = "error", "Error"
        CONTROL = "control", "Control"
        AGGREGATED = "aggregated", "Aggregated"
        SEQUENTIAL = "sequential", "Sequential"
        SYSTEM = "system", "System prompt"
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        TOOL = "tool", "Tool result"

    workflow_invocation = models.ForeignKey(WorkflowInvocation, on_delete=models.CASCADE, related_name="messages")
    node_invocation = models.ForeignKey(NodeInvocation, null=True, blank=True, on_delete=models.CASCADE,
                                        related_name="messages")
    seq = models.PositiveIntegerField()
    from_node_id = models.CharField(max_length=200, blank=True, default="")
    to_node_id = models.CharField(max_length=200, blank=True, default="")
    role = models.CharField(max_length=12, choices=Role.choices)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow_invocation", "seq"], name="%(app_label)s_%(class)s_unique_seq"),
        ]
        ordering = ["workflow_invocation", "seq"]
        indexes = [
            # the invocation list's search for words said in an invocation (message_search_vector)
            GinIndex(message_search_vector(), name="workflows_msg_search_idx"),
            # the invocation list's tool filter: the invocations that called a tool (tool results only)
            models.Index(KT("payload__name"), "workflow_invocation", name="workflows_msg_tool_idx",
                         condition=Q(role="tool")),
        ]

    def __str__(self) -> str:
        return f"{self.seq} {self.role} {self.from_node_id}->{self.to_node_id}"


def context_entry_path(entry: "ContextEntry", filename: str) -> str:
    return f"context/{entry.workflow_invocation.workspace_id}/{entry.workflow_invocation_id}/{filename}"


class ContextEntry(models.Model):
    """A large value an invocation produced (a tool output too big for a prompt): the blob in Django
    storage, the summary the nodes see and the metadata in the row."""

    class Scope(models.TextChoices):
        WORKFLOW = "workflow", "Workflow"
        NODE = "node", "Node"

    workflow_invocation = models.ForeignKey(WorkflowInvocation, on_delete=models.CASCADE,
                                            related_name="context_entries")
    node_invocation = models.ForeignKey(NodeInvocation, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="context_entries")
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.WORKFLOW)
    key = models.CharField(max_length=200)
    data = models.FileField(upload_to=context_entry_path, max_length=400)
    summary = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    size = models.PositiveBigIntegerField(default=0)
    content_type = models.CharField(max_length=100, default="text/plain")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow_invocation", "scope", "key"],
                                    name="%(app_label)s_%(class)s_unique_key"),
        ]
        verbose_name_plural = "context entries"

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"


class LlmCall(models.Model):
    """The cache of identical temperature-0 chat calls, per workspace: the key hashes the model,
    messages, tools and parameters (`llm.chat.ChatRequest.cache_key`). A durable step answers a
    replay; this answers the same call in another run, so re-evaluating a node never pays twice."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    provider = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    response = models.JSONField()
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    hits = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_hit_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="%(app_label)s_%(class)s_unique_key"),
        ]
        verbose_name = "LLM call"

    def __str__(self) -> str:
        return f"{self.model} {self.key[:12]}"
