"""Rows whose life a durable run drives: an app's own record of what one run does (a workflow
invocation, an eval run, an evolution run), which an operator reads while the run's history stays
in the engine's tables.

Such a model subclasses ``RunOwner`` and is registered (``register``, from its app's
``AppConfig.ready``) with its plan, what its run needs to start, and an optional on-end hook. Its
workflow begins with ``begin_row`` (a child run sharing the row's work with ``join_row``) and ends a
failure with ``fail_row``; everything else about the row's life is here, once for every owner:

- ``begin`` refuses a row of another workspace than the run's namespace, or one another run drives,
  without a write; answers {"ended": status} for a row that already ended; otherwise marks the row
  running (queued becomes running, any other active status stays), names the run, and returns the
  owner's plan, all under the row's lock.
- ``join`` refuses a run that would work for a row as a child of the run driving it (an eval run's
  lanes) unless it is one, of the row's workspace's namespace; it writes nothing.
- ``fail`` ends a row that has not ended yet (failed or cancelled, with the error) and runs the
  owner's on-end hook in the same transaction.
- ``reconcile`` (beat, ``durable.reconcile``) ends the rows whose run ended without them: cancelled
  from the durable admin or API, declared dead, deleted by retention, or never begun while the run
  that wrote the row (``parent_run``) ended.

A concrete owner keeps its own ``Status`` (with at least queued, running, completed, failed and
cancelled), its ``ACTIVE`` statuses (those its active-rows index covers), and ``workspace`` and
``updated_at`` columns. This module knows rows and runs, nothing of what the rows are about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import OperationalError, connection, models, transaction
from django.utils.timezone import now
from psycopg.errors import DeadlockDetected

from durable.errors import RunRefused, StepFailed
from durable.models import DurableRun
from durable.selectors import runs_ended_without_owner
from workspaces.models import Workspace

ERROR_CHARS = 5000
REQUIRED_STATUSES = frozenset({"queued", "running", "completed", "failed", "cancelled"})


class RunOwner(models.Model):
    """The columns every run-driven row has. `status` is declared again by each owner, with its own
    choices and default; the others are the same everywhere."""

    TERMINAL = frozenset({"completed", "failed", "cancelled"})
    ACTIVE: tuple[str, ...] = ()

    status = models.CharField(max_length=10)
    error = models.TextField(blank=True, default="")
    # the run survives retention only as long as its settings say; the row here stays
    durable_run = models.ForeignKey(DurableRun, null=True, blank=True, on_delete=models.DO_NOTHING,
                                    db_constraint=False, related_name="+")
    # the run that wrote this row for a child run of its own to drive (an eval run's item, an evolution's
    # eval run): until that child begins, the parent's end is the only sign that nothing will
    parent_run = models.ForeignKey(DurableRun, null=True, blank=True, on_delete=models.DO_NOTHING,
                                   db_constraint=False, related_name="+")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


@dataclass
class Owner:
    """A registered owner: `plan(row)` runs in begin's transaction, the row locked and marked running,
    and returns the run's plan (a JSON object); `on_end(row_id, error)` runs in fail's. Both may run
    twice for one step (a crash between their commit and its checkpoint), so both are idempotent.
    `related` names the foreign keys `plan` reads through, loaded with the row (only the row is locked)."""

    model: type[RunOwner]
    noun: str
    plan: Callable[[RunOwner], dict]
    on_end: Callable[[int, str], None] | None = None
    related: tuple[str, ...] = ()


_owners: dict[str, Owner] = {}


def register(model: type[RunOwner], *, noun: str, plan: Callable[[RunOwner], dict],
             on_end: Callable[[int, str], None] | None = None, related: tuple[str, ...] = ()) -> Owner:
    """Make `model` an owner (`noun` names a row in refusals: "invocation 7 is driven by run ...").
    Registering the same model again replaces its entry."""
    if not issubclass(model, RunOwner) or model._meta.abstract:
        raise ImproperlyConfigured(f"{model.__name__} must be a concrete subclass of durable.owners.RunOwner")
    missing = REQUIRED_STATUSES - {value for value, _ in model._meta.get_field("status").choices or ()}
    if missing:
        raise ImproperlyConfigured(f"{model.__name__}.status has no {', '.join(sorted(missing))} choice")
    if not model.ACTIVE or set(model.ACTIVE) & model.TERMINAL:
        raise ImproperlyConfigured(f"{model.__name__}.ACTIVE must list its active statuses, none of them terminal")
    names = {field.name for field in model._meta.concrete_fields}
    if not {"workspace", "updated_at"} <= names:
        raise ImproperlyConfigured(f"{model.__name__} needs workspace and updated_at columns to be an owner")
    if isinstance(related, str):
        raise ImproperlyConfigured(f"{model.__name__}: related must be a tuple of names, not the string {related!r}")
    for path in related:
        _check_related(model, path)
    owner = Owner(model=model, noun=noun, plan=plan, on_end=on_end, related=tuple(related))
    _owners[model._meta.label] = owner
    return owner


def _check_related(model: type[RunOwner], path: str) -> None:
    """A `related` name begin can load with the row: a forward foreign key or one-to-one (``a__b`` through
    several), checked as the apps load instead of by the first run's begin (a FieldError every run after)."""
    current = model
    for name in str(path).split("__"):
        try:
            field = current._meta.get_field(name)
        except FieldDoesNotExist:
            raise ImproperlyConfigured(f"{model.__name__}: related {path!r}: {current.__name__} has no field "
                                       f"{name!r}") from None
        if name != field.name:  # get_field answers a foreign key's column name too; select_related does not
            raise ImproperlyConfigured(f"{model.__name__}: related {path!r}: name the field {field.name!r}, not "
                                       f"its column {name!r}")
        if not (field.many_to_one or field.one_to_one) or not field.concrete:
            raise ImproperlyConfigured(f"{model.__name__}: related {path!r}: {current.__name__}.{name} is not a "
                                       "foreign key or a one-to-one field")
        current = field.related_model


