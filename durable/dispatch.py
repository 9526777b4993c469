"""Sending turn and step messages to Celery, always after the surrounding transaction commits.

Messages are sent by task name (``durable.run_turn``, ``durable.run_steps``): this module and the store,
which dispatches as it changes a run, sit below ``durable.tasks`` and never import it."""

from __future__ import annotations

from collections.abc import Sequence

from celery import current_app
from django.conf import settings
from django.db import transaction

from durable.settings import durable_settings


def dispatch_enabled() -> bool:
    return getattr(settings, "DURABLE_DISPATCH_ENABLED", True)


def celery_priority(priority: int) -> int:
    # runs: higher is more urgent (0..9); Celery on Redis: 0 is served first
    return max(0, min(9, 9 - int(priority)))


def _reprs(args: tuple) -> dict:
    """The arguments as monitoring shows them, written here: Celery's own safe repr of a message's
    arguments cost a third of its sending (they are a run id and step numbers, never large)."""
    return {"argsrepr": repr(args), "kwargsrepr": "{}"}


def dispatch_turn(run_id: str, priority: int = 0) -> None:
    """Send a turn message after the surrounding transaction commits. A message lost here (a crash
    before the send, a broker restart) is re-sent by the tick: the row keeps wake_pending."""
    if not dispatch_enabled():
        return

    def send():
        args = (run_id,)
        current_app.send_task("durable.run_turn", args, queue=durable_settings().turn_queue,
                              priority=celery_priority(priority), **_reprs(args))

    transaction.on_commit(send)


def dispatch_steps(run_id: str, seqs: Sequence[int], queue: str, priority: int = 0) -> None:
    """Send the step messages of one run in chunks, after the surrounding transaction commits.
    A lost message is re-sent by the tick (pending queued steps carry a re-dispatch time)."""
    if not dispatch_enabled() or not seqs:
        return
    chunk = durable_settings().fan_chunk
    ordered = sorted(seqs)

    def send():
        for start in range(0, len(ordered), chunk):
            args = (run_id, ordered[start:start + chunk])
            current_app.send_task("durable.run_steps", args, queue=queue, priority=celery_priority(priority),
                                  **_reprs(args))

    transaction.on_commit(send)
