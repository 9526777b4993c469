"""The durable engine: turns, the ``ctx`` API, queued steps and wakes.

A workflow is a registered function ``fn(ctx, input)``. Running it is a series of turns:
each turn replays the function from the top, every ``ctx`` call takes the next sequence
number and is answered from its checkpoint when one exists. A call with no checkpoint
does its work and writes one; a call that must wait (a queued step, a sleep, a signal,
a child, a fan) suspends the turn. The next wake (a settled step, a due timer, a
signal) triggers the next turn.

Ownership is decided in Postgres, never in worker memory: a turn holds a lease on its
run (``locked_by`` / ``locked_until``), every checkpoint is unique per (run, seq), every
settle is a compare-and-set on the checkpoint's status and attempt, and finishing a run
is a compare-and-set on its status and lease. A worker that lost its lease can execute a
step twice (at-least-once) but can never checkpoint it twice.

The hot path (an inline step) is one prepared INSERT in autocommit: one statement and
one commit per step.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import random
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC as TZ_UTC
from datetime import datetime, timedelta

import psycopg
from django.db import connection, transaction

from durable.codec import decode, encode
from durable.registry import UnknownWorkflow, callable_path, get_workflow, resolve_callable
from durable.settings import durable_settings

logger = logging.getLogger("durable.engine")

RUN_TABLE = "durable_durablerun"
CP_TABLE = "durable_stepcheckpoint"
WAITER_TABLE = "durable_signalwaiter"
SIGNAL_TABLE = "durable_bufferedsignal"
EVENT_TABLE = "durable_bufferedevent"
ATTR_TABLE = "durable_runattribute"

ACTIVE = ("pending", "running", "suspended")


# ------------------------------------------------------------------------------------------ errors


class DurableError(Exception):
    pass


class StepFailed(DurableError):
    """A step (or child) failed for good; raised into the workflow, which may catch it."""

    def __init__(self, name: str, error: dict | None):
        self.name = name
        self.error = error or {}
        super().__init__(f"step {name!r} failed: {self.error.get('type', 'Error')}: {self.error.get('message', '')}")


class ChildFailed(StepFailed):
    pass


class FanFailed(DurableError):
    """One or more items of ``ctx.all`` failed (wait_all, return_exceptions=False)."""

    def __init__(self, failures: dict[int, StepFailed], results: list):
        self.failures = failures
        self.results = results
        first = next(iter(failures.values()))
        super().__init__(f"{len(failures)} of {len(results)} fan items failed; first: {first}")


class _ControlFlow(BaseException):
    """Raised through user code to stop a turn; BaseException so `except Exception` cannot swallow it."""


class Suspend(_ControlFlow):
    def __init__(self, wake_at: datetime | None = None):
        self.wake_at = wake_at


class LeaseLost(_ControlFlow):
    pass


class NonDeterminismError(_ControlFlow):
    pass


# ------------------------------------------------------------------------------------------ specs


@dataclass(frozen=True)
class Step:
    """A fan item for ``ctx.all``: a step run on a Celery worker."""

    name: str
    fn: Callable
    args: Sequence = ()
    queue: str | None = None
    retries: int = 0
    backoff: str = "exponential"
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    jitter: bool = True
    timeout: float | None = None


@dataclass(frozen=True)
class Child:
    """A fan item for ``ctx.all``: a child run of another registered workflow."""

    workflow: str
    input: object = None
    name: str = ""
    tags: Sequence[str] = ()


def _now() -> datetime:
    return datetime.now(TZ_UTC)


def error_payload(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
    }


def backoff_delay(options: dict, attempt: int) -> float:
    """Seconds before retry number `attempt` (1-based): fixed or exponential with cap and full jitter."""
    base = float(options.get("backoff_base", 1.0))
    cap = float(options.get("backoff_cap", 60.0))
    fixed = options.get("backoff", "exponential") == "fixed"
    delay = base if fixed else min(cap, base * (2 ** (attempt - 1)))
    if options.get("jitter", True):
        delay = random.uniform(delay / 2, delay)
    return min(delay, cap)


_NO_RETRIES = {"retries": 0}


def _step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout) -> dict:
    if backoff not in ("fixed", "exponential"):
        raise ValueError(f"backoff must be 'fixed' or 'exponential', not {backoff!r}")
    options = {"retries": int(retries)}
    if retries:
        options.update(backoff=backoff, backoff_base=backoff_base, backoff_cap=backoff_cap, jitter=jitter)
    if timeout is not None:
        options["timeout"] = float(timeout)
    return options


# -------------------------------------------------------------------------------------- raw access


def raw_cursor() -> psycopg.Cursor:
    """A server-side-binding psycopg cursor on Django's connection, so hot statements get prepared."""
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


# ----------------------------------------------------------------------------------------- dispatch


def _dispatch_enabled() -> bool:
    from django.conf import settings

    return getattr(settings, "DURABLE_DISPATCH_ENABLED", True)


def _celery_priority(priority: int) -> int:
    # runs: higher is more urgent (0..9); Celery on Redis: 0 is served first
    return max(0, min(9, 9 - int(priority)))


def dispatch_turn(run_id: str, priority: int = 0) -> None:
    """Send a turn message after the surrounding transaction commits."""
    if not _dispatch_enabled():
        return

    def send():
        from durable.tasks import run_turn

        run_turn.apply_async((run_id,), queue=durable_settings().turn_queue, priority=_celery_priority(priority))

    transaction.on_commit(send)


