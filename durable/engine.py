"""The durable engine's public surface, gathered from the modules that implement it.

A workflow is a registered function ``fn(ctx, input)``. Running it is a series of turns:
each turn replays the function from the top, every ``ctx`` call takes the next sequence
number and is answered from its checkpoint when one exists. A call with no checkpoint does
its work and writes one; a call that must wait (a queued step, a sleep, a signal, a child,
a fan) suspends the turn. The next wake (a settled step, a due timer, a signal) triggers
the next turn.

- ``durable.context``: the ``ctx`` API (steps, values, timers, waits, children, fans);
- ``durable.turns``: claiming, replaying, releasing and finishing a turn;
- ``durable.steps``: the queued-step worker and heartbeats;
- ``durable.leases``: lease tokens and the keeper thread that renews them;
- ``durable.store``: every statement that changes a run's or a step's status;
- ``durable.dispatch``: turn and step messages, sent after commit.

Ownership is decided in Postgres, never in worker memory: a turn holds a lease on its run,
every checkpoint is unique per (run, seq) and written only while the lease holds, every
settle is a compare-and-set on a value that never repeats. A worker that lost its lease can
execute a step twice (at-least-once) but can never checkpoint it twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable import store
from durable.codec import encode
from durable.context import Child, Context, Step
from durable.dispatch import dispatch_steps, dispatch_turn
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
    TurnInterrupted,
    WorkflowMisuse,
    error_payload,
)
from durable.retry import backoff_delay
from durable.steps import execute_steps, heartbeat
from durable.store import (
    ATTR_TABLE,
    CLAIM_SQL,
    CP_TABLE,
    EVENT_TABLE,
    FAN_PENDING_SQL,
    INSERT_DONE_SQL,
    REPLAY_SQL,
    RUN_TABLE,
    SIGNAL_TABLE,
    WAITER_TABLE,
    checkpoint_row,
    descendant_run_ids,
    fan_has_pending,
    lock_event,
    lock_signal,
    raw_cursor,
    upsert_attributes,
)
from durable.store import checkpoints_insert as insert_checkpoints
from durable.store import run_wake as wake_run
from durable.store import steps_settle as settle_steps
from durable.turns import TurnOutcome, TurnResult, execute_turn

__all__ = [
    "ATTR_TABLE",
    "CLAIM_SQL",
    "CP_TABLE",
    "EVENT_TABLE",
    "FAN_PENDING_SQL",
    "INSERT_DONE_SQL",
    "REPLAY_SQL",
    "RUN_TABLE",
    "SIGNAL_TABLE",
    "WAITER_TABLE",
    "Child",
    "ChildFailed",
    "Context",
    "ContinueAsNew",
    "DurableError",
    "EngineWriteFailed",
    "FanFailed",
    "LeaseLost",
    "NonDeterminismError",
    "Step",
    "StepFailed",
    "Suspend",
    "TurnInterrupted",
    "TurnOutcome",
    "TurnResult",
    "WorkflowMisuse",
    "backoff_delay",
    "checkpoint_row",
    "create_run",
    "descendant_run_ids",
    "dispatch_steps",
    "dispatch_turn",
    "error_payload",
    "execute_steps",
    "execute_turn",
    "fan_has_pending",
    "heartbeat",
    "insert_checkpoints",
    "lock_event",
    "lock_signal",
    "raw_cursor",
    "settle_steps",
    "upsert_attributes",
    "wake_run",
]


def create_run(*, run_id: str, workflow: str, input=None, namespace: str = "default", tags: Sequence[str] = (),
               priority: int = 0, parent_id: str | None = None, parent_seq: int | None = None,
               dispatch: bool = True) -> bool:
    """Insert a pending run (idempotent on its id) and dispatch its first turn after commit.
    Returns False when a run with this id already exists."""
    return store.run_insert(run_id=run_id, workflow=workflow, input_text=encode(input), namespace=namespace,
                            tags=tags, priority=priority, parent_id=parent_id, parent_seq=parent_seq,
                            dispatch=dispatch)
