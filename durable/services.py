"""Writes on durable runs: start, signal, publish, cancel, retry, schedules.

Every state change is a compare-and-set on the row's status, so concurrent callers (two
operators, a tick and a turn) cannot apply the same change twice or undo each other.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from durable import engine
from durable.codec import encode
from durable.models import BufferedEvent, DurableRun, Schedule
from durable.registry import get_workflow
from durable.settings import durable_settings


class RunNotFound(LookupError):
    pass


class InvalidRunState(ValueError):
    pass


class RunIdConflict(Exception):
    """A run id is already taken by a run of another namespace."""


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
    engine.create_run(run_id=run_id, workflow=workflow, input=input, namespace=namespace, tags=list(tags),
                      priority=int(priority))
    run = DurableRun.objects.get(pk=run_id)
    if run.namespace != namespace:
        raise RunIdConflict(f"run id {run_id!r} is taken by another namespace")
    return run


def signal_send(*, run_id: str, name: str, payload=None) -> str:
    """Deliver a signal: to the run's waiter when one exists, else buffered until the run waits.
    Returns "delivered" or "buffered"."""
    with transaction.atomic():
        status = DurableRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status is None:
            raise RunNotFound(run_id)
        if status not in DurableRun.Status.ACTIVE:
            raise InvalidRunState(f"run {run_id} is {status}; signals reach active runs only")
        engine._lock_signal(run_id, name)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT seq FROM {engine.WAITER_TABLE} WHERE run_id = %s AND kind = 'signal' AND key = %s "
                "ORDER BY seq LIMIT 1", [run_id, name],
            )
            waiter = cursor.fetchone()
            if waiter is not None:
                cursor.execute(
                    f"UPDATE {engine.CP_TABLE} SET status = 'completed', output = %s, completed_at = statement_timestamp(), "
                    "wake_at = NULL WHERE run_id = %s AND seq = %s AND status = 'pending'",
                    [encode({"payload": payload}), run_id, waiter[0]],
                )
                delivered = cursor.rowcount == 1
                cursor.execute(f"DELETE FROM {engine.WAITER_TABLE} WHERE run_id = %s AND seq = %s",
                               [run_id, waiter[0]])
                if delivered:
                    engine.wake_run(run_id)
                    return "delivered"
            cursor.execute(
                f"INSERT INTO {engine.SIGNAL_TABLE} (run_id, name, payload, created_at) "
                "VALUES (%s, %s, %s, statement_timestamp())", [run_id, name, encode(payload)],
            )
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
        engine._lock_event(namespace, name)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {engine.WAITER_TABLE} AS w USING {engine.RUN_TABLE} AS r "
                "WHERE w.run_id = r.id AND r.namespace = %s AND w.kind = 'event' AND w.key = %s "
                "AND %s::jsonb @> w.match RETURNING w.run_id, w.seq",
                [namespace, name, text],
            )
            waiters = cursor.fetchall()
            reached = 0
            for run_id, seq in waiters:
                cursor.execute(
                    f"UPDATE {engine.CP_TABLE} SET status = 'completed', output = %s, completed_at = statement_timestamp(), "
                    "wake_at = NULL WHERE run_id = %s AND seq = %s AND status = 'pending'",
                    [encode({"payload": payload}), run_id, seq],
                )
                if cursor.rowcount == 1:
                    reached += 1
                    engine.wake_run(run_id)
        if not reached:
            BufferedEvent.objects.create(
                namespace=namespace, name=name, payload=payload,
                expires_at=timezone.now() + timedelta(seconds=durable_settings().event_ttl_seconds),
            )
    return reached


def run_cancel(*, run_id: str, reason: str = "cancelled by an operator", compensate: bool = False) -> bool:
    """Cancel an active run and its active descendants. A compare-and-set on the status: a turn still
    running finds the run cancelled when it tries to finish and can never resurrect it.
    With `compensate=True`, the workflow's registered compensation workflow is started.
    Returns False when the run was not active."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {engine.RUN_TABLE} SET status = 'cancelled', error = %s, ended_at = statement_timestamp(), "
                "locked_by = '', locked_until = NULL, wake_at = NULL, wake_pending = false, updated_at = statement_timestamp() "
                "WHERE id = %s AND status IN ('pending', 'running', 'suspended') "
                "RETURNING parent_id, parent_seq, workflow, input, namespace, tags",
                [encode({"type": "Cancelled", "message": reason}), run_id],
            )
            row = cursor.fetchone()
            if row is None:
                return False
            descendants = engine.descendant_run_ids([run_id])
            if descendants:
                cursor.execute(
                    f"UPDATE {engine.RUN_TABLE} SET status = 'cancelled', error = %s, ended_at = statement_timestamp(), "
                    "locked_by = '', locked_until = NULL, wake_at = NULL, wake_pending = false, updated_at = statement_timestamp() "
                    "WHERE id = ANY(%s) AND status IN ('pending', 'running', 'suspended')",
                    [encode({"type": "Cancelled", "message": f"parent {run_id} was cancelled"}), descendants],
                )
            cursor.execute(f"DELETE FROM {engine.WAITER_TABLE} WHERE run_id = ANY(%s)",
                           [[run_id, *descendants]])
        parent_id, parent_seq, workflow, input_text, namespace, tags = row
        if parent_id:
            engine.notify_parent(parent_id, parent_seq, "cancelled", child_id=run_id,
                                 error={"type": "Cancelled", "message": reason})
        if compensate:
            definition = get_workflow(workflow)
            if definition.compensation:
                from durable.codec import decode

                engine.create_run(run_id=f"{run_id}:compensate", workflow=definition.compensation,
                                  namespace=namespace, tags=[*(tags or []), "compensation"],
                                  input={"run_id": run_id, "input": decode(input_text, column="run.input",
                                                                           row=run_id)})
    return True