def dispatch_steps(run_id: str, seqs: Sequence[int], queue: str, priority: int = 0) -> None:
    """Send the step messages of one run in chunks, after the surrounding transaction commits."""
    if not _dispatch_enabled() or not seqs:
        return
    chunk = durable_settings().fan_chunk
    ordered = sorted(seqs)

    def send():
        from durable.tasks import run_steps

        for start in range(0, len(ordered), chunk):
            run_steps.apply_async((run_id, ordered[start:start + chunk]), queue=queue,
                                  priority=_celery_priority(priority))

    transaction.on_commit(send)


# --------------------------------------------------------------------------------------------- wakes


WAKE_SQL = f"""
UPDATE {RUN_TABLE} SET wake_pending = true, dispatched_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = %s AND status IN ('pending', 'running', 'suspended')
RETURNING priority, (status = 'running' AND locked_until > statement_timestamp()) AS busy
"""


def wake_run(run_id: str) -> bool:
    """Ask for a turn. A run whose turn is in flight is only flagged: that turn sees the flag when it
    releases the run and dispatches the next turn itself, so a wake during a turn is never lost."""
    with connection.cursor() as cursor:
        cursor.execute(WAKE_SQL, [run_id])
        row = cursor.fetchone()
    if row is None:
        return False
    priority, busy = row
    if not busy:
        dispatch_turn(run_id, priority)
    return True


# ------------------------------------------------------------------------------------------- leases


class _LeaseKeeper:
    """One daemon thread per process renewing the leases of the turns this process is running,
    so a long inline step never lets its lease lapse while the worker is alive."""

    def __init__(self):
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, run_id: str, token: str) -> None:
        with self._lock:
            self._held[run_id] = token
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="durable-lease-keeper", daemon=True)
                self._thread.start()

    def release(self, run_id: str) -> None:
        with self._lock:
            self._held.pop(run_id, None)

    def _loop(self) -> None:
        from django.db import connection as thread_connection

        while True:
            lease = durable_settings().lease_seconds
            time.sleep(max(0.5, lease / 3))
            with self._lock:
                held = dict(self._held)
            if not held:
                continue
            try:
                with thread_connection.cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {RUN_TABLE} SET locked_until = statement_timestamp() + make_interval(secs => %s) "
                        "WHERE id = ANY(%s) AND locked_by = ANY(%s) AND status = 'running'",
                        [lease, list(held), list(held.values())],
                    )
            except Exception:
                logger.exception("durable: lease renewal failed")
                thread_connection.close()


lease_keeper = _LeaseKeeper()


def _worker_token() -> str:
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------ context


class _Checkpoint:
    __slots__ = ("attempt", "child_run_id", "error", "group", "kind", "name", "output", "queue", "seq", "status",
                 "wake_at")

    def __init__(self, row):
        (self.seq, self.name, self.kind, self.status, self.output, self.error, self.group, self.attempt,
         self.wake_at, self.queue, self.child_run_id) = row


REPLAY_SQL = f"""
SELECT seq, name, kind, status, output, error, parallel_group, attempt, wake_at, queue, child_run_id
FROM {CP_TABLE} WHERE run_id = %s ORDER BY seq
"""

INSERT_DONE_SQL = f"""
INSERT INTO {CP_TABLE} (run_id, seq, name, kind, status, input, output, error, queue, options, attempt,
                        child_run_id, heartbeat_progress, created_at, started_at, completed_at)
VALUES (%s, %s, %s, %s, 'completed', '', %s, '', '', '{{}}', %s, '', '', statement_timestamp(), %s,
        statement_timestamp())
ON CONFLICT (run_id, seq) DO NOTHING
"""

INSERT_PENDING_COLUMNS = ("run_id", "seq", "name", "kind", "status", "input", "output", "error", "queue", "options",
                          "attempt", "child_run_id", "heartbeat_progress", "parallel_group", "wake_at",
                          "created_at")


def insert_checkpoints(cursor, rows: list[tuple], *, batch: int = 200) -> int:
    """Multi-row inserts of pending checkpoints (200 rows a statement); returns rows written."""
    written = 0
    columns = ", ".join(INSERT_PENDING_COLUMNS)
    width = len(INSERT_PENDING_COLUMNS)
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        placeholders = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(chunk))
        cursor.execute(
            f"INSERT INTO {CP_TABLE} ({columns}) VALUES {placeholders} ON CONFLICT (run_id, seq) DO NOTHING",
            [value for row in chunk for value in row],
        )
        written += cursor.rowcount
    return written


def _pending_row(run_id, seq, name, kind, *, input="", queue="", options=None, attempt=0, child_run_id="",
                 group=None, wake_at=None, status="pending", error="", now=None):
    return (run_id, seq, name, kind, status, input, "", error, queue, json.dumps(options or {}), attempt,
            child_run_id, "", group, wake_at, now or _now())


