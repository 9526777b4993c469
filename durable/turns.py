"""Turns: claim a run, replay its workflow from its checkpoints, and record where it got to.

Every exit of a turn ends its lease: a suspension releases the run (with its timer), an end
finishes it (a child reports to its parent in the same transaction), a lost lease is released
if this turn still holds it, a failed engine write gives the run back for a later turn
(counting a recovery attempt) and raises to the Celery task, which retries.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

import psycopg
from django.db import DatabaseError, connection

from config import telemetry
from config.logging import log_context
from durable import store
from durable.codec import decode, encode
from durable.context import Context, _Checkpoint
from durable.errors import (
    ContinueAsNew,
    EngineWriteFailed,
    LeaseLost,
    NonDeterminismError,
    Suspend,
    TurnInterrupted,
    UnknownWorkflow,
    WorkflowMisuse,
    _ControlFlow,
    error_payload,
)
from durable.leases import lease_keeper, worker_token
from durable.registry import get_workflow
from durable.settings import durable_settings
from durable.states import RunStatus

logger = logging.getLogger("durable.engine")


class TurnOutcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    SUSPENDED = "suspended"
    CONTINUED = "continued"  # continue-as-new: a new history starts with the next turn
    NOT_CLAIMED = "not_claimed"  # ended, or another worker holds the lease
    LEASE_LOST = "lease_lost"  # cancelled or recovered while this turn ran: its writes were refused


@dataclass
class TurnResult:
    run_id: str
    outcome: str
    wake_at: datetime | None = None
    error: dict | None = None
    output: object = None
    redispatched: bool = False
    run_next: str | None = None  # a child this turn started that was sent no message (execute_turn)


FOLLOW_LIMIT = 8  # first turns of started children one worker runs after a turn, one after the other


def execute_turn(run_id: str, *, follow: bool = True) -> TurnResult:
    """Claim the run, replay its workflow from its checkpoints, and record where it got to. A turn that
    started a child (``ctx.child``, which sends no message for it) is followed, in this process, by the
    child's first turn, and so on down a chain of such children (at most FOLLOW_LIMIT, the last one sent
    a message instead): the child's work begins at once instead of behind every message queued before it
    (an eval lane's item, behind the other lanes). A crash before the child's turn leaves it pending
    with wake_pending, which the tick's lost-wake pass sends; a child's turn that failed is given back
    by its own turn and never fails the one that started it. A turn that replays to a child that has
    not had its first turn yet (this turn's earlier try was given back after the child's insert
    committed) follows it too: only a child's first turn is claimed so. `follow=False` runs this turn
    only (the child then waits for the lost-wake pass)."""
    result = _execute_turn(run_id)
    child = result.run_next if follow else None
    for _ in range(FOLLOW_LIMIT):
        if child is None:
            return result
        try:
            child = _execute_turn(child, first=True).run_next
        except Exception as exc:  # given back by its turn, or its lease expires and the recovery pass takes it
            logger.warning("durable: run %s: the first turn of its child %s failed here (%s: %s); the engine "
                           "retries it", run_id, child, type(exc).__name__, exc, exc_info=True)
            return result
    if child is not None:
        store.run_wake(child)
    return result


def _execute_turn(run_id: str, *, first: bool = False) -> TurnResult:
    settings = durable_settings()
    token = worker_token()
    cursor = store.raw_cursor()
    claimed = store.run_claim(cursor, run_id, token, settings.lease_seconds, first=first)
    if claimed is None:
        return TurnResult(run_id, TurnOutcome.NOT_CLAIMED)
    workflow_name, input_text, namespace, priority, tags, turns, parent_id, epoch, fence, trace_context = claimed
    lease_keeper.hold(run_id, token)
    try:
        with log_context(run_id=run_id, namespace=namespace), telemetry.durable_turn(
                run_id=run_id, workflow=workflow_name, trace_context=trace_context) as traced:
            return traced.ended(_turn(run_id, token, cursor, workflow_name, input_text, namespace, priority, tags,
                                      turns, bool(parent_id), epoch, fence))
    except (DatabaseError, psycopg.Error, EngineWriteFailed) as exc:
        cause = exc.cause if isinstance(exc, EngineWriteFailed) else exc
        _interrupted(run_id, token, cause)
    finally:
        lease_keeper.release(run_id)


def _turn(run_id, token, cursor, workflow_name, input_text, namespace, priority, tags, turns, has_parent,
          epoch, fence) -> TurnResult:
    checkpoints = {}
    if turns > 1:  # the first claim of a history: nothing can have been checkpointed yet
        rows = store.checkpoints_for_replay(cursor, run_id)
        checkpoints = {row[0]: _Checkpoint(row) for row in rows if row[-1] == fence}
        if len(checkpoints) != len(rows):  # late writes of an abandoned history
            store.checkpoints_drop_stale(run_id=run_id, token=token, fence=fence)
    try:
        definition = get_workflow(workflow_name)
    except UnknownWorkflow as exc:
        return _finish(run_id, token, RunStatus.FAILED, error=error_payload(exc), has_parent=has_parent)
    ctx = Context(run_id=run_id, workflow=workflow_name, namespace=namespace, priority=priority,
                  checkpoints=checkpoints, tags=list(tags or []), token=token, epoch=epoch, fence=fence,
                  cursor=cursor)
    workflow_input = decode(input_text, column="run.input", row=run_id)
    output = raised = None
    try:
        output = definition.fn(ctx, workflow_input)
    except (Exception, _ControlFlow) as exc:
        raised = exc
    except BaseException:  # the process is going down (or a test says it died): nothing open may commit
        ctx.abort_open()
        raise
    # what the engine decided wins over what the workflow's code made of it (a swallowed suspension)
    stop = ctx._misuse or ctx._stopped or raised
    if isinstance(stop, LeaseLost | EngineWriteFailed | DatabaseError | psycopg.Error):
        # a turn that lost its run commits nothing more; after a failed statement its transaction cannot commit
        ctx.abort_open()
    # the turn's end commits with what the turn left open (context.py's module docstring)
    try:
        result = _end(run_id, token, stop, ctx, output, has_parent)
    except BaseException:
        ctx.abort_open()
        raise
    ctx.commit_open()
    result.run_next = ctx.run_next
    return result


def _end(run_id: str, token: str, stop, ctx: Context, output, has_parent: bool) -> TurnResult:
    """Record where the turn got to: suspended, ended, continued as new, or given back."""
    if isinstance(stop, Suspend) and ctx._misuse is None:
        return _release(run_id, token, stop.wake_at, wake_now=ctx.wake_now)
    if isinstance(stop, LeaseLost):
        logger.warning("durable: run %s: %s", run_id, stop)
        if store.run_release(run_id, token, None, wake_now=True) is None:
            return TurnResult(run_id, TurnOutcome.LEASE_LOST)
        return TurnResult(run_id, TurnOutcome.LEASE_LOST, redispatched=True)
    if isinstance(stop, EngineWriteFailed):
        raise stop
    if isinstance(stop, ContinueAsNew):
        if not store.run_continue_as_new(run_id, token, encode(stop.input)):
            return TurnResult(run_id, TurnOutcome.LEASE_LOST)
        return TurnResult(run_id, TurnOutcome.CONTINUED)
    if isinstance(stop, NonDeterminismError | WorkflowMisuse | Exception):
        return _finish(run_id, token, RunStatus.FAILED, error=error_payload(stop), has_parent=has_parent, ctx=ctx)
    try:
        encoded = encode(output)
    except (TypeError, ValueError) as exc:  # ValueError: a circular reference
        return _finish(run_id, token, RunStatus.FAILED, has_parent=has_parent, ctx=ctx, error=error_payload(
            TypeError(f"the workflow's return value is not JSON-serialisable: {exc}")))
    return _finish(run_id, token, RunStatus.COMPLETED, output=output, encoded_output=encoded, has_parent=has_parent,
                   ctx=ctx)


def _release(run_id: str, token: str, wake_at: datetime | None, *, wake_now: bool = False) -> TurnResult:
    redispatched = store.run_release(run_id, token, wake_at, wake_now=wake_now)
    if redispatched is None:
        return TurnResult(run_id, TurnOutcome.LEASE_LOST)
    return TurnResult(run_id, TurnOutcome.SUSPENDED, wake_at=wake_at, redispatched=redispatched)


def _finish(run_id: str, token: str, status: str, *, output=None, encoded_output: str | None = None,
            error: dict | None = None, has_parent: bool = True, ctx: Context | None = None) -> TurnResult:
    open_work = ctx is not None and ctx.has_open_work
    if open_work:
        assert ctx is not None
        # its end locks the run's descendants before the run (the lock order): nothing of the run may be held yet
        ctx.commit_open()
    row = store.run_finish(run_id, token, status, output_text=encoded_output if encoded_output is not None else "",
                           error_text=encode(error) if error else "", open_work=open_work, has_parent=has_parent)
    if row is None:
        # cancelled (or recovered by another worker) while this turn ran: never resurrect it
        return TurnResult(run_id, TurnOutcome.LEASE_LOST)
    return TurnResult(run_id, status, output=output, error=error)


def _interrupted(run_id: str, token: str, cause: BaseException) -> NoReturn:
    """An engine write failed mid-turn. Django's connection may be broken (the raw cursors bypass its
    error tracking), so it is closed; the run is given back with a short delay and a recovery
    attempt counted, and the task is told to retry. If the database is down the release fails too:
    the lease expires and the tick's recovery pass takes the run."""
    logger.warning("durable: run %s: an engine write failed (%s: %s); the turn will be retried", run_id,
                   type(cause).__name__, cause)
    if not connection.in_atomic_block:
        connection.close()
    settings = durable_settings()
    try:
        store.run_release_aborted(run_id, token, delay_seconds=1.0, max_attempts=settings.max_recovery_attempts,
                                  error_text=encode({"type": "RecoveryExhausted",
                                                     "message": f"engine writes kept failing: {cause}"}))
    except (DatabaseError, psycopg.Error):
        if not connection.in_atomic_block:
            connection.close()
    raise TurnInterrupted(f"run {run_id}: engine write failed: {type(cause).__name__}: {cause}") from cause
