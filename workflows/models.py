"""Workflows and their immutable, content-addressed versions.

A `WorkflowVersion` is written once: its DSL and everything derived from it (the hash, the nodes)
never change; only its status (candidate / active / archived) and its scores move. The same DSL in
the same workflow is the same version (unique on the canonical hash), so an identical genome is
never stored or evaluated twice.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

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