class Context:
    """The API a workflow function uses. Every call is checkpointed and replayed deterministically."""

    def __init__(self, *, run_id: str, workflow: str, namespace: str, priority: int,
                 checkpoints: dict[int, _Checkpoint], tags: list[str]):
        self.run_id = run_id
        self.workflow = workflow
        self.namespace = namespace
        self.priority = priority
        self.tags = tags
        self._checkpoints = checkpoints
        self._seq = 0
        self._cursor: psycopg.Cursor | None = None

    # -- internals

    @property
    def cursor(self) -> psycopg.Cursor:
        if self._cursor is None or self._cursor.closed:
            self._cursor = raw_cursor()
        return self._cursor

    def _next(self, name: str, kind: str) -> tuple[int, _Checkpoint | None]:
        seq = self._seq
        self._seq += 1
        checkpoint = self._checkpoints.get(seq)
        if checkpoint is not None and (checkpoint.name != name or checkpoint.kind != kind):
            raise NonDeterminismError(
                f"non-deterministic replay at seq {seq}: the checkpoint is {checkpoint.kind} {checkpoint.name!r} "
                f"but the workflow now asks for {kind} {name!r}"
            )
        return seq, checkpoint

    def _record(self, seq: int, name: str, kind: str, value, *, started: datetime | None = None,
                attempt: int = 1) -> None:
        self.cursor.execute(INSERT_DONE_SQL, (self.run_id, seq, name, kind, encode(value), attempt,
                                              started or _now()), prepare=True)
        if self.cursor.rowcount != 1:
            raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker")

    def _row(self, checkpoint: _Checkpoint, column: str):
        return decode(getattr(checkpoint, column), column=f"checkpoint.{column}", row=f"{self.run_id}#{checkpoint.seq}")

    def _settle_pending(self, seq: int, status: str, *, output=None, error=None, attempt: int | None = None,
                        set_attempt: int | None = None) -> bool:
        sql = (f"UPDATE {CP_TABLE} SET status = %s, output = %s, error = %s, completed_at = statement_timestamp(), "
               "wake_at = NULL, attempt = COALESCE(%s, attempt) "
               "WHERE run_id = %s AND seq = %s AND status IN ('pending', 'running')")
        params = [status, encode(output) if output is not None else "", encode(error) if error is not None else "",
                  set_attempt, self.run_id, seq]
        if attempt is not None:
            sql += " AND attempt = %s"
            params.append(attempt)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount == 1

    def _failed(self, checkpoint: _Checkpoint, cls=StepFailed) -> StepFailed:
        return cls(checkpoint.name, self._row(checkpoint, "error"))

    # -- steps

    def step(self, name: str, fn: Callable, *args, retries: int = 0, backoff: str = "exponential",
             backoff_base: float = 1.0, backoff_cap: float = 60.0, jitter: bool = True,
             timeout: float | None = None, queue: str | None = None):
        """Run `fn(*args)` once and checkpoint its JSON result.

        Inline (the default) it runs inside the turn: at-least-once execution, exactly-once
        checkpoint. With `queue=` it is dispatched to that Celery queue and the turn suspends until
        its result settles. Failures are retried `retries` times with fixed or exponential backoff
        (capped, with jitter); `timeout` is the longest silence allowed (each heartbeat re-arms it).
        """
        seq, checkpoint = self._next(name, "step")
        if checkpoint is not None:
            if checkpoint.status == "completed":
                return self._row(checkpoint, "output")
            if checkpoint.status == "failed":
                raise self._failed(checkpoint)
            if checkpoint.queue:
                raise Suspend()
            # an inline step waiting for its retry
            if checkpoint.wake_at is not None and checkpoint.wake_at > _now():
                raise Suspend(checkpoint.wake_at)
            options = _step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout)
            return self._run_inline(seq, name, fn, args, options, previous_attempt=checkpoint.attempt)
        if not retries and timeout is None and not queue:
            options = _NO_RETRIES  # the hot path: nothing to validate or build
        else:
            options = _step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout)
        if queue:
            self._enqueue(seq, name, fn, args, queue, options)
            raise Suspend()
        return self._run_inline(seq, name, fn, args, options, previous_attempt=None)

    def _run_inline(self, seq, name, fn, args, options, *, previous_attempt: int | None):
        attempt = (previous_attempt or 0) + 1
        started = _now()
        try:
            result = fn(*args)  # inline: the turn's lease keeper vouches for liveness, heartbeats are no-ops
        except Exception as exc:
            return self._inline_failed(seq, name, exc, options, attempt, previous_attempt)
        if previous_attempt is None:
            self._record(seq, name, "step", result, started=started, attempt=attempt)
        elif not self._settle_pending(seq, "completed", output=result, attempt=previous_attempt, set_attempt=attempt):
            raise LeaseLost(f"checkpoint {self.run_id}#{seq} was settled by another worker")
        return result

    def _inline_failed(self, seq, name, exc, options, attempt, previous_attempt):
        error = error_payload(exc)
        retries_left = options.get("retries", 0) - (attempt - 1)
        if previous_attempt is None:
            if retries_left > 0:
                wake_at = _now() + timedelta(seconds=backoff_delay(options, attempt))
                row = _pending_row(self.run_id, seq, name, "step", options=options, attempt=attempt,
                                   wake_at=wake_at, error=encode(error))
                if insert_checkpoints(self.cursor, [row]) != 1:
                    raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker") from None
                raise Suspend(wake_at) from None
            row = _pending_row(self.run_id, seq, name, "step", options=options, attempt=attempt, status="failed",
                               error=encode(error))
            if insert_checkpoints(self.cursor, [row]) != 1:
                raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker") from None
            raise StepFailed(name, error) from exc
        if retries_left > 0:
            wake_at = _now() + timedelta(seconds=backoff_delay(options, attempt))
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {CP_TABLE} SET attempt = %s, wake_at = %s, error = %s "
                    "WHERE run_id = %s AND seq = %s AND status = 'pending' AND attempt = %s",
                    [attempt, wake_at, encode(error), self.run_id, seq, previous_attempt],
                )
                if cursor.rowcount != 1:
                    raise LeaseLost(f"checkpoint {self.run_id}#{seq} was settled by another worker") from None
            raise Suspend(wake_at) from None
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {CP_TABLE} SET attempt = %s, status = 'failed', error = %s, completed_at = statement_timestamp(), "
                "wake_at = NULL WHERE run_id = %s AND seq = %s AND status = 'pending' AND attempt = %s",
                [attempt, encode(error), self.run_id, seq, previous_attempt],
            )
            if cursor.rowcount != 1:
                raise LeaseLost(f"checkpoint {self.run_id}#{seq} was settled by another worker") from None
        raise StepFailed(name, error) from exc

    def _enqueue(self, seq, name, fn, args, queue, options, group=None) -> tuple:
        redispatch = _now() + timedelta(seconds=durable_settings().redispatch_after_seconds)
        payload = encode({"fn": callable_path(fn), "args": list(args)})
        row = _pending_row(self.run_id, seq, name, "step", input=payload, queue=queue, options=options,
                           group=group, wake_at=redispatch)
        if group is None:
            with transaction.atomic():
                if insert_checkpoints(self.cursor, [row]) != 1:
                    raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker")
                dispatch_steps(self.run_id, [seq], queue, self.priority)
        return row

    def transaction(self, name: str, fn: Callable, *args):
        """Run `fn(*args)` and write its checkpoint in one database transaction: its writes happen
        exactly once, whatever crashes or retries happen around it."""
        seq, checkpoint = self._next(name, "step")
        if checkpoint is not None:
            if checkpoint.status == "completed":
                return self._row(checkpoint, "output")
            raise self._failed(checkpoint)
        started = _now()
        with transaction.atomic():
            result = fn(*args)
            self._record(seq, name, "step", result, started=started)
        return result

    # -- recorded values

    def now(self) -> datetime:
        """The current time, recorded once: a replay sees the same instant."""
        seq, checkpoint = self._next("now", "value")
        if checkpoint is not None:
            return datetime.fromisoformat(self._row(checkpoint, "output"))
        value = _now()
        self._record(seq, "now", "value", value.isoformat())
        return value

    def uuid(self) -> uuid.UUID:
        """A random UUID, recorded once."""
        seq, checkpoint = self._next("uuid", "value")
        if checkpoint is not None:
            return uuid.UUID(self._row(checkpoint, "output"))
        value = uuid.uuid4()
        self._record(seq, "uuid", "value", str(value))
        return value

    def side_effect(self, fn: Callable, *args, name: str = "side_effect"):
        """Run a non-deterministic `fn` once and record its JSON result for every replay."""
        seq, checkpoint = self._next(name, "value")
        if checkpoint is not None:
            return self._row(checkpoint, "output")
        value = fn(*args)
        self._record(seq, name, "value", value)
        return value

    def random(self, seed_name: str = "random") -> random.Random:
        """A random generator seeded once and recorded, so a resumed run makes the same choices."""
        seed = self.side_effect(lambda: random.getrandbits(63), name=seed_name)
        return random.Random(seed)

    def set_attributes(self, attributes: dict) -> None:
        """Set search attributes (filterable in the list: eq/ne/gt/gte/lt/lte), once per call site."""
        seq, checkpoint = self._next("set_attributes", "value")
        if checkpoint is not None:
            return
        with transaction.atomic():
            upsert_attributes(self.run_id, attributes)
            self._record(seq, "set_attributes", "value", sorted(attributes))

    def heartbeat(self, progress=None) -> None:
        heartbeat(progress)

    # -- timers

    def sleep(self, seconds: float) -> None:
        """Suspend the run for `seconds`; no worker is held while it sleeps."""
        self._timer("sleep", _now() + timedelta(seconds=max(0.0, float(seconds))))

    def sleep_until(self, when: datetime) -> None:
        self._timer("sleep", when)

    def _timer(self, name: str, wake_at: datetime) -> None:
        seq, checkpoint = self._next(name, "sleep")
        if checkpoint is not None:
            if checkpoint.status == "completed":
                return
            if checkpoint.wake_at is None or checkpoint.wake_at <= _now():
                if not self._settle_pending(seq, "completed", output=None):
                    raise LeaseLost(f"timer {self.run_id}#{seq} was settled by another worker")
                return
            raise Suspend(checkpoint.wake_at)
        if wake_at <= _now():
            self._record(seq, name, "sleep", None)
            return
        row = _pending_row(self.run_id, seq, name, "sleep", wake_at=wake_at)
        if insert_checkpoints(self.cursor, [row]) != 1:
            raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker")
        raise Suspend(wake_at)

    # -- signals and events

    def wait_for_signal(self, name: str, timeout: float | None = None, default=None):
        """Wait for the signal `name` sent to this run and return its payload (`default` on timeout).
        A signal sent before the wait is buffered and consumed here, never lost."""
        seq, checkpoint = self._next(name, "signal")
        if checkpoint is not None:
            return self._resolve_wait(seq, checkpoint, default)
        deadline = _now() + timedelta(seconds=timeout) if timeout is not None else None
        with transaction.atomic():
            _lock_signal(self.run_id, name)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {SIGNAL_TABLE} WHERE id = (SELECT id FROM {SIGNAL_TABLE} "
                    "WHERE run_id = %s AND name = %s ORDER BY id LIMIT 1 FOR UPDATE) RETURNING payload",
                    [self.run_id, name],
                )
                buffered = cursor.fetchone()
            if buffered is not None:
                payload = decode(buffered[0], column="signal.payload", row=self.run_id)
                self._record(seq, name, "signal", {"payload": payload})
                return payload
            self._wait(seq, name, "signal", name, {}, deadline)
        raise Suspend(deadline)

    def wait_for_event(self, name: str, match: dict | None = None, timeout: float | None = None, default=None):
        """Wait for an event `name` of this run's namespace whose payload contains `match` (JSON
        containment) and return the payload. An event published earlier with no waiter is buffered
        (until its TTL) and taken here."""
        match = match or {}
        seq, checkpoint = self._next(name, "event")
        if checkpoint is not None:
            return self._resolve_wait(seq, checkpoint, default)
        deadline = _now() + timedelta(seconds=timeout) if timeout is not None else None
        with transaction.atomic():
            _lock_event(self.namespace, name)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {EVENT_TABLE} WHERE id = (SELECT id FROM {EVENT_TABLE} "
                    "WHERE namespace = %s AND name = %s AND payload @> %s::jsonb AND expires_at > statement_timestamp() "
                    "ORDER BY created_at, id LIMIT 1 FOR UPDATE) RETURNING payload",
                    [self.namespace, name, json.dumps(match)],
                )
                buffered = cursor.fetchone()
            if buffered is not None:
                payload = buffered[0] if not isinstance(buffered[0], str) else json.loads(buffered[0])
                self._record(seq, name, "event", {"payload": payload})
                return payload
            self._wait(seq, name, "event", name, match, deadline)
        raise Suspend(deadline)

    def _wait(self, seq, name, kind, key, match, deadline) -> None:
        row = _pending_row(self.run_id, seq, name, kind, wake_at=deadline)
        if insert_checkpoints(self.cursor, [row]) != 1:
            raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker")
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {WAITER_TABLE} (run_id, seq, kind, key, match, created_at) "
                "VALUES (%s, %s, %s, %s, %s::jsonb, statement_timestamp()) ON CONFLICT (run_id, seq) DO NOTHING",
                [self.run_id, seq, kind, key, json.dumps(match)],
            )

    def _resolve_wait(self, seq, checkpoint: _Checkpoint, default):
        if checkpoint.status == "completed":
            value = self._row(checkpoint, "output") or {}
            return default if value.get("timed_out") else value.get("payload")
        if checkpoint.status == "failed":
            raise self._failed(checkpoint)
        if checkpoint.wake_at is not None and checkpoint.wake_at <= _now():
            with transaction.atomic():
                if checkpoint.kind == "signal":
                    _lock_signal(self.run_id, checkpoint.name)
                else:
                    _lock_event(self.namespace, checkpoint.name)
                if not self._settle_pending(seq, "completed", output={"timed_out": True}):
                    # the signal won the race: read what it delivered
                    raise Suspend()
                with connection.cursor() as cursor:
                    cursor.execute(f"DELETE FROM {WAITER_TABLE} WHERE run_id = %s AND seq = %s",
                                   [self.run_id, seq])
            return default
        raise Suspend(checkpoint.wake_at)

    # -- children and fans

    def child(self, workflow: str, input=None, *, name: str | None = None, tags: Sequence[str] = ()):
        """Start a child run of `workflow` and return its output once it completes (ChildFailed if not)."""
        label = name or workflow
        seq, checkpoint = self._next(label, "child")
        if checkpoint is not None:
            if checkpoint.status == "completed":
                return self._row(checkpoint, "output")
            if checkpoint.status == "failed":
                raise self._failed(checkpoint, ChildFailed)
            raise Suspend()
        get_workflow(workflow)  # fail fast, in the parent, on an unknown name
        with transaction.atomic():
            row = self._child_row(seq, label, workflow, input, tags, group=None)
            if insert_checkpoints(self.cursor, [row]) != 1:
                raise LeaseLost(f"checkpoint {self.run_id}#{seq} was written by another worker")
        raise Suspend()

    def _child_row(self, seq, label, workflow, input, tags, group) -> tuple:
        child_id = f"{self.run_id}/{seq}"
        created = create_run(run_id=child_id, workflow=workflow, input=input, namespace=self.namespace,
                             tags=list(tags) or list(self.tags), priority=self.priority,
                             parent_id=self.run_id, parent_seq=seq)
        if not created:
            # the child exists already (an operator retry of this run): let it wake us when it ends
            wake_run(child_id)
        return _pending_row(self.run_id, seq, label, "child", child_run_id=child_id, group=group)

    def all(self, items: Iterable[Step | Child], *, mode: str = "wait_all", return_exceptions: bool = False) -> list:
        """Run steps and children in parallel and return their results in order.

        `mode="wait_all"` waits for every item, then raises FanFailed if any failed (or, with
        `return_exceptions=True`, puts the StepFailed in its place); `mode="fail_fast"` raises the
        first failure as soon as it settles.
        """
        if mode not in ("wait_all", "fail_fast"):
            raise ValueError(f"mode must be 'wait_all' or 'fail_fast', not {mode!r}")
        items = list(items)
        if not items:
            return []
        first = self._seq
        checkpoints = []
        for item in items:
            kind = "step" if isinstance(item, Step) else "child"
            label = item.name if isinstance(item, Step) else (item.name or item.workflow)
            checkpoints.append(self._next(label, kind)[1])
        existing = [cp for cp in checkpoints if cp is not None]
        if not existing:
            self._start_fan(first, items)
            raise Suspend()
        if len(existing) != len(items):
            raise NonDeterminismError(f"fan at seq {first} has {len(existing)} checkpoints for {len(items)} items")
        failures: dict[int, StepFailed] = {}
        waiting = False
        for index, cp in enumerate(checkpoints):
            if cp.status == "failed":
                failures[index] = self._failed(cp, ChildFailed if cp.kind == "child" else StepFailed)
                if mode == "fail_fast":
                    raise failures[index]
            elif cp.status != "completed":
                waiting = True
        if waiting:
            raise Suspend()
        results = [failures[i] if i in failures else self._row(cp, "output") for i, cp in enumerate(checkpoints)]
        if failures and not return_exceptions:
            raise FanFailed(failures, results)
        return results

    def _start_fan(self, first: int, items: list) -> None:
        default_queue = durable_settings().default_step_queue
        rows, by_queue = [], {}
        redispatch = _now() + timedelta(seconds=durable_settings().redispatch_after_seconds)
        with transaction.atomic():
            for offset, item in enumerate(items):
                seq = first + offset
                if isinstance(item, Step):
                    queue = item.queue or default_queue
                    options = _step_options(item.retries, item.backoff, item.backoff_base, item.backoff_cap,
                                            item.jitter, item.timeout)
                    payload = encode({"fn": callable_path(item.fn), "args": list(item.args)})
                    rows.append(_pending_row(self.run_id, seq, item.name, "step", input=payload, queue=queue,
                                             options=options, group=first, wake_at=redispatch))
                    by_queue.setdefault(queue, []).append(seq)
                else:
                    get_workflow(item.workflow)
                    rows.append(self._child_row(seq, item.name or item.workflow, item.workflow, item.input,
                                                item.tags, group=first))
            if insert_checkpoints(self.cursor, rows) != len(rows):
                raise LeaseLost(f"fan {self.run_id}#{first} was written by another worker")
            for queue, seqs in by_queue.items():
                dispatch_steps(self.run_id, seqs, queue, self.priority)


