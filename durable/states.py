"""Run and step statuses with their transition groups; the models and the store share them.

Kept apart from ``durable.models`` so the engine's modules import them before Django's app
registry is ready (``durable`` itself is imported while the apps load)."""

from django.db import models


class RunStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    DEAD = "dead", "Dead"


RunStatus.TERMINAL = frozenset({"completed", "failed", "cancelled", "dead"})
RunStatus.ACTIVE = frozenset({"pending", "running", "suspended"})
RunStatus.RETRYABLE = frozenset({"failed", "cancelled", "dead"})


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # still open when its run ended


StepStatus.OPEN = frozenset({"pending", "running"})
StepStatus.SETTLED = frozenset({"completed", "failed", "cancelled"})
