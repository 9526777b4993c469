"""Evolution runs: a workflow improved by genetic programming or reflective rewriting, every
generation a step of a durable run, every individual a version scored by an eval run."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from durable.owners import RunOwner
from evals.models import EvalRun, GoldenSet
from workflows.models import Workflow, WorkflowVersion
from workspaces.models import Workspace


class EvolutionRun(RunOwner):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Mode(models.TextChoices):
        GP = "gp", "Genetic programming"
        REFLECTIVE = "reflective", "Reflective (GEPA-style)"
        ITERATIVE = "iterative", "Iterative"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.PAUSED)

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="evolution_runs")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="evolution_runs")
    golden_set = models.ForeignKey(GoldenSet, on_delete=models.PROTECT, related_name="evolution_runs")
    base_version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="+")
    goal_text = models.TextField(blank=True, default="")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.GP)
    config = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    stop_reason = models.CharField(max_length=200, blank=True, default="")
    # the generation boundary a paused run waits at (its `resume:<boundary>` signal), "" when not waiting
    paused_at = models.CharField(max_length=50, blank=True, default="")
    best_version = models.ForeignKey(WorkflowVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    # fitness on the items the search scored: the train split with a held-out claim, else the whole set
    base_fitness = models.FloatField(null=True, blank=True)
    best_fitness = models.FloatField(null=True, blank=True)
    # the generalization result (evolution/durable_workflows.py, Loop.report): whether the set carried a held-out
    # claim (else why not), train / validation / test fitness of base and best, the test lift with its interval
    # and paired test, the train-test gap; train and validation kept up to date while the run goes on
    report = models.JSONField(default=dict, blank=True)
    generations_done = models.PositiveIntegerField(default=0)
    evaluations = models.PositiveIntegerField(default=0, help_text="Individuals scored (full eval runs).")
    rollouts = models.PositiveIntegerField(default=0, help_text="Item invocations run (reused results excluded).")
    cache_hits = models.PositiveIntegerField(default=0)
    usd_cost = models.DecimalField(max_digits=18, decimal_places=10, default=0)
    parent_run = None  # started with its own run (evolution_start), never written by a run for a child of its own
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="evolution_run_ws_created_idx"),
            # the reconcile's scan of active evolution runs (ACTIVE), oldest first (durable.owners.reconcile)
            models.Index(fields=["id"], name="evolution_run_active_idx",
                         condition=Q(status__in=["queued", "running", "paused"])),
        ]

    def __str__(self) -> str:
        return f"evolution {self.pk} of {self.workflow}"

    @property
    def lift(self) -> float | None:
        """The best fitness's relative gain over the base's on the items the search scored (0.12 = +12%): the
        train split's with a held-out claim, where `test_lift` is the result."""
        if self.base_fitness and self.best_fitness is not None:
            return (self.best_fitness - self.base_fitness) / self.base_fitness
        return None

    @property
    def held_out(self) -> bool | None:
        """Whether the run searched on train, selected on validation and reports on test (None: not known yet)."""
        return self.report.get("held_out") if self.report else None

    @property
    def test_lift(self) -> float | None:
        """The best version's relative gain over the base's on the test split (None without one)."""
        return ((self.report or {}).get("test") or {}).get("lift")


class Generation(models.Model):
    evolution_run = models.ForeignKey(EvolutionRun, on_delete=models.CASCADE, related_name="generations")
    number = models.PositiveIntegerField()
    best_workflow_version = models.ForeignKey(WorkflowVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                              related_name="+")
    # best / avg / worst / stddev fitness, evaluations, rollouts, cache hits, cost, improvement
    stats = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["evolution_run", "number"], name="%(app_label)s_%(class)s_unique_number"),
        ]
        ordering = ["evolution_run", "number"]

    def __str__(self) -> str:
        return f"generation {self.number}"


class Individual(models.Model):
    """A version's place in a generation: how it was made and the fitness it scored."""

    evolution_run = models.ForeignKey(EvolutionRun, on_delete=models.CASCADE, related_name="individuals")
    generation = models.ForeignKey(Generation, on_delete=models.CASCADE, related_name="individuals")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="individuals")
    eval_run = models.ForeignKey(EvalRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=30, blank=True, default="", help_text="The operator that made it.")
    note = models.TextField(blank=True, default="")
    fitness = models.FloatField(null=True, blank=True)
    avg_score = models.FloatField(null=True, blank=True)
    survived = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["generation", "workflow_version"],
                                    name="%(app_label)s_%(class)s_unique_member"),
        ]
        ordering = ["generation", "-fitness"]

    def __str__(self) -> str:
        return f"{self.workflow_version_id} in {self.generation}"
