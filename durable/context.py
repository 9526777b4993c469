"""The ``ctx`` API a workflow function uses; every call is checkpointed and replayed.

Each call takes the next sequence number and is answered from its checkpoint when one exists;
otherwise it does its work and writes one (through ``durable.store``, fenced by the turn's
lease). A call that must wait raises ``Suspend``, which ends the turn.

A ``ctx`` call refuses to run inside the workflow's own ``transaction.atomic()`` (a wait there
would roll back its own checkpoint and loop) and after the turn stopped (a ``finally`` or an
``except BaseException`` around a wait): both fail the run with a clear error instead.

The turn's open transaction. Consecutive ``ctx.transaction`` calls and queued-step starts, and the
turn's end (its release, or the run's end), commit together: one commit where each took its own (a
workflow's node end, the next node's start and its model call, then the suspension). Any other ``ctx``
call commits what is open first, so work outside the database (an inline step, a side effect) never
runs with uncommitted checkpoints before it, and no wait, child or fan takes locks inside it. A turn
that dies before that commit leaves none of it: the next turn replays to the first of them and does
them again, once (their writes and checkpoints were one transaction, as each was on its own).
"""

from __future__ import annotations

import contextlib
import functools
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from django.db import DatabaseError, DataError, connection, transaction
from django.utils.timezone import now

from durable import store
from durable.codec import decode, encode
from durable.dispatch import dispatch_steps
from durable.errors import (
    ChildFailed,
    ContinueAsNew,
    DurableError,
    EngineWriteFailed,
    FanFailed,
    LeaseLost,
    NonDeterminismError,
    StepFailed,
    Suspend,
    WorkflowMisuse,
    _ControlFlow,
    error_payload,
)
from durable.leases import lease_keeper
from durable.registry import callable_path, get_workflow
from durable.retry import NO_RETRIES, retry_at, step_options
from durable.settings import durable_settings
from durable.states import RunStatus, StepStatus
from durable.steps import heartbeat
from durable.store import checkpoint_row

_Exc = TypeVar("_Exc", bound=BaseException)

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


def _user_error(exc: BaseException) -> BaseException:
    # an exception raised by the workflow's own function, passing through a ctx call: never
    # mistaken for a failed engine write, whatever its type
    with contextlib.suppress(AttributeError):
        exc._durable_user_error = True  # pyright: ignore[reportAttributeAccessIssue]: a mark on this exception object, read with getattr
    return exc


def ctx_call(method):
    """Guard a public ctx method: refuse misuse, stop after a lost lease, and turn a failed engine
    statement into EngineWriteFailed (which workflow code cannot catch)."""

    @functools.wraps(method)
    def call(self: Context, *args, **kwargs):
        if self._stopped is not None:
            raise self._misused(WorkflowMisuse(
                f"ctx.{method.__name__}() was called after the turn stopped at "
                f"{type(self._stopped).__name__}: a `finally` or `except BaseException` around a ctx call must not "
                "call ctx again (suspension is an exception that ends the turn)"))
        if len(connection.atomic_blocks) > self._atomic_depth + (self._open is not None):
            raise self._misused(WorkflowMisuse(
                f"ctx.{method.__name__}() was called inside the workflow's own transaction.atomic(): a wait there "
                "would roll back its own checkpoint. Use ctx.transaction(name, fn) for database writes that must "
                "commit with a checkpoint"))
        if lease_keeper.lost(self.token):
            raise self._stop(LeaseLost(f"the lease on run {self.run_id} was lost"))
        try:
            if method.__name__ not in _JOIN_OPEN:
                self.commit_open()
            return method(self, *args, **kwargs)
        except _ControlFlow as exc:
            raise self._stop(exc) from None
        except (DatabaseError, psycopg.Error) as exc:
            if getattr(exc, "_durable_user_error", False):
                raise
            if isinstance(exc, DataError | psycopg.DataError) or _sqlstate(exc).startswith("22"):
                # a value Postgres cannot store (a NUL character, a number out of range): the workflow's
                # own input, so an error it can handle, not an outage to retry. The turn's open transaction goes
                # on when the refused write was undone alone (ctx.transaction's savepoint, a value psycopg refused
                # before sending it); one Postgres aborted is rolled back, what it held done again by the next
                # turn's replay
                if _transaction_aborted():
                    self.abort_open()
                raise ValueError(f"ctx.{method.__name__}(): the database refused a value: {exc}") from exc
            raise self._stop(EngineWriteFailed(exc)) from exc

    return call