def _lock_signal(run_id: str, name: str) -> None:
    # serialises a wait's "buffered signal? else register a waiter" with a send's
    # "waiter? else buffer", so neither can miss the other
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"durable:signal:{run_id}:{name}"])


def _lock_event(namespace: str, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                       [f"durable:event:{namespace}:{name}"])


def upsert_attributes(run_id: str, attributes: dict) -> None:
    # attributes exist to be searched, so they are stored as plain text/JSON, never through the payload codec
    from django.core.serializers.json import DjangoJSONEncoder

    rows = []
    for key, value in attributes.items():
        key = str(key)
        if not key or len(key) > 100:
            raise ValueError(f"attribute names are 1 to 100 characters, not {key[:120]!r}")
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        text = value if isinstance(value, str) else json.dumps(value, cls=DjangoJSONEncoder)
        rows.append((run_id, key, text, number))
    if not rows:
        return
    placeholders = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ATTR_TABLE} (run_id, key, value, value_num) VALUES {placeholders} "
            "ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value, value_num = EXCLUDED.value_num",
            [v for row in rows for v in row],
        )


# -------------------------------------------------------------------------------------- run records


def create_run(*, run_id: str, workflow: str, input=None, namespace: str = "default", tags: Sequence[str] = (),
               priority: int = 0, parent_id: str | None = None, parent_seq: int | None = None,
               dispatch: bool = True) -> bool:
    """Insert a pending run (idempotent on its id) and dispatch its first turn after commit.
    Returns False when a run with this id already exists."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {RUN_TABLE} (id, workflow, namespace, status, input, output, error, tags, priority,
                    parent_id, parent_seq, wake_pending, dispatched_at, locked_by, recovery_attempts, turns,
                    created_at, updated_at)
                VALUES (%s, %s, %s, 'pending', %s, '', '', %s, %s, %s, %s, true, statement_timestamp(), '', 0, 0, statement_timestamp(), statement_timestamp())
                ON CONFLICT (id) DO NOTHING""",
            [run_id, workflow, namespace, encode(input), list(tags), priority, parent_id, parent_seq],
        )
        created = cursor.rowcount == 1
    if created and dispatch:
        dispatch_turn(run_id, priority)
    return created