def owner_of(model: type[RunOwner]) -> Owner:
    try:
        return _owners[model._meta.label]
    except KeyError:
        raise ImproperlyConfigured(f"{model._meta.label} is not a registered owner (durable.owners.register)") from None


def registered() -> list[Owner]:
    return list(_owners.values())


# ---------------------------------------------------------------------------------------------- the row

def begin(model: type[RunOwner], row_id: int, namespace: str, run_id: str) -> dict:
    """The `begin` step of run `run_id` (of `namespace`) driving row `row_id`: {"refused": why} with
    nothing written (another workspace's row, or one another run drives), {"ended": status} for a
    row that already ended, else the row marked running and driven by `run_id`, and its owner's plan.
    A row created without a run (a child's row, written by its parent) takes the first run that
    begins it. One transaction: a crash before its commit leaves the row as it was; a crash after it,
    before the step's checkpoint, runs the step again in the next turn, which finds the row naming
    this run and begins it the same way (so a plan must be idempotent)."""
    owner = owner_of(model)
    with transaction.atomic():
        rows = model.objects.select_for_update(of=("self",)).filter(pk=row_id)
        if owner.related:  # select_related() with no names would follow every foreign key
            rows = rows.select_related(*owner.related)
        row = rows.first()
        if row is None or Workspace.namespace_of(row.workspace_id) != namespace:
            return {"refused": f"{owner.noun} {row_id} does not belong to this run's workspace"}
        if row.durable_run_id not in (None, run_id):
            return {"refused": f"{owner.noun} {row_id} is driven by run {row.durable_run_id}"}
        if row.status in model.TERMINAL:
            return {"ended": row.status}
        if row.status == "queued":
            row.status = "running"
        row.started_at = row.started_at or now()
        row.durable_run_id = run_id
        row.save(update_fields=["status", "started_at", "durable_run", "updated_at"])
        return owner.plan(row)


def join(model: type[RunOwner], row_id: int, namespace: str, run_id: str) -> str:
    """The `begin` step of run `run_id` (of `namespace`) working for row `row_id` as a child of the
    run that drives it: why it may not ("" when it may): another workspace's row, or one whose run
    is not its parent. Writes nothing, so a crash anywhere leaves nothing; the row's run is named
    once by its begin and never changes, so the answer holds for the child's life."""
    owner = owner_of(model)
    row = model.objects.filter(pk=row_id).values("workspace_id", "durable_run_id").first()
    if row is None or Workspace.namespace_of(row["workspace_id"]) != namespace:
        return f"{owner.noun} {row_id} does not belong to this run's workspace"
    driver = row["durable_run_id"]
    if not driver or not DurableRun.objects.filter(pk=run_id, parent_id=driver).exists():
        return f"{owner.noun} {row_id} is driven by run {driver}, of which this run is not a child"
    return ""


DEADLOCK_ATTEMPTS = 3


