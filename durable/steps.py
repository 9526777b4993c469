"""The queued-step worker: claim a chunk of one run's queued steps, run them, settle them.

A chunk (up to DURABLE_FAN_CHUNK steps) is claimed in one statement, which arms each step's
silence clock. The worker then runs the steps one after another and flushes (settles what
finished and re-arms the clocks of the steps still queued behind) whenever a third of the
shortest timeout or a second has passed, so a slow chunk never holds finished results and a
step never times out while it waits its turn in a live worker. A running step's persisted
heartbeat re-arms the queued ones too. A step that timed out meanwhile was handed to another
worker: the flush reports it gone and this worker skips it.
"""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings as django_settings

from durable import store
from durable.codec import decode, encode
from durable.context import backoff_delay, error_payload, now
from durable.errors import DurableError
from durable.registry import resolve_callable
from durable.settings import durable_settings
from durable.states import StepStatus


@dataclass
class _StepScope:
    step_id: int
    attempt: int
    timeout: float | None
    queued: list = field(default_factory=list)  # (id, attempt) of the chunk's steps not started yet
    last_persist: float = 0.0
    default_timeout: float = 300.0
    held: set | None = None


_current_step: contextvars.ContextVar[_StepScope | None] = contextvars.ContextVar("durable_step", default=None)


def default_step_timeout() -> float:
    return float(getattr(django_settings, "DURABLE_STEP_DEFAULT_TIMEOUT", 300.0))


def heartbeat(progress=None) -> None:
    """Report liveness (and optional JSON progress) from inside a step. Persisted at most every few
    seconds; each persisted heartbeat re-arms the step's timeout (and those of the steps queued
    behind it in the same chunk)."""
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
    held = store.step_heartbeat(step_id=scope.step_id, attempt=scope.attempt, timeout=scope.timeout,
                                progress_text=encode(progress) if progress is not None else "",
                                rearm=scope.queued, default_timeout=scope.default_timeout)
    if scope.queued:
        scope.held = held


def execute_steps(run_id: str, seqs: Sequence[int]) -> dict:
    """Claim, run and settle a chunk of one run's queued steps; the run is woken (in the settle's
    transaction) when its join allows.

    Claims are compare-and-set (pending -> running, attempt + 1) and settles are conditional on
    the checkpoint's id and attempt, so a redelivered message, a second worker or a retry of the
    run can never have a result settled twice or into the wrong attempt."""
    default_timeout = default_step_timeout()
    claimed = store.steps_claim(run_id, seqs, default_timeout)
    if not claimed:
        return {"claimed": 0, "settled": 0, "skipped": 0}
    timeouts = []
    for row in claimed:
        options = (json.loads(row[4]) if isinstance(row[4], str) else row[4]) or {}
        timeouts.append(float(options.get("timeout") or default_timeout))
    flush_every = min(1.0, min(timeouts) / 3)
    queued = [(row[0], row[5]) for row in claimed]  # (id, attempt) not started yet
    held = {row[0] for row in claimed}
    pending: list[tuple] = []
    settled = skipped = 0
    last_flush = time.monotonic()

    def flush():
        nonlocal pending, held, last_flush, settled
        rows, still_held = store.steps_settle(run_id, pending, rearm=queued, default_timeout=default_timeout)
        settled += len(rows)
        if queued:
            held = still_held
        pending = []
        last_flush = time.monotonic()

    for (step_id, seq, name, input_text, options, attempt, _group), timeout in zip(claimed, timeouts, strict=True):
        if time.monotonic() - last_flush >= flush_every:
            flush()  # settles what finished, re-arms this step and those behind it
        queued.pop(0)
        if step_id not in held:
            skipped += 1  # timed out while it waited here: another worker has it now
            continue
        options = (json.loads(options) if isinstance(options, str) else options) or {}
        scope = _StepScope(step_id, attempt, timeout, queued=list(queued), default_timeout=default_timeout)
        token = _current_step.set(scope)
        started = now()
        try:
            payload = decode(input_text, column="checkpoint.input", row=f"{run_id}#{seq}")
            if not isinstance(payload, dict) or "fn" not in payload:
                raise DurableError(f"step {name!r} has no readable input (undecodable payload)")
            result = resolve_callable(payload["fn"])(*payload.get("args", []))
            pending.append((step_id, attempt, StepStatus.COMPLETED, encode(result), "", None, started))
        except Exception as exc:
            error = encode(error_payload(exc))
            retries_left = int(options.get("retries", 0)) - (attempt - 1)
            if retries_left > 0:
                wake_at = now() + timedelta(seconds=backoff_delay(options, attempt))
                pending.append((step_id, attempt, StepStatus.PENDING, "", error, wake_at, started))
            else:
                pending.append((step_id, attempt, StepStatus.FAILED, "", error, None, started))
        finally:
            _current_step.reset(token)
        if scope.held is not None:
            held = scope.held | {step_id}
    if pending:
        flush()
    return {"claimed": len(claimed), "settled": settled, "skipped": skipped}