def descendant_run_ids(run_ids: list[str]) -> list[str]:
    """Every child, grandchild, ... of the given runs, in one recursive query on the parent index."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""WITH RECURSIVE tree(id) AS (
                    SELECT id FROM {RUN_TABLE} WHERE parent_id = ANY(%s)
                    UNION ALL SELECT r.id FROM {RUN_TABLE} r JOIN tree ON r.parent_id = tree.id)
                SELECT id FROM tree""",
            [run_ids],
        )
        return [row[0] for row in cursor.fetchall()]


# --------------------------------------------------------------------------------------------- turns


CLAIM_SQL = f"""
UPDATE {RUN_TABLE}
SET status = 'running', locked_by = %s, locked_until = statement_timestamp() + make_interval(secs => %s), wake_pending = false,
    wake_at = NULL, turns = turns + 1, started_at = COALESCE(started_at, statement_timestamp()), updated_at = statement_timestamp()
WHERE id = %s AND status IN ('pending', 'suspended', 'running') AND (locked_until IS NULL OR locked_until < statement_timestamp())
RETURNING workflow, input, namespace, priority, tags, turns, parent_id
"""

RELEASE_SQL = f"""
UPDATE {RUN_TABLE}
SET status = 'suspended', wake_at = %s, locked_by = '', locked_until = NULL, updated_at = statement_timestamp(),
    dispatched_at = CASE WHEN wake_pending THEN statement_timestamp() ELSE dispatched_at END
WHERE id = %s AND locked_by = %s AND status = 'running'
RETURNING wake_pending
"""

