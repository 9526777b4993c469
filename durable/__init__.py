"""Lineage's durable execution engine: registered workflows replayed turn by turn from
step checkpoints in Postgres, executed by Celery workers. Knows nothing about agents.

This package is the one entry point for workflow authors: the ``ctx`` fan items (``Step``, ``Child``),
the errors a workflow may catch or raise, ``workflow`` to register one, and what a step may call
(``heartbeat``, ``wait_alive``, ``deferrals``, ``release_connection``). Operations on runs are the
services (``durable.services``: start, signal, cancel, retry...) and selectors (``durable.selectors``).

A workflow is a registered function ``fn(ctx, input)``. Running it is a series of turns:
each turn replays the function from the top, every ``ctx`` call takes the next sequence
number and is answered from its checkpoint when one exists. A call with no checkpoint does
its work and writes one; a call that must wait (a queued step, a sleep, a signal, a child,
a fan) suspends the turn. The next wake (a settled step, a due timer, a signal) triggers
the next turn.

The modules behind it, each importing only those below it (``.importlinter`` checks it):

- ``durable.tasks``: the Celery entry points (turns, steps, the tick, retention, reconcile);
- ``durable.tick``, ``durable.retention``, ``durable.owners``: periodic passes, rows a run drives;
- ``durable.services`` (writes), ``durable.selectors`` (reads): operations on runs and schedules;
- ``durable.turns``: claiming, replaying, releasing and finishing a turn;
- ``durable.context``: the ``ctx`` API (steps, values, timers, waits, children, fans);
- ``durable.steps``: the queued-step worker and heartbeats;
- ``durable.leases``: lease tokens and the keeper thread that renews them;
- ``durable.store``: every statement that changes a run's or a step's status;
- ``durable.dispatch``: turn and step messages, sent by task name after commit;
- ``durable.retry``, ``durable.registry``, ``durable.codec``, ``durable.errors``, ``durable.settings``,
  ``durable.states``: retry policy, registered workflows, payloads, every engine error, tunables, statuses.

Ownership is decided in Postgres, never in worker memory: a turn holds a lease on its run,
every checkpoint is unique per (run, seq) and written only while the lease holds, every
settle is a compare-and-set on a value that never repeats. A worker that lost its lease can
execute a step twice (at-least-once) but can never checkpoint it twice.
"""

from durable.context import Child, Context, Step
from durable.errors import ChildFailed, FanFailed, StepFailed, TryLater
from durable.registry import workflow
from durable.steps import deferrals, heartbeat, release_connection, wait_alive

__all__ = ["Child", "ChildFailed", "Context", "FanFailed", "Step", "StepFailed", "TryLater", "deferrals",
           "heartbeat", "release_connection", "wait_alive", "workflow"]
