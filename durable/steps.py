"""The queued-step worker: claim a chunk of one run's queued steps, run them, settle them.

A chunk (up to DURABLE_FAN_CHUNK steps) is claimed in one statement, which arms each step's
silence clock (with a grace of the keeper's period). The worker runs the steps one after
another; the process's keeper thread (``durable.leases``) re-arms the clocks of the chunk's
steps that are not running (queued, or finished with the result not saved yet), so a step
never times out while it waits in a live worker and starts with its whole allowance. The
running step's clock is re-armed only by its heartbeats. Results are saved whenever a second
has passed since the last save and at the end of the chunk. A step that timed out before the
keeper reached it was handed to another worker: this worker skips it.

A step that raises ``TryLater`` is put off: back to pending with its wake time, the reason in its
error, its deferrals counted in its options (none of its retries spent). Everything here is per
call or per thread (the step's scope is a context variable, the chunk's clocks are the keeper's,
under its lock), so a threads pool may run many chunks of a process at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, OperationalError, connection, transaction
from django.utils.timezone import now

from config import telemetry
from config.logging import log_context
from durable import store
from durable.codec import decode, encode
from durable.errors import DurableError, StepAbandoned, TryLater, error_payload
from durable.leases import keeper
from durable.registry import resolve_callable
from durable.retry import failed_tries, retry_at
from durable.settings import durable_settings
from durable.states import StepStatus

logger = logging.getLogger("durable.engine")


@dataclass
class _StepScope:
    step_id: int
    attempt: int
    timeout: float | None
    last_persist: float = 0.0
    deferrals: dict | None = None


_current_step: contextvars.ContextVar[_StepScope | None] = contextvars.ContextVar("durable_step", default=None)

SAVE_EVERY_SECONDS = 1.0


def heartbeat(progress=None) -> None:
    """Report liveness (and optional JSON progress) from inside a step. Persisted at most every few
    seconds; each persisted heartbeat re-arms the step's timeout. A persisted heartbeat that finds the
    step no longer running as this attempt (its run cancelled, its clock run out and the step handed to
    another worker) raises StepAbandoned: the step stops, as a Temporal activity's heartbeat does."""
    scope = _current_step.get()
    if scope is None:  # inline steps: the turn's lease keeper already vouches for liveness
        return
    interval = durable_settings().heartbeat_persist_seconds
    if scope.timeout:
        interval = min(interval, scope.timeout / 3)
    clock = time.monotonic()
    if clock - scope.last_persist < interval:
        return
    scope.last_persist = clock
    # inside the step's own transaction, a savepoint: a refused write then leaves that transaction usable
    savepoint = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with savepoint:
            held = store.step_heartbeat(step_id=scope.step_id, attempt=scope.attempt, timeout=scope.timeout,
                                        progress_text=encode(progress) if progress is not None else "")
    except DatabaseError as exc:
        # the step's own work is fine: a heartbeat that could not be written is only a missed one (if they
        # keep failing, the step's clock runs out and the tick hands it to another worker)
        logger.warning("durable: step %s: a heartbeat could not be written (%s)", scope.step_id, exc)
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        return
    if not held:
        raise StepAbandoned(f"step {scope.step_id} (attempt {scope.attempt}) is no longer running as this "
                            "attempt: its run ended or another worker has it")


def wait_alive(seconds: float) -> None:
    """Sleep inside a step for `seconds`, heartbeating as it goes: a step that waits (a provider's
    Retry-After, a backoff) stays alive to the tick, so its clock does not run out and hand it to another
    worker while this one is still on it. Outside a queued step it only sleeps."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        heartbeat()
        time.sleep(min(left, 1.0))
    heartbeat()


def deferrals(kind: str) -> int:
    """How many times the running queued step was put off by a ``TryLater`` of `kind` (0 outside one)."""
    scope = _current_step.get()
    return int((scope.deferrals or {}).get(kind, 0)) if scope is not None else 0


def release_connection() -> None:
    """Give this thread's database connection back (to the process's pool) before a long wait outside
    the database, such as a provider's HTTP latency: a threads pool of many steps then needs only as many
    connections as are doing database work at once. Only in a queued step, outside a transaction (a
    turn keeps its connection: its cursors are on it; a test's transaction must stay open); the next
    query takes one again."""
    if _current_step.get() is not None and not connection.in_atomic_block:
        connection.close()


def execute_steps(run_id: str, seqs: Sequence[int]) -> dict:
    """Claim, run and settle a chunk of one run's queued steps; the run is woken (in the settle's
    transaction) when its join allows.

    Claims are compare-and-set (pending -> running, attempt + 1) and settles are conditional on
    the checkpoint's id and attempt, so a redelivered message, a second worker or a retry of the
    run can never have a result settled twice or into the wrong attempt."""
    with log_context(run_id=run_id):
        return _execute_steps(run_id, seqs)


def _execute_steps(run_id: str, seqs: Sequence[int]) -> dict:
    default_timeout = durable_settings().step_default_timeout
    claimed = store.steps_claim(run_id, seqs, default_timeout)
    if not claimed:
        return {"claimed": 0, "settled": 0, "skipped": 0}
    options = [(json.loads(row[4]) if isinstance(row[4], str) else row[4]) or {} for row in claimed]
    timeouts = [float(option.get("timeout") or default_timeout) for option in options]
    # the keeper re-arms clocks on its own connection, which sees the claim only once it is committed
    # (not inside a caller's transaction, as in a test driving steps in-process)
    chunk = keeper.hold_chunk([(row[0], row[5]) for row in claimed], period=store.clock_grace(min(timeouts)),
                              kept=not connection.in_atomic_block)
    pending: list[tuple] = []
    settled = skipped = 0
    last_save = time.monotonic()
    trace_context = _trace_context(run_id) if telemetry.tracing() else ""

    def save():
        nonlocal pending, last_save, settled
        rows = _settle_with_retries(run_id, pending)
        keeper.chunk_saved(chunk, [row[0] for row in pending])
        settled += len(rows)
        pending = []
        last_save = time.monotonic()

    try:
        for (step_id, seq, name, input_text, _options, attempt, _group), step_options, timeout in zip(
                claimed, options, timeouts, strict=True):
            if pending and time.monotonic() - last_save >= SAVE_EVERY_SECONDS:
                save()
            if not keeper.chunk_start(chunk, step_id):
                skipped += 1  # timed out while it waited here: another worker has it now
                continue
            with telemetry.durable_step(run_id=run_id, name=name, attempt=attempt,
                                        trace_context=trace_context) as traced:
                settlement = _run_step(run_id, step_id, seq, name, input_text, step_options, attempt, timeout)
                traced.ended(settlement[2] if settlement is not None else "abandoned", error=_traced_error(settlement))
            if settlement is None:
                skipped += 1  # abandoned: its run ended or another worker has it
                continue
            pending.append(settlement)
            keeper.chunk_waiting(chunk, step_id, attempt)
        if pending:
            save()
    finally:
        keeper.release_chunk(chunk)
    return {"claimed": len(claimed), "settled": settled, "skipped": skipped}


def _trace_context(run_id: str) -> str:
    """The run's stored traceparent: its steps continue its trace, whoever dispatched them (a turn, the tick)."""
    from durable.models import DurableRun  # durable/__init__ imports this module before the apps are ready

    return DurableRun.objects.filter(pk=run_id).values_list("trace_context", flat=True).first() or ""