FINISH_SQL = f"""
UPDATE {RUN_TABLE}
SET status = %s, output = %s, error = %s, ended_at = statement_timestamp(), locked_by = '', locked_until = NULL, wake_at = NULL,
    wake_pending = false, updated_at = statement_timestamp()
WHERE id = %s AND locked_by = %s AND status = 'running'
RETURNING parent_id, parent_seq
"""


@dataclass
class TurnResult:
    run_id: str
    outcome: str  # completed | failed | suspended | not_claimed | lease_lost
    wake_at: datetime | None = None
    error: dict | None = None
    output: object = None
    redispatched: bool = False


def execute_turn(run_id: str) -> TurnResult:
    """Claim the run, replay its workflow from its checkpoints, and record where it got to."""
    settings = durable_settings()
    token = _worker_token()
    cursor = raw_cursor()
    cursor.execute(CLAIM_SQL, (token, settings.lease_seconds, run_id), prepare=True)
    claimed = cursor.fetchone()
    if claimed is None:
        return TurnResult(run_id, "not_claimed")
    workflow_name, input_text, namespace, priority, tags, turns, parent_id = claimed
    lease_keeper.hold(run_id, token)
    try:
        checkpoints = {}
        if turns > 1:  # the first claim ever of a run: nothing can have been checkpointed yet
            cursor.execute(REPLAY_SQL, (run_id,), prepare=True)
            checkpoints = {row[0]: _Checkpoint(row) for row in cursor.fetchall()}
        try:
            definition = get_workflow(workflow_name)
        except UnknownWorkflow as exc:
            return _finish(run_id, token, "failed", error=error_payload(exc), has_parent=bool(parent_id))
        ctx = Context(run_id=run_id, workflow=workflow_name, namespace=namespace, priority=priority,
                      checkpoints=checkpoints, tags=list(tags or []))
        ctx._cursor = cursor
        workflow_input = decode(input_text, column="run.input", row=run_id)
        try:
            output = definition.fn(ctx, workflow_input)
        except Suspend as suspend:
            return _release(run_id, token, suspend.wake_at, priority)
        except LeaseLost as lost:
            logger.warning("durable: run %s: %s; leaving it to the lease holder", run_id, lost)
            return TurnResult(run_id, "lease_lost")
        except NonDeterminismError as exc:
            return _finish(run_id, token, "failed", error=error_payload(exc), has_parent=bool(parent_id))
        except Exception as exc:
            return _finish(run_id, token, "failed", error=error_payload(exc), has_parent=bool(parent_id))
        try:
            encoded = encode(output)
        except TypeError as exc:
            return _finish(run_id, token, "failed", has_parent=bool(parent_id), error=error_payload(
                TypeError(f"the workflow's return value is not JSON-serialisable: {exc}")))
        return _finish(run_id, token, "completed", output=output, encoded_output=encoded, has_parent=bool(parent_id))
    finally:
        lease_keeper.release(run_id)


