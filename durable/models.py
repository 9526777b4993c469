"""The durable engine's seven tables.

Payload columns (inputs, outputs, errors, signal and event payloads) are text holding
JSON, or a codec envelope when payload encryption is on: the engine encodes and decodes
them itself (see ``durable.codec``), so a damaged value reads as missing instead of
breaking every read that touches the row. Hot tables stay narrow; each index names the
query it serves.
"""

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from durable.states import RunStatus, StepStatus


class DurableRun(models.Model):
    Status = RunStatus

    id = models.CharField(primary_key=True, max_length=255)
    workflow = models.CharField(max_length=200)
    namespace = models.CharField(max_length=100, default="default")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    input = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    priority = models.SmallIntegerField(default=0)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children",
                               db_constraint=False, db_index=False)
    parent_seq = models.IntegerField(null=True, blank=True)
    # a turn is wanted: set by every wake (start, timer, signal, settled step), cleared when a turn claims the run
    wake_pending = models.BooleanField(default=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    locked_by = models.CharField(max_length=100, blank=True, default="")
    locked_until = models.DateTimeField(null=True, blank=True)
    recovery_attempts = models.IntegerField(default=0)
    turns = models.IntegerField(default=0)
    # the run's history number: moved on by continue-as-new and by a retry with new input, which start a new
    # history under the same id (its children get new ids, so a child of an old history never reports into it)
    epoch = models.IntegerField(default=0, db_default=0)
    # moved on by every retry and continue-as-new: a checkpoint written under an older fence (by a turn still
    # running when its history was abandoned) is ignored and dropped by the next replay
    fence = models.IntegerField(default=0, db_default=0)
    # the W3C traceparent the run was started under (empty with tracing off): every turn and queued step of
    # the run, on any worker and after any retry, continues that trace (config/telemetry.py)
    trace_context = models.CharField(max_length=55, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # the worker's pending-run scans and the facet counts
            models.Index(fields=["status"], name="durable_run_status_idx"),
            # the timer pass: suspended runs whose wake_at is due, most overdue first
            models.Index(fields=["status", "wake_at"], name="durable_run_status_wake_idx"),
            # namespaced listing and the namespaced recovery / dispatch scans
            models.Index(fields=["namespace", "status", "created_at"], name="durable_run_ns_status_idx"),
            # the dashboard's default newest-first listing
            models.Index(fields=["created_at"], name="durable_run_created_idx"),
            # lease recovery: running runs whose lease expired
            models.Index(fields=["locked_until"], name="durable_run_lease_idx", condition=Q(status="running")),
            # the re-dispatch pass: wakes whose turn message was lost
            models.Index(fields=["dispatched_at"], name="durable_run_wake_pending_idx",
                         condition=Q(wake_pending=True)),
            # a run's children, for the run page and cascading cancels
            models.Index(fields=["parent"], name="durable_run_parent_idx"),
            # the tag filter of the list
            GinIndex(fields=["tags"], name="durable_run_tags_idx"),
            # listing and facets by workflow
            models.Index(fields=["workflow", "status"], name="durable_run_workflow_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"




class StepCheckpoint(models.Model):
    class Kind(models.TextChoices):
        STEP = "step", "Step"
        SLEEP = "sleep", "Sleep"
        SIGNAL = "signal", "Signal"
        CHILD = "child", "Child"
        EVENT = "event", "Event"
        VALUE = "value", "Recorded value"  # ctx.now / ctx.uuid / ctx.side_effect / ctx.set_attributes

    Status = StepStatus

    # db_index=False: the unique (run, seq) index serves every lookup by run
    run = models.ForeignKey(DurableRun, on_delete=models.CASCADE, related_name="checkpoints", db_constraint=False,
                            db_index=False)
    seq = models.IntegerField()
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.STEP)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    input = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    parallel_group = models.IntegerField(null=True, blank=True)
    queue = models.CharField(max_length=100, blank=True, default="")
    options = models.JSONField(default=dict, blank=True)
    attempt = models.IntegerField(default=0)
    child_run_id = models.CharField(max_length=255, blank=True, default="")
    # the run's fence when the checkpoint was written (see DurableRun.fence)
    fence = models.IntegerField(default=0, db_default=0)
    # sleeps and signal timeouts: when the waiting ends; queued steps: when a retry is due
    wake_at = models.DateTimeField(null=True, blank=True)
    # running queued steps: the end of the allowed silence, re-armed by each persisted heartbeat
    timeout_at = models.DateTimeField(null=True, blank=True)
    heartbeat_progress = models.TextField(blank=True, default="")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "seq"], name="durable_checkpoint_run_seq_key",
                violation_error_message="A run has one checkpoint per sequence number.",
            ),
        ]
        indexes = [
            # targeted reads by name (latest checkpoint of a step, child lookups)
            models.Index(fields=["run", "name"], name="durable_checkpoint_name_idx"),
            # per-fan reads (the run page's fan statistics and paging); partial, so the hot path of
            # sequential inline steps (no group) never pays for it
            models.Index(fields=["run", "parallel_group", "seq"], name="durable_checkpoint_group_idx",
                         condition=Q(parallel_group__isnull=False)),
            # the join barrier "is any step of this fan still pending": only unsettled rows are in it, so the
            # answer is one index probe however large the fan, and completed inline steps never touch it
            models.Index(fields=["run", "parallel_group", "seq"], name="durable_checkpoint_open_idx",
                         condition=Q(status__in=["pending", "running"])),
            # the tick's due step retries
            models.Index(fields=["wake_at"], name="durable_checkpoint_retry_idx",
                         condition=Q(status="pending") & ~Q(queue="") & Q(wake_at__isnull=False)),
            # the tick's silent-step timeouts
            models.Index(fields=["timeout_at"], name="durable_checkpoint_timeout_idx",
                         condition=Q(status="running") & Q(timeout_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.name} ({self.status})"



class SignalWaiter(models.Model):
    class Kind(models.TextChoices):
        SIGNAL = "signal", "Signal"
        EVENT = "event", "Event"
        CHILD = "child", "Child"

    run = models.ForeignKey(DurableRun, on_delete=models.CASCADE, related_name="waiters", db_constraint=False,
                            db_index=False)
    seq = models.IntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    key = models.CharField(max_length=255)
    match = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="durable_waiter_run_seq_key"),
        ]
        indexes = [
            # run-scoped waiter reads and the ctx.all join barrier's per-child lookup
            models.Index(fields=["run", "kind", "key"], name="durable_signal_waiters_run_idx"),
            # publishing an event: the waiters of that event name
            models.Index(fields=["kind", "key"], name="durable_waiter_key_idx"),
        ]


    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} waits for {self.kind} {self.key}"