def _traced_error(settlement: tuple | None):
    """A settlement's error (a failed attempt, retried or not) for its span's status; a put-off step (TryLater)
    did not fail. Only decoded with tracing on."""
    if settlement is None or not settlement[4] or not telemetry.tracing():
        return ""
    error = decode(settlement[4], column="checkpoint.error", row=str(settlement[0])) or ""
    return "" if isinstance(error, dict) and error.get("type") == "TryLater" else error


def _settle_with_retries(run_id: str, pending: list[tuple], attempts: int = 3) -> list[tuple]:
    """Save results, retrying a transient database error (a lock timeout, a dropped connection) a few
    times: the steps' work is done, and giving up means running them again after their timeout."""
    for attempt in range(1, attempts):
        try:
            return store.steps_settle(run_id, pending)
        except OperationalError:
            if connection.in_atomic_block:
                raise
            logger.warning("durable: saving %d results of run %s failed; retrying", len(pending), run_id)
            connection.close_if_unusable_or_obsolete()
            time.sleep(0.2 * 2 ** (attempt - 1))
    return store.steps_settle(run_id, pending)


def _run_step(run_id, step_id, seq, name, input_text, options, attempt, timeout) -> tuple | None:
    """Run one claimed step; returns its settlement (id, attempt, status, output, error, retry_at, started,
    options patch), or None when a heartbeat found it abandoned (nothing to save)."""
    scope = _StepScope(step_id, attempt, timeout, deferrals=options.get("deferrals"))
    token = _current_step.set(scope)
    started = now()
    # a step that ran after being put off starts a new spell: its next deferral counts from then
    patch = json.dumps({"deferred_since": None}) if options.get("deferred_since") else None
    try:
        payload = decode(input_text, column="checkpoint.input", row=f"{run_id}#{seq}")
        if not isinstance(payload, dict) or "fn" not in payload:
            raise DurableError(f"step {name!r} has no readable input (undecodable payload)")
        result = resolve_callable(payload["fn"])(*payload.get("args", []))
        return (step_id, attempt, StepStatus.COMPLETED, encode(result), "", None, started, patch)
    except TryLater as exc:
        return _put_off(step_id, attempt, options, exc, started)
    except StepAbandoned as exc:
        logger.info("durable: run %s step %s stopped: %s", run_id, name, exc)
        return None
    except Exception as exc:
        error = encode(error_payload(exc))
        wake_at = retry_at(options, failed_tries(options, attempt))
        if wake_at is not None:
            return (step_id, attempt, StepStatus.PENDING, "", error, wake_at, started, patch)
        return (step_id, attempt, StepStatus.FAILED, "", error, None, started, patch)
    finally:
        _current_step.reset(token)


def _put_off(step_id, attempt, options, exc: TryLater, started) -> tuple:
    """The settlement of a step that raised TryLater: pending until `exc.after` from now, or failed once
    it has been put off for longer than DURABLE_STEP_MAX_DEFER_SECONDS in a row."""
    clock = now()
    since = datetime.fromisoformat(options["deferred_since"]) if options.get("deferred_since") else clock
    limit = durable_settings().step_max_defer_seconds
    waited = (clock - since).total_seconds()
    if waited + exc.after > limit:
        error = encode({"type": "PutOffTooLong", "message": (
            f"put off for {waited:.0f} s in a row, and the next try would pass DURABLE_STEP_MAX_DEFER_SECONDS "
            f"({limit:g} s): {exc.reason}")})
        return (step_id, attempt, StepStatus.FAILED, "", error, None, started, None)
    counts = dict(options.get("deferrals") or {})
    counts[exc.kind] = int(counts.get(exc.kind, 0)) + 1
    wake_at = clock + timedelta(seconds=exc.after)
    error = encode({"type": "TryLater", "kind": exc.kind, "message": exc.reason, "until": wake_at.isoformat()})
    patch = json.dumps({"deferrals": counts, "deferred_since": since.isoformat()})
    return (step_id, attempt, StepStatus.PENDING, "", error, wake_at, started, patch)