def _release(run_id: str, token: str, wake_at: datetime | None, priority: int) -> TurnResult:
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, [wake_at, run_id, token])
        row = cursor.fetchone()
    if row is None:
        return TurnResult(run_id, "lease_lost")
    redispatched = bool(row[0])
    if redispatched:
        dispatch_turn(run_id, priority)
    return TurnResult(run_id, "suspended", wake_at=wake_at, redispatched=redispatched)


def _finish(run_id: str, token: str, status: str, *, output=None, encoded_output: str | None = None,
            error: dict | None = None, has_parent: bool = True) -> TurnResult:
    """Record the run's end: a compare-and-set on its status and lease. A child also settles its
    parent's checkpoint in the same transaction; a root run needs only the one statement. (A run can
    only end once each of its waits resolved, and resolving a wait deletes its waiter.)"""
    params = [status, encoded_output if encoded_output is not None else "", encode(error) if error else "",
              run_id, token]
    fan_groups: list[int] = []
    with transaction.atomic(durable=False) if has_parent else contextlib.nullcontext():
        with connection.cursor() as cursor:
            cursor.execute(FINISH_SQL, params)
            row = cursor.fetchone()
        if row is None:
            # cancelled (or recovered by another worker) while this turn ran: never resurrect it
            return TurnResult(run_id, "lease_lost")
        parent_id, parent_seq = row
        if parent_id:
            fan_groups = notify_parent(parent_id, parent_seq, status, output=output, error=error, child_id=run_id,
                                       check_fan=False)
    # the parent's join check runs after the commit (see wake_when_fan_settled)
    if fan_groups:
        wake_when_fan_settled(parent_id, fan_groups)
    return TurnResult(run_id, status, output=output, error=error)


def notify_parent(parent_id: str, parent_seq: int, child_status: str, *, output=None, error=None,
                  child_id: str = "", check_fan: bool = True) -> list[int]:
    """Settle the parent's child checkpoint and wake the parent when its join allows.

    A child in a fan wakes its parent only when the fan has settled. With `check_fan=False` that check
    is left to the caller, to run after its transaction commits; the fan groups to check are returned.
    Otherwise it runs when the surrounding transaction commits."""
    if child_status != "completed" and not error:
        error = {"type": "ChildFailed", "message": f"child run {child_id} ended {child_status}"}
    status = "completed" if child_status == "completed" else "failed"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CP_TABLE} SET status = %s, output = %s, error = %s, completed_at = statement_timestamp() "
            "WHERE run_id = %s AND seq = %s AND status IN ('pending', 'running') RETURNING parallel_group",
            [status, encode(output) if status == "completed" else "", encode(error) if error else "",
             parent_id, parent_seq],
        )
        row = cursor.fetchone()
    if row is None:
        return []
    group = row[0]
    if group is None or status == "failed":
        wake_run(parent_id)
        return []
    if check_fan:
        transaction.on_commit(lambda: wake_when_fan_settled(parent_id, [group]))
        return []
    return [group]


FAN_PENDING_SQL = f"""
SELECT seq FROM {CP_TABLE}
WHERE run_id = %s AND parallel_group = %s AND status IN ('pending', 'running')
ORDER BY seq DESC LIMIT 1
"""


def fan_has_pending(run_id: str, group: int) -> bool:
    cursor = raw_cursor()
    cursor.execute(FAN_PENDING_SQL, (run_id, group), prepare=True)
    return cursor.fetchone() is not None


def wake_when_fan_settled(run_id: str, groups) -> None:
    """Wake the run if one of its fans has nothing left pending. Call it after the settle committed.

    Checked inside the settling transaction, two workers settling a fan's last chunks at once would
    each still see the other's rows as running and neither would wake the run. After commit, the
    last one to commit always sees every settle; a duplicate wake is harmless (turn claims are
    compare-and-set)."""
    if any(not fan_has_pending(run_id, group) for group in sorted(set(groups))):
        wake_run(run_id)


# -------------------------------------------------------------------------------------- queued steps


