"""Writes on durable runs: create, start, signal, publish, cancel, retry, schedules.

Every state change is a compare-and-set on the row's status, so concurrent callers (two
operators, a tick and a turn) cannot apply the same change twice or undo each other.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from durable import store
from durable.codec import decode, encode
from durable.errors import InvalidRunState, RunIdConflict, RunNotFound
from durable.models import BufferedEvent, BufferedSignal, DurableRun, Schedule
from durable.registry import get_workflow
from durable.schedules import next_window, validate_schedule
from durable.settings import durable_settings


def run_create(*, run_id: str, workflow: str, input=None, namespace: str = "default", tags: Sequence[str] = (),
               priority: int = 0, parent_id: str | None = None, parent_seq: int | None = None,
               dispatch: bool = True) -> bool:
    """Insert a pending run (idempotent on its id) and dispatch its first turn after commit.
    Returns False when a run with this id already exists. Nothing is validated: ``run_start`` is the
    checked start of a caller's run; the engine's own starts (a schedule's window, a compensation) use this."""
    return store.run_insert(run_id=run_id, workflow=workflow, input_text=encode(input), namespace=namespace,
                            tags=tags, priority=priority, parent_id=parent_id, parent_seq=parent_seq,
                            dispatch=dispatch)


def run_start(*, workflow: str, input=None, run_id: str | None = None, namespace: str = "default",
              tags: Sequence[str] = (), priority: int = 0) -> DurableRun:
    """Start a run of a registered workflow. Idempotent on `run_id`: starting an existing id
    returns that run unchanged. The first turn is dispatched after the transaction commits."""
    get_workflow(workflow)
    if not 0 <= int(priority) <= 9:
        raise ValueError("priority must be between 0 and 9")
    try:
        encode(input)
    except TypeError as exc:
        raise ValueError(f"input is not JSON-serialisable: {exc}") from None
    run_id = run_id or uuid.uuid4().hex
    run_create(run_id=run_id, workflow=workflow, input=input, namespace=namespace, tags=list(tags),
               priority=int(priority))
    run = DurableRun.objects.get(pk=run_id)
    if run.namespace != namespace:
        raise RunIdConflict(f"run id {run_id!r} is taken by another namespace")
    return run


def caller_run_id(*, namespace: str, run_id: str) -> str:
    """The stored id of a run id an API caller chose for a run of `namespace`: "<namespace>:<run_id>" (as
    given when it already carries that prefix). Caller-chosen ids are per namespace, so two workspaces may
    both use "nightly", and a start never learns whether another workspace uses an id."""
    prefix = f"{namespace}:"
    return run_id if run_id.startswith(prefix) else prefix + run_id


def signal_send(*, run_id: str, name: str, payload=None) -> str:
    """Deliver a signal: to the run's waiter when one exists, else buffered until the run waits.
    Returns "delivered" or "buffered"."""
    with transaction.atomic():
        status = DurableRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status is None:
            raise RunNotFound(run_id)
        if status not in DurableRun.Status.ACTIVE:
            raise InvalidRunState(f"run {run_id} is {status}; signals reach active runs only")
        store.lock_signal(run_id, name)
        if store.signal_deliver(run_id=run_id, name=name, payload_text=encode({"payload": payload})):
            return "delivered"
        BufferedSignal.objects.create(run_id=run_id, name=name, payload=encode(payload))
    return "buffered"


def event_publish(*, name: str, payload: dict | None = None, namespace: str = "default") -> int:
    """Publish an event to every run of `namespace` waiting for it whose match the payload contains.
    With no such waiter the event is buffered until the TTL prunes it. Returns runs reached.
    Events never cross namespaces: a workspace's runs only hear that workspace's events."""
    payload = payload or {}
    if not isinstance(payload, dict):
        raise ValueError("an event payload is a JSON object")
    text = json.dumps(payload, default=str)
    with transaction.atomic():
        store.lock_event(namespace, name)
        reached = store.event_deliver(namespace=namespace, name=name, payload_json=text,
                                      output_text=encode({"payload": payload}))
        if not reached:
            BufferedEvent.objects.create(
                namespace=namespace, name=name, payload=payload,
                expires_at=timezone.now() + timedelta(seconds=durable_settings().event_ttl_seconds),
            )
    return reached


def run_cancel(*, run_id: str, reason: str = "cancelled by an operator", compensate: bool = False) -> bool:
    """Cancel an active run and its active descendants. A compare-and-set on the status that also
    clears the lease: a turn still running there has its writes refused, so it can neither finish,
    checkpoint nor start a child. With `compensate=True`, the workflow's registered compensation
    workflow is started (in the same transaction). Returns False when the run was not active."""
    with transaction.atomic():
        row = store.runs_cancel_tree(
            run_id, error_text=encode({"type": "Cancelled", "message": reason}),
            descendant_error_text=encode({"type": "Cancelled", "message": f"parent {run_id} was cancelled"}),
        )
        if row is None:
            return False
        _parent_id, _parent_seq, workflow, input_text, namespace, tags = row
        if compensate:
            definition = get_workflow(workflow)
            if definition.compensation:
                run_create(run_id=f"{run_id}:compensate", workflow=definition.compensation,
                           namespace=namespace, tags=[*(tags or []), "compensation"],
                           input={"run_id": run_id, "input": decode(input_text, column="run.input", row=run_id)})
    return True


def run_retry(*, run_id: str, input=None, new_input: bool = False) -> bool:
    """Run a failed, cancelled or dead run again.

    A plain retry keeps every completed checkpoint and drops the rest, and retries the run's failed,
    cancelled or dead descendants the same way, so the run resumes where it stopped. `new_input=True`
    replaces the input and starts a new history from the first step, with new children (a replay of
    old checkpoints with a different input would not be deterministic). Returns False when the run
    was not in a retryable status."""
    input_text = None
    if new_input:
        try:
            input_text = encode(input)
        except TypeError as exc:
            raise ValueError(f"input is not JSON-serialisable: {exc}") from None
    return store.run_retry(run_id, input_text=input_text) is not None


BULK_LIMIT = 500


def runs_bulk_cancel(*, run_ids: Sequence[str], reason: str = "cancelled by an operator") -> dict:
    """Cancel up to 500 runs; returns how many matched and how many were actually cancelled."""
    ids = list(run_ids)[:BULK_LIMIT]
    applied = sum(1 for run_id in ids if run_cancel(run_id=run_id, reason=reason))
    return {"matched": len(ids), "applied": applied}


def runs_bulk_retry(*, run_ids: Sequence[str]) -> dict:
    ids = list(run_ids)[:BULK_LIMIT]
    applied = sum(1 for run_id in ids if run_retry(run_id=run_id))
    return {"matched": len(ids), "applied": applied}


# ------------------------------------------------------------------------------------------ schedules


def schedule_save(*, key: str, workflow: str, namespace: str = "default", input=None, every_seconds: int | None = None,
                  cron: str = "", timezone_name: str = "UTC", paused: bool = False, overlap: str = "allow",
                  jitter_seconds: int = 0, catchup_limit: int = 1, tags: Sequence[str] = ()) -> Schedule:
    """Create or update the schedule `key` of `namespace` (keys are per namespace) and compute its next
    window."""
    get_workflow(workflow)
    validate_schedule(every_seconds=every_seconds, cron=cron, timezone_name=timezone_name)
    schedule, _ = Schedule.objects.update_or_create(
        namespace=namespace, key=key,
        defaults=dict(workflow=workflow, input=input if input is not None else {},
                      every_seconds=every_seconds, cron=cron, timezone=timezone_name, paused=paused,
                      overlap=overlap, jitter_seconds=jitter_seconds, catchup_limit=catchup_limit, tags=list(tags)),
    )
    schedule.next_fire_at = next_window(schedule, after=timezone.now())
    schedule.save(update_fields=["next_fire_at", "updated_at"])
    return schedule