# the ctx calls whose writes may join the turn's open transaction (``Context.step`` commits it before an
# inline step runs)
_JOIN_OPEN = frozenset({"transaction", "step"})


def _transaction_aborted() -> bool:
    raw = connection.connection
    return connection.needs_rollback or (
        raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR)


def _sqlstate(exc: BaseException) -> str:
    for candidate in (exc, exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return state
    return ""


class _Aborted(Exception):
    """Handed to the open transaction's exit to roll it back."""


class _Checkpoint:
    """A checkpoint as a replay reads it (a row of ``store.checkpoints_for_replay``)."""

    __slots__ = ("attempt", "child_run_id", "error", "fence", "group", "kind", "name", "output", "queue", "seq",
                 "status", "wake_at")

    def __init__(self, row):
        (self.seq, self.name, self.kind, self.status, self.output, self.error, self.group, self.attempt,
         self.wake_at, self.queue, self.child_run_id, self.fence) = row


class Context:
    """The API a workflow function uses. Every call is checkpointed and replayed deterministically."""

    def __init__(self, *, run_id: str, workflow: str, namespace: str, priority: int,
                 checkpoints: dict[int, _Checkpoint], tags: list[str], token: str = "", epoch: int = 0,
                 fence: int = 0, cursor: psycopg.Cursor | None = None):
        self.run_id = run_id
        self.workflow = workflow
        self.namespace = namespace
        self.priority = priority
        self.tags = tags
        self.token = token
        self.epoch = epoch
        self.fence = fence
        self._checkpoints = checkpoints
        self._seq = 0
        self._cursor = cursor
        self._atomic_depth = len(connection.atomic_blocks)
        self._open: transaction.Atomic | None = None  # the turn's open transaction (module docstring)
        self._stopped: BaseException | None = None
        self._misuse: WorkflowMisuse | None = None
        self._wrote_open = False
        self.wake_now = False  # a checkpoint settled as it was written (a child that had ended): turn again
        self.run_next: str | None = None  # the child whose first turn this worker runs after this turn (child())

    # -- internals

    @property
    def cursor(self) -> psycopg.Cursor:
        if self._cursor is None or self._cursor.closed:
            self._cursor = store.raw_cursor()
        return self._cursor

    @property
    def has_open_work(self) -> bool:
        """Whether this history may hold open checkpoints or children (the run's end must close them)."""
        return self._wrote_open or any(cp.status in StepStatus.OPEN or cp.kind == "child"
                                       for cp in self._checkpoints.values())

    def join_open(self) -> bool:
        """Join the turn's open transaction, opening it when there is none; True when it was opened now."""
        if self._open is not None:
            return False
        self._open = opened = transaction.atomic()
        opened.__enter__()
        return True

    def commit_open(self) -> None:
        """Commit the turn's open transaction, if any (its on-commit messages are sent then)."""
        if self._open is not None:
            opened, self._open = self._open, None
            opened.__exit__(None, None, None)

    def abort_open(self) -> None:
        """Roll back the turn's open transaction, if any: nothing of it happened."""
        if self._open is not None:
            opened, self._open = self._open, None
            with contextlib.suppress(DatabaseError, psycopg.Error):  # a broken connection rolls back by itself
                opened.__exit__(_Aborted, _Aborted(), None)

    def _stop(self, exc: _Exc) -> _Exc:
        if self._stopped is None:
            self._stopped = exc
        return exc

    def _misused(self, exc: WorkflowMisuse) -> WorkflowMisuse:
        if self._misuse is None:
            self._misuse = exc
        return self._stop(exc)

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

    def _refused(self, seq: int) -> LeaseLost:
        return LeaseLost(f"checkpoint {self.run_id}#{seq} was refused: the turn no longer holds the run's lease")

    def _record(self, seq: int, name: str, kind: str, value, *, started: datetime | None = None,
                attempt: int = 1, leased: bool = False) -> None:
        """Write a completed checkpoint. `leased` for a record that commits with other effects (see
        ``store.checkpoint_record``)."""
        if not store.checkpoint_record(self.cursor, run_id=self.run_id, token=self.token, fence=self.fence, seq=seq,
                                       name=name, kind=kind, output_text=encode(value), attempt=attempt,
                                       started=started or now(), leased=leased):
            raise self._refused(seq)

    def _insert(self, rows: list[tuple]) -> None:
        rows = [(*row[:-1], self.fence) for row in rows]  # stamped with this history's fence
        if store.checkpoints_insert(self.cursor, rows, token=self.token) != len(rows):
            raise self._refused(rows[0][1])
        self._wrote_open = self._wrote_open or any(row[4] == StepStatus.PENDING or row[3] == "child" for row in rows)

    def _settle(self, seq: int, status: str, **fields) -> bool:
        return store.checkpoint_settle(run_id=self.run_id, token=self.token, seq=seq, status=status, **fields)

    def _row(self, checkpoint: _Checkpoint, column: str) -> Any:
        return decode(getattr(checkpoint, column), column=f"checkpoint.{column}", row=f"{self.run_id}#{checkpoint.seq}")

    def _failed(self, checkpoint: _Checkpoint, cls=StepFailed) -> StepFailed:
        return cls(checkpoint.name, self._row(checkpoint, "error"))

    # -- steps

    @ctx_call
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
            if checkpoint.status == StepStatus.COMPLETED:
                return self._row(checkpoint, "output")
            if checkpoint.status == StepStatus.FAILED:
                raise self._failed(checkpoint)
            if checkpoint.queue:
                raise Suspend()
            # an inline step waiting for its retry
            if checkpoint.wake_at is not None and checkpoint.wake_at > now():
                raise Suspend(checkpoint.wake_at)
            options = step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout)
            self.commit_open()
            return self._run_inline(seq, name, fn, args, options, previous_attempt=checkpoint.attempt)
        if not retries and timeout is None and not queue:
            options = NO_RETRIES
        else:
            options = step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout)
        if queue:
            self._enqueue(seq, name, fn, args, queue, options)
            raise Suspend()
        self.commit_open()
        return self._run_inline(seq, name, fn, args, options, previous_attempt=None)

    def _run_inline(self, seq, name, fn, args, options, *, previous_attempt: int | None):
        attempt = (previous_attempt or 0) + 1
        started = now()
        try:
            result = fn(*args)  # inline: the turn's lease keeper vouches for liveness, heartbeats are no-ops
        except Exception as exc:
            return self._inline_failed(seq, name, exc, options, attempt, previous_attempt)
        if previous_attempt is None:
            self._record(seq, name, "step", result, started=started, attempt=attempt)
        elif not self._settle(seq, StepStatus.COMPLETED, output_text=encode(result), attempt=previous_attempt,
                              set_attempt=attempt):
            raise self._refused(seq)
        return result

    def _inline_failed(self, seq, name, exc, options, attempt, previous_attempt):
        error = encode(error_payload(exc))
        wake_at = retry_at(options, attempt)
        status = StepStatus.PENDING if wake_at else StepStatus.FAILED
        if previous_attempt is None:
            self._insert([checkpoint_row(self.run_id, seq, name, "step", options=options, attempt=attempt,
                                         wake_at=wake_at, error=error, status=status, started_at=now(),
                                         completed_at=None if wake_at else now())])
        elif not self._settle(seq, status, error_text=error, attempt=previous_attempt, set_attempt=attempt,
                              wake_at=wake_at):
            raise self._refused(seq)
        if wake_at:
            raise Suspend(wake_at) from None
        raise StepFailed(name, decode(error)) from exc

    def _enqueue(self, seq, name, fn, args, queue, options) -> None:
        redispatch = now() + timedelta(seconds=durable_settings().redispatch_after_seconds)
        payload = encode({"fn": callable_path(fn), "args": list(args)})
        self.join_open()  # the turn suspends next: the step's start commits with the turn's end
        self._insert([checkpoint_row(self.run_id, seq, name, "step", input=payload, queue=queue, options=options,
                                     wake_at=redispatch)])
        dispatch_steps(self.run_id, [seq], queue, self.priority)

    @ctx_call
    def transaction(self, name: str, fn: Callable, *args):
        """Run `fn(*args)` and write its checkpoint in one database transaction: its writes happen
        exactly once, whatever crashes or retries happen around it. That transaction is the turn's open
        one (module docstring): it commits with the next ones and the turn's end, or before any other
        ctx call."""
        seq, checkpoint = self._next(name, "step")
        if checkpoint is not None:
            if checkpoint.status == StepStatus.COMPLETED:
                return self._row(checkpoint, "output")
            raise self._failed(checkpoint)
        started = now()
        opened = self.join_open()
        try:
            # a savepoint when the open transaction holds earlier writes: a failing fn undoes its own only
            with transaction.atomic(savepoint=not opened):
                try:
                    result = fn(*args)
                except BaseException as exc:
                    _user_error(exc)
                    raise
                self._record(seq, name, "step", result, started=started, leased=True)
        except BaseException:
            if opened:
                self.abort_open()
            raise
        return result

    # -- recorded values

    @ctx_call
    def now(self) -> datetime:
        """The current time, recorded once: a replay sees the same instant."""
        seq, checkpoint = self._next("now", "value")
        if checkpoint is not None:
            return datetime.fromisoformat(self._row(checkpoint, "output"))
        value = now()
        self._record(seq, "now", "value", value.isoformat())
        return value

    @ctx_call
    def uuid(self) -> uuid.UUID:
        """A random UUID, recorded once."""
        seq, checkpoint = self._next("uuid", "value")
        if checkpoint is not None:
            return uuid.UUID(self._row(checkpoint, "output"))
        value = uuid.uuid4()
        self._record(seq, "uuid", "value", str(value))
        return value

    @ctx_call
    def side_effect(self, fn: Callable, *args, name: str = "side_effect"):
        """Run a non-deterministic `fn` once and record its JSON result for every replay."""
        seq, checkpoint = self._next(name, "value")
        if checkpoint is not None:
            return self._row(checkpoint, "output")
        try:
            value = fn(*args)
        except BaseException as exc:
            _user_error(exc)
            raise
        self._record(seq, name, "value", value)
        return value

    def random(self, seed_name: str = "random") -> random.Random:
        """A random generator seeded once and recorded, so a resumed run makes the same choices."""
        seed = self.side_effect(lambda: random.getrandbits(63), name=seed_name)
        return random.Random(seed)

    @ctx_call
    def set_attributes(self, attributes: dict) -> None:
        """Set search attributes (filterable in the list: eq/ne/gt/gte/lt/lte), once per call site."""
        seq, checkpoint = self._next("set_attributes", "value")
        if checkpoint is not None:
            return
        with transaction.atomic():
            store.upsert_attributes(self.run_id, attributes)
            self._record(seq, "set_attributes", "value", sorted(attributes), leased=True)

    def heartbeat(self, progress=None) -> None:
        heartbeat(progress)

    @ctx_call
    def continue_as_new(self, input=None):
        """End this run's history and start it afresh with `input`, under the same run id: a loop
        that runs for ever (a schedule, an evolution) never replays an unbounded history. Does not
        return."""
        encode(input)  # refuse a value that cannot be stored, here, where the workflow can see it
        raise ContinueAsNew(input)

    # -- timers

    @ctx_call
    def sleep(self, seconds: float) -> None:
        """Suspend the run for `seconds`; no worker is held while it sleeps."""
        self._timer("sleep", now() + timedelta(seconds=max(0.0, float(seconds))))

    @ctx_call
    def sleep_until(self, when: datetime) -> None:
        self._timer("sleep", when)

    def _timer(self, name: str, wake_at: datetime) -> None:
        seq, checkpoint = self._next(name, "sleep")
        if checkpoint is not None:
            if checkpoint.status == StepStatus.COMPLETED:
                return
            if checkpoint.wake_at is None or checkpoint.wake_at <= now():
                if not self._settle(seq, StepStatus.COMPLETED, output_text=encode(None)):
                    raise self._refused(seq)
                return
            raise Suspend(checkpoint.wake_at)
        if wake_at <= now():
            self._record(seq, name, "sleep", None)
            return
        self._insert([checkpoint_row(self.run_id, seq, name, "sleep", wake_at=wake_at, started_at=now())])
        raise Suspend(wake_at)

    # -- signals and events

    @ctx_call
    def wait_for_signal(self, name: str, timeout: float | None = None, default=None):
        """Wait for the signal `name` sent to this run and return its payload (`default` on timeout).
        A signal sent before the wait is buffered and consumed here, never lost."""
        seq, checkpoint = self._next(name, "signal")
        if checkpoint is not None:
            return self._resolve_wait(seq, checkpoint, default)
        deadline = now() + timedelta(seconds=timeout) if timeout is not None else None
        with transaction.atomic():
            store.lock_signal(self.run_id, name)
            buffered = store.signal_take(self.run_id, name)
            if buffered is not None:
                payload = decode(buffered, column="signal.payload", row=self.run_id)
                self._record(seq, name, "signal", {"payload": payload}, leased=True)
                return payload
            self._wait(seq, name, "signal", name, {}, deadline)
        raise Suspend(deadline)

    @ctx_call
    def wait_for_event(self, name: str, match: dict | None = None, timeout: float | None = None, default=None):
        """Wait for an event `name` of this run's namespace whose payload contains `match` (JSON
        containment) and return the payload. An event published earlier with no waiter is buffered
        (until its TTL) and taken here."""
        match = match or {}
        seq, checkpoint = self._next(name, "event")
        if checkpoint is not None:
            return self._resolve_wait(seq, checkpoint, default)
        deadline = now() + timedelta(seconds=timeout) if timeout is not None else None
        with transaction.atomic():
            store.lock_event(self.namespace, name)
            payload = store.event_take(self.namespace, name, match)
            if payload is not None:
                self._record(seq, name, "event", {"payload": payload}, leased=True)
                return payload
            self._wait(seq, name, "event", name, match, deadline)
        raise Suspend(deadline)

    def _wait(self, seq, name, kind, key, match, deadline) -> None:
        self._insert([checkpoint_row(self.run_id, seq, name, kind, wake_at=deadline, started_at=now())])
        store.waiter_insert(run_id=self.run_id, seq=seq, kind=kind, key=key, match=match)

    def _resolve_wait(self, seq, checkpoint: _Checkpoint, default):
        if checkpoint.status == StepStatus.COMPLETED:
            value = self._row(checkpoint, "output") or {}
            return default if value.get("timed_out") else value.get("payload")
        if checkpoint.status == StepStatus.FAILED:
            raise self._failed(checkpoint)
        if checkpoint.wake_at is not None and checkpoint.wake_at <= now():
            with transaction.atomic():
                if checkpoint.kind == "signal":
                    store.lock_signal(self.run_id, checkpoint.name)
                else:
                    store.lock_event(self.namespace, checkpoint.name)
                if not self._settle(seq, StepStatus.COMPLETED, output_text=encode({"timed_out": True})):
                    # the signal won the race: read what it delivered
                    raise Suspend()
                store.waiter_delete(self.run_id, seq)
            return default
        raise Suspend(checkpoint.wake_at)

    # -- children and fans

    def child_id(self, seq: int) -> str:
        """A child's run id: stable across turns and plain retries, new for each history (epoch)."""
        return f"{self.run_id}/{seq}" if not self.epoch else f"{self.run_id}/{self.epoch}.{seq}"

    @ctx_call
    def child(self, workflow: str, input=None, *, name: str | None = None, tags: Sequence[str] = ()):
        """Start a child run of `workflow` and return its output once it completes (ChildFailed if not)."""
        label = name or workflow
        seq, checkpoint = self._next(label, "child")
        if checkpoint is not None:
            if checkpoint.status == StepStatus.COMPLETED:
                return self._row(checkpoint, "output")
            if checkpoint.status == StepStatus.FAILED:
                raise self._failed(checkpoint, ChildFailed)
            # a child sent no message may not have had its first turn (this turn's earlier try was given back)
            self.run_next = checkpoint.child_run_id or None
            raise Suspend()
        get_workflow(workflow)  # fail fast, in the parent, on an unknown name
        with transaction.atomic():
            row = self._child_row(seq, label, workflow, input, tags, group=None, dispatch=False)
            self._insert([row])
        # no message: the worker running this turn runs the child's first turn next (turns.execute_turn),
        # claiming it only if it has had none (a child that existed already, from a retry, may have)
        self.run_next = self.child_id(seq)
        raise Suspend()

    def _child_row(self, seq, label, workflow, input, tags, group, dispatch: bool = True) -> tuple:
        child_id = self.child_id(seq)
        created = store.run_insert(run_id=child_id, workflow=workflow, input_text=encode(input),
                                   namespace=self.namespace, tags=list(tags) or list(self.tags),
                                   priority=self.priority, parent_id=self.run_id, parent_seq=seq, dispatch=dispatch)
        if not created:
            # the child exists (a retry of this run): an ended child answers now, a live one reports when it ends
            existing = store.child_lock(child_id)
            if existing is not None and existing[3] != self.run_id:
                raise DurableError(f"cannot start child {child_id!r}: a run that is not this run's child has that id")
            if existing is not None and existing[0] in RunStatus.TERMINAL:
                status, output, error, _parent = existing
                self.wake_now = True
                if status == RunStatus.COMPLETED:
                    return checkpoint_row(self.run_id, seq, label, "child", child_run_id=child_id, group=group,
                                          status=StepStatus.COMPLETED, output=output, started_at=now(),
                                          completed_at=now())
                error = store.child_error_text(child_id, status, error)
                return checkpoint_row(self.run_id, seq, label, "child", child_run_id=child_id, group=group,
                                      status=StepStatus.FAILED, error=error, started_at=now(), completed_at=now())
        return checkpoint_row(self.run_id, seq, label, "child", child_run_id=child_id, group=group, started_at=now())

    @ctx_call
    def all(self, items: Iterable[Step | Child], *, mode: str = "wait_all", return_exceptions: bool = False) -> list:
        """Run steps and children in parallel and return their results in order.

        `mode="wait_all"` waits for every item, then raises FanFailed if any failed (or, with
        `return_exceptions=True`, puts the StepFailed in its place); `mode="fail_fast"` raises the
        first failure as soon as it settles (which one is recorded, so every replay raises the same).
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
        missing = [offset for offset, cp in enumerate(checkpoints) if cp is None]
        if missing:
            # a new fan, or items a retry dropped (they had failed): start what has no checkpoint
            self._start_fan(first, items, offsets=missing)
            raise Suspend()
        failures: dict[int, StepFailed] = {}
        waiting = False
        for index, cp in enumerate(checkpoints):
            if cp.status == StepStatus.FAILED:
                failures[index] = self._failed(cp, ChildFailed if cp.kind == "child" else StepFailed)
            elif cp.status != StepStatus.COMPLETED:
                waiting = True
        if mode == "fail_fast":
            recorded = self._checkpoints.get(self._seq)
            if recorded is not None and recorded.kind == "value" and recorded.name == "fail_fast":
                self._next("fail_fast", "value")
                index = self._row(recorded, "output")
                if index not in failures:
                    raise NonDeterminismError(f"fan at seq {first} recorded item {index} as its failure, "
                                              "but that item has not failed")
                raise failures[index]
            if failures:
                index = min(failures)
                seq, _ = self._next("fail_fast", "value")
                self._record(seq, "fail_fast", "value", index, leased=True)
                raise failures[index]
        if waiting:
            raise Suspend()
        results = [failures[i] if i in failures else self._row(cp, "output") for i, cp in enumerate(checkpoints)]
        if failures and not return_exceptions:
            raise FanFailed(failures, results)
        return results

    def _start_fan(self, first: int, items: list, *, offsets: list[int]) -> None:
        default_queue = durable_settings().default_step_queue
        rows, by_queue = [], {}
        redispatch = now() + timedelta(seconds=durable_settings().redispatch_after_seconds)
        with transaction.atomic():
            for offset in offsets:
                item = items[offset]
                seq = first + offset
                if isinstance(item, Step):
                    queue = item.queue or default_queue
                    options = step_options(item.retries, item.backoff, item.backoff_base, item.backoff_cap,
                                           item.jitter, item.timeout)
                    payload = encode({"fn": callable_path(item.fn), "args": list(item.args)})
                    rows.append(checkpoint_row(self.run_id, seq, item.name, "step", input=payload, queue=queue,
                                               options=options, group=first, wake_at=redispatch))
                    by_queue.setdefault(queue, []).append(seq)
                else:
                    get_workflow(item.workflow)
                    rows.append(self._child_row(seq, item.name or item.workflow, item.workflow, item.input,
                                                item.tags, group=first))
            self._insert(rows)
            for queue, seqs in by_queue.items():
                dispatch_steps(self.run_id, seqs, queue, self.priority)