def fail(model: type[RunOwner], row_id: int, error: str, status: str = "failed", namespace: str | None = None) -> None:
    """End row `row_id` with `error` as `status` (failed or cancelled) unless it already ended; with
    `namespace`, only a row of that namespace's workspace is touched. The owner's on-end hook runs
    in the same transaction, whether or not the row was still active (a retried run may have opened
    work of its own after the row's first end, and it ends with it). A crash before the commit leaves
    the row active: the step runs again, or the reconcile ends it once its run has ended; a crash
    after it runs the step again, which finds the row ended and runs the hook again (so a hook must
    be idempotent)."""
    if status not in model.TERMINAL - {"completed"}:
        raise ValueError(f"a row fails as failed or cancelled, not {status!r}")
    # the row's lock, then what the hook ends; a turn ending a node takes the node's, then the row's (its
    # totals): when a cancel crosses one, Postgres aborts the transaction that waited first, done again here
    # (outside a caller's transaction, which is the caller's to retry)
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            return _fail(model, row_id, error, status, namespace)
        except OperationalError as exc:
            if (connection.in_atomic_block or attempt == DEADLOCK_ATTEMPTS
                    or not isinstance(exc.__cause__, DeadlockDetected)):
                raise


def _fail(model: type[RunOwner], row_id: int, error: str, status: str, namespace: str | None) -> None:
    owner = owner_of(model)
    rows = model.objects.filter(pk=row_id)
    if namespace is not None:
        rows = rows.filter(workspace_id=Workspace.id_of_namespace(namespace))
    with transaction.atomic():
        # the row's lock first, then whatever the hook ends: the order the owners' own steps take
        current = rows.select_for_update().values_list("status", flat=True).first()
        if current is None:
            return
        if current not in model.TERMINAL:
            rows.update(status=status, error=error[:ERROR_CHARS], ended_at=now(), updated_at=now())
        if owner.on_end is not None:
            owner.on_end(row_id, error)


def reconcile(*, limit: int = 500, of: Iterable[type[RunOwner]] | None = None) -> dict[str, int]:
    """End the rows of every owner (or of the models `of` names) whose durable run ended without them, at most
    `limit` of each per pass, oldest first: each takes its run's state (cancelled or failed) with the
    reason. Returns how many of each owner ({model label: count}). Safe to race: each end is `fail`,
    conditional on the row not having ended."""
    owners = registered() if of is None else [owner_of(model) for model in of]
    counts = {}
    for owner in owners:
        model = owner.model
        ended = runs_ended_without_owner(model.objects.filter(status__in=model.ACTIVE), limit=limit)
        for pk, state, reason in ended:
            fail(model, pk, reason, status=state)
        counts[model._meta.label] = len(ended)
    return counts


# ------------------------------------------------------------------------------------------- in a workflow

def begin_row(ctx, model: type[RunOwner], row_id: int) -> dict:
    """Begin the row this run drives, as the step `begin`, and return its plan ({"ended": status}
    when it had ended). A failure in it is recorded on the row (a row of this run's namespace only)
    and raised; a refusal writes nothing and raises RunRefused."""
    try:
        plan = ctx.step("begin", begin, model, row_id, ctx.namespace, ctx.run_id)
    except Exception as exc:
        ctx.step("fail", fail, model, row_id, describe(exc), "failed", ctx.namespace)
        raise
    if "refused" in plan:
        raise RunRefused(plan["refused"])
    return plan


def join_row(ctx, model: type[RunOwner], row_id: int) -> None:
    """Check, as the step `begin`, that this run is a child of the run driving row `row_id` (of its
    workspace's namespace); RunRefused when it is not."""
    refused = ctx.step("begin", join, model, row_id, ctx.namespace, ctx.run_id)
    if refused:
        raise RunRefused(refused)


def fail_row(ctx, model: type[RunOwner], row_id: int, exc: BaseException) -> None:
    """Record `exc` as the end of the row this run drives, as the step `fail`."""
    ctx.step("fail", fail, model, row_id, describe(exc))


def describe(exc: BaseException) -> str:
    """What an operator reads of a failure: a failed step's name, its error's type and message."""
    if isinstance(exc, StepFailed):
        error = exc.error if isinstance(exc.error, dict) else {}
        message = error.get("message") or str(exc)
        kind = error.get("type")
        return f"{exc.name}: {kind + ': ' if kind and kind not in message else ''}{message}"
    return str(exc) or type(exc).__name__
