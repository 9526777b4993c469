"""Run and step statuses with their transition groups; the models and the store share them.

Kept apart from ``durable.models`` so the engine's modules import them before Django's app
registry is ready (``durable`` itself is imported while the apps load)."""

from django.db import models


# labels are Django's default, the name in title case: a bare value is what a type checker without Django's
# types reads as the str it is (a (value, label) pair reads as a tuple)
class RunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"


RunStatus.TERMINAL = frozenset({"completed", "failed", "cancelled", "dead"})
RunStatus.ACTIVE = frozenset({"pending", "running", "suspended"})
RunStatus.RETRYABLE = frozenset({"failed", "cancelled", "dead"})


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # still open when its run ended


StepStatus.OPEN = frozenset({"pending", "running"})
StepStatus.SETTLED = frozenset({"completed", "failed", "cancelled"})