@dataclass
class _StepScope:
    run_id: str
    seq: int
    attempt: int
    timeout: float | None
    last_persist: float = 0.0


_current_step: contextvars.ContextVar[_StepScope | None] = contextvars.ContextVar("durable_step", default=None)


def heartbeat(progress=None) -> None:
    """Report liveness (and optional JSON progress) from inside a step. Persisted at most every few
    seconds; each persisted heartbeat re-arms the step's timeout."""
    scope = _current_step.get()
    if scope is None:  # inline steps: the turn's lease keeper already vouches for liveness
        return
    interval = durable_settings().heartbeat_persist_seconds
    if scope.timeout:
        interval = min(interval, scope.timeout / 3)
    now = time.monotonic()
    if now - scope.last_persist < interval:
        return
    scope.last_persist = now
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CP_TABLE} SET last_heartbeat_at = statement_timestamp(), heartbeat_progress = %s, "
            "timeout_at = CASE WHEN %s::float8 IS NULL THEN NULL ELSE statement_timestamp() + make_interval(secs => %s::float8) END "
            "WHERE run_id = %s AND seq = %s AND attempt = %s AND status = 'running'",
            [encode(progress) if progress is not None else "", scope.timeout, scope.timeout, scope.run_id,
             scope.seq, scope.attempt],
        )


CLAIM_STEPS_SQL = f"""
UPDATE {CP_TABLE} AS cp
SET status = 'running', started_at = statement_timestamp(), attempt = cp.attempt + 1, last_heartbeat_at = statement_timestamp(), wake_at = NULL,
    timeout_at = statement_timestamp() + make_interval(secs => COALESCE((cp.options->>'timeout')::float8, %s))
WHERE cp.run_id = %s AND cp.seq = ANY(%s) AND cp.status = 'pending' AND cp.queue <> ''
  AND EXISTS (SELECT 1 FROM {RUN_TABLE} r WHERE r.id = cp.run_id AND r.status IN ('pending', 'running', 'suspended'))
RETURNING cp.seq, cp.name, cp.input, cp.options, cp.attempt, cp.parallel_group
"""


def execute_steps(run_id: str, seqs: Sequence[int]) -> dict:
    """Claim, run and settle a batch of one run's queued steps; wake the run when its join allows.

    Claims are compare-and-set (pending -> running, attempt + 1) and settles are conditional on the
    same attempt, so a redelivered message or a second worker can never settle a step twice.
    """
    from django.conf import settings as django_settings

    default_timeout = float(getattr(django_settings, "DURABLE_STEP_DEFAULT_TIMEOUT", 300.0))
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_STEPS_SQL, [default_timeout, run_id, list(seqs)])
        claimed = cursor.fetchall()
    if not claimed:
        return {"claimed": 0, "settled": 0}
    settlements = []
    for seq, name, input_text, options, attempt, group in claimed:
        options = (json.loads(options) if isinstance(options, str) else options) or {}
        payload = decode(input_text, column="checkpoint.input", row=f"{run_id}#{seq}")
        scope = _StepScope(run_id, seq, attempt, options.get("timeout") or default_timeout)
        token = _current_step.set(scope)
        try:
            if not isinstance(payload, dict) or "fn" not in payload:
                raise DurableError(f"step {name!r} has no readable input (undecodable payload)")
            fn = resolve_callable(payload["fn"])
            result = fn(*payload.get("args", []))
            settlements.append((seq, "completed", encode(result), "", None, attempt, group))
        except Exception as exc:
            error = error_payload(exc)
            retries_left = int(options.get("retries", 0)) - (attempt - 1)
            if retries_left > 0:
                wake_at = _now() + timedelta(seconds=backoff_delay(options, attempt))
                settlements.append((seq, "pending", "", encode(error), wake_at, attempt, group))
            else:
                settlements.append((seq, "failed", "", encode(error), None, attempt, group))
        finally:
            _current_step.reset(token)
    settled = settle_steps(run_id, settlements)
    return {"claimed": len(claimed), "settled": len(settled)}


def settle_steps(run_id: str, settlements: list[tuple]) -> list[tuple]:
    """Settle many results of one run in one statement (multi-row VALUES, 200 rows a statement),
    without touching the steps' inputs; then wake the run if a join is complete or a step failed.

    Each settlement is (seq, status, output, error, retry_wake_at, attempt, group)."""
    settled: list[tuple] = []
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(settlements), 200):
            chunk = settlements[start:start + 200]
            values = ", ".join(["(%s::int, %s, %s, %s, %s::timestamptz, %s::int)"] * len(chunk))
            cursor.execute(
                f"""UPDATE {CP_TABLE} AS cp
                        SET status = v.status, output = v.output, error = v.error, wake_at = v.wake_at,
                            timeout_at = NULL,
                            completed_at = CASE WHEN v.status IN ('completed', 'failed') THEN statement_timestamp() END
                        FROM (VALUES {values}) AS v(seq, status, output, error, wake_at, attempt)
                        WHERE cp.run_id = %s AND cp.seq = v.seq AND cp.status = 'running'
                          AND cp.attempt = v.attempt
                        RETURNING cp.seq, cp.status, cp.parallel_group""",
                [v for row in chunk for v in row[:6]] + [run_id],
            )
            settled.extend(cursor.fetchall())
    should_wake = False
    groups = set()
    for _seq, status, group in settled:
        if status == "pending":
            continue  # a retry is scheduled; the tick dispatches it when due
        if group is None or status == "failed":
            should_wake = True
        else:
            groups.add(group)
    if should_wake:
        wake_run(run_id)
    elif groups:
        wake_when_fan_settled(run_id, groups)  # after the commit, so concurrent settles cannot both miss it
    return settled
