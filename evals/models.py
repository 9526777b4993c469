"""Golden sets, their items, eval runs and their (append-only) results, and promotions.

An eval run scores one workflow version on one golden set: each item is a workflow invocation,
graded by the set's graders. A result is written once and never changed; the same version on the
same item contents with the same graders reuses an earlier result (`reuse_key`), so a genome is
never paid for twice. A promotion records the evidence an activation was decided on.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from durable.owners import RunOwner
from workflows.models import Workflow, WorkflowInvocation, WorkflowVersion
from workspaces.models import Workspace


def default_graders() -> list[dict]:
    return [{"kind": "llm_judge", "weight": 1.0}]


class GoldenSet(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="golden_sets")
    workflow = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.SET_NULL, related_name="golden_sets",
                                 help_text="The workflow this set evaluates (its versions are compared on it).")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    pass_threshold = models.FloatField(default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
                                       help_text="An item passes when its score is at least this.")
    graders = models.JSONField(default=default_graders, help_text="Graders and weights (evals/graders.py).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="%(app_label)s_%(class)s_unique_name",
                                    violation_error_message="A golden set with this name exists in the workspace."),
        ]

    def __str__(self) -> str:
        return self.name


def item_content_hash(input, expected_output: str, scoring_criteria: str, rubric) -> str:
    text = json.dumps([input, expected_output, scoring_criteria, rubric], sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class GoldenItemSplit(models.TextChoices):
    """Where an item serves (evals/splits.py): evolution searches on train, selects on validation and reports on
    test, which nothing of the search reads."""

    TRAIN = "train", "Train"
    VALIDATION = "validation", "Validation"
    TEST = "test", "Test"


class GoldenItem(models.Model):
    Split = GoldenItemSplit

    golden_set = models.ForeignKey(GoldenSet, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField(default=0)
    input = models.JSONField()
    expected_output = models.TextField(blank=True, default="")
    scoring_criteria = models.TextField(blank=True, default="")
    rubric = models.JSONField(default=list, blank=True,
                              help_text='Criteria with points: [{"criterion": "...", "max_points": 2}, ...]')
    tags = models.JSONField(default=list, blank=True, help_text='For example ["critical"].')
    metadata = models.JSONField(default=dict, blank=True)
    # dealt when the item is written (services: evals/splits.py's rule), editable afterwards; not in content_hash:
    # where an item serves changes nothing of how its answer is graded
    split = models.CharField(max_length=10, choices=Split.choices,
                             help_text="train, validation or test: where evolution uses the item (dealt by its "
                                       "first tag when it is added; editable).")
    # what a result of this item depends on: input, expected output, criteria, rubric (not tags or metadata)
    content_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["golden_set", "position", "id"]
        indexes = [models.Index(fields=["golden_set", "position"], name="evals_item_set_position_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(split__in=GoldenItemSplit.values),
                                   name="%(app_label)s_%(class)s_known_split",
                                   violation_error_message="An item's split is train, validation or test."),
        ]

    def __str__(self) -> str:
        text = self.input if isinstance(self.input, str) else json.dumps(self.input, ensure_ascii=False)
        return text[:80]

    def save(self, *args, **kwargs):
        self.content_hash = item_content_hash(self.input, self.expected_output, self.scoring_criteria, self.rubric)
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "content_hash"}
        super().save(*args, **kwargs)

    @property
    def critical(self) -> bool:
        return "critical" in (self.tags or [])


class EvalRunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class EvalRun(RunOwner):
    Status = EvalRunStatus
    ACTIVE = (Status.QUEUED, Status.RUNNING)

    class Origin(models.TextChoices):
        MANUAL = "manual", "Manual"
        SCHEDULE = "schedule", "Schedule"
        EVOLUTION = "evolution", "Evolution"
        DEMO = "demo", "Demo seed"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="eval_runs")
    golden_set = models.ForeignKey(GoldenSet, on_delete=models.CASCADE, related_name="eval_runs")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="eval_runs")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.MANUAL)
    reuse = models.BooleanField(default=True, help_text="Reuse earlier results of the same version, item and graders.")
    # what the run graded with (the set's graders and threshold when it started), and its concurrency
    config = models.JSONField(default=dict, blank=True)
    items_total = models.PositiveIntegerField(default=0)
    items_done = models.PositiveIntegerField(default=0)
    items_reused = models.PositiveIntegerField(default=0)
    grading_errors = models.PositiveIntegerField(default=0)
    avg_score = models.FloatField(null=True, blank=True)
    pass_rate = models.FloatField(null=True, blank=True)
    # what the version's invocations cost (reused results count what they cost when they ran) and what this run paid
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    paid_usd = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    judge_usd = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    latency_p50_ms = models.FloatField(null=True, blank=True)
    latency_p95_ms = models.FloatField(null=True, blank=True)
    fitness = models.FloatField(null=True, blank=True,
                                help_text="0-100: the average score weighed with time and cost (docs/fitness.md).")
    # a scheduled re-evaluation that dropped significantly below the previous run of the same version
    regression = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="evals_run_ws_created_idx"),
            models.Index(fields=["golden_set", "workflow_version", "-created_at"], name="evals_run_set_version_idx"),
            # the reconcile's scan of active eval runs (ACTIVE), oldest first (durable.owners.reconcile)
            models.Index(fields=["id"], name="evals_run_active_idx",
                         condition=Q(status__in=["queued", "running"])),
        ]

    def __str__(self) -> str:
        return f"eval run {self.pk} of {self.workflow_version_id} on {self.golden_set}"


class GoldenResult(models.Model):
    """One item's result in one eval run. Written once (append-only); a reused result points at the
    result it copies (`reused_from`)."""

    eval_run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results")
    golden_item = models.ForeignKey(GoldenItem, on_delete=models.CASCADE, related_name="results")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="golden_results")
    workflow_invocation = models.ForeignKey(WorkflowInvocation, null=True, blank=True, on_delete=models.SET_NULL,
                                            related_name="golden_results")
    actual_output = models.TextField(blank=True, default="")
    score = models.FloatField(null=True, blank=True, help_text="0..1; empty when grading failed.")
    passed = models.BooleanField(null=True)
    grading_rationale = models.TextField(blank=True, default="")
    grader = models.CharField(max_length=200, blank=True, default="", help_text="Which grader(s) scored it.")
    grades = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="", help_text="A grading error, or the invocation's failure.")
    grading_error = models.BooleanField(default=False)
    latency_ms = models.FloatField(null=True, blank=True)
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    judge_usd = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    reuse_key = models.CharField(max_length=64, db_index=True)
    reused_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["eval_run", "golden_item"], name="%(app_label)s_%(class)s_unique_item"),
        ]
        ordering = ["eval_run", "golden_item__position", "golden_item_id"]

    def __str__(self) -> str:
        return f"{self.golden_item_id}: {self.score}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise ValueError("A golden result is append-only: write a new one.")
        super().save(*args, **kwargs)


class Promotion(models.Model):
    """An activation of a version (a promotion over the active one, or a rollback) with its evidence."""

    class Action(models.TextChoices):
        PROMOTE = "promote", "Promote"
        ROLLBACK = "rollback", "Rollback"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="promotions")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="promotions")
    previous_version = models.ForeignKey(WorkflowVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+")
    golden_set = models.ForeignKey(GoldenSet, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=10, choices=Action.choices)
    evidence = models.JSONField(default=dict, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} {self.workflow_version_id}"