class BufferedSignal(models.Model):
    """A signal sent before its waiter existed: consumed, oldest first, by the next matching wait."""

    run = models.ForeignKey(DurableRun, on_delete=models.CASCADE, related_name="buffered_signals",
                            db_constraint=False, db_index=False)
    name = models.CharField(max_length=255)
    payload = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # the signal token (run, name): a wait's look-up of an early signal
            models.Index(fields=["run", "name", "id"], name="durable_buffered_signal_token"),
        ]


    def __str__(self) -> str:
        return f"{self.name} for {self.run_id}"

class BufferedEvent(models.Model):
    """An event published while no run of its namespace waited for it; kept until its TTL prunes it."""

    namespace = models.CharField(max_length=100, default="default")
    name = models.CharField(max_length=255)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [
            # a wait's look-up of an earlier event of its namespace by name
            models.Index(fields=["namespace", "name", "created_at"], name="durable_buffered_event_name"),
            # the TTL prune
            models.Index(fields=["expires_at"], name="durable_buffered_event_expiry"),
        ]


    def __str__(self) -> str:
        return self.name

class Schedule(models.Model):
    class Overlap(models.TextChoices):
        ALLOW = "allow", "Allow: start every window"
        SKIP = "skip", "Skip a window while the previous run is active"

    key = models.SlugField(max_length=150)
    workflow = models.CharField(max_length=200)
    namespace = models.CharField(max_length=100, default="default")
    input = models.JSONField(default=dict, blank=True)
    every_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=100, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    paused = models.BooleanField(default=False)
    overlap = models.CharField(max_length=5, choices=Overlap.choices, default=Overlap.ALLOW)
    jitter_seconds = models.PositiveIntegerField(default=0)
    catchup_limit = models.PositiveIntegerField(default=1, help_text="Most missed windows started when catching up.")
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.CharField(max_length=255, blank=True, default="")
    tags = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # keys are per namespace, like run ids: one workspace's "nightly" is not another's
            models.UniqueConstraint(
                fields=["namespace", "key"], name="durable_schedule_namespace_key",
                violation_error_message="A schedule with this key already exists in this namespace.",
            ),
            models.CheckConstraint(
                condition=(Q(every_seconds__isnull=False) & Q(cron="")) | (Q(every_seconds__isnull=True) & ~Q(cron="")),
                name="durable_schedule_every_xor_cron",
                violation_error_message="Set exactly one of every_seconds and cron.",
            ),
        ]
        indexes = [
            # the tick's due-schedule scan
            models.Index(fields=["paused", "next_fire_at"], name="durable_schedule_due_idx"),
        ]

    def __str__(self) -> str:
        return self.key


class RunAttribute(models.Model):
    """Search attributes: filterable key/value pairs a run sets with ctx.set_attributes."""

    run = models.ForeignKey(DurableRun, on_delete=models.CASCADE, related_name="attributes", db_constraint=False,
                            db_index=False)
    key = models.CharField(max_length=100)
    value = models.TextField()
    value_num = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="durable_attribute_run_key"),
        ]
        indexes = [
            # attribute filters: equality on text
            models.Index(fields=["key", "value"], name="durable_attribute_kv_idx"),
            # attribute filters: numeric comparisons
            models.Index(fields=["key", "value_num"], name="durable_attribute_knum_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