def run_retry(*, run_id: str, input=None, new_input: bool = False) -> bool:
    """Run a failed, cancelled or dead run again.

    A plain retry keeps every completed checkpoint and drops the rest, so the run resumes where it
    failed. `new_input=True` replaces the input and starts over from the first step (a replay of old
    checkpoints with a different input would not be deterministic). Returns False when the run was
    not in a retryable status."""
    with transaction.atomic():
        fields = ["status = 'pending'", "output = ''", "error = ''", "ended_at = NULL", "recovery_attempts = 0",
                  "wake_pending = true", "dispatched_at = statement_timestamp()", "wake_at = NULL", "locked_by = ''",
                  "locked_until = NULL", "updated_at = statement_timestamp()"]
        params: list = []
        if new_input:
            fields.append("input = %s")
            params.append(encode(input))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {engine.RUN_TABLE} SET {', '.join(fields)} "
                "WHERE id = %s AND status IN ('failed', 'cancelled', 'dead') RETURNING priority",
                [*params, run_id],
            )
            row = cursor.fetchone()
            if row is None:
                return False
            if new_input:
                cursor.execute(f"DELETE FROM {engine.CP_TABLE} WHERE run_id = %s", [run_id])
            else:
                cursor.execute(f"DELETE FROM {engine.CP_TABLE} WHERE run_id = %s AND status <> 'completed'",
                               [run_id])
            cursor.execute(f"DELETE FROM {engine.WAITER_TABLE} WHERE run_id = %s", [run_id])
        engine.dispatch_turn(run_id, row[0])
    return True


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
    """Create or update a schedule and compute its next window."""
    from durable.schedules import next_window, validate_schedule

    get_workflow(workflow)
    validate_schedule(every_seconds=every_seconds, cron=cron, timezone_name=timezone_name)
    if Schedule.objects.filter(key=key).exclude(namespace=namespace).exists():
        # keys name the runs (sched:<key>:<window>), so they are global: never take over another namespace's
        raise ValidationError({"key": "A schedule with this key belongs to another namespace."})
    schedule, _ = Schedule.objects.update_or_create(
        key=key,
        defaults=dict(workflow=workflow, namespace=namespace, input=input if input is not None else {},
                      every_seconds=every_seconds, cron=cron, timezone=timezone_name, paused=paused,
                      overlap=overlap, jitter_seconds=jitter_seconds, catchup_limit=catchup_limit, tags=list(tags)),
    )
    schedule.next_fire_at = next_window(schedule, after=timezone.now())
    schedule.save(update_fields=["next_fire_at", "updated_at"])
    return schedule
