"""Celery entry points of the engine: thin wrappers around durable.turns, durable.steps, durable.tick,
durable.retention and durable.owners. Sent by name (durable.dispatch, the beat schedule)."""

from celery import shared_task
from django.db import InterfaceError, OperationalError

from durable import owners, retention, steps, tick, turns
from durable.errors import TurnInterrupted


@shared_task(name="durable.run_turn", autoretry_for=(OperationalError, InterfaceError, TurnInterrupted),
             retry_backoff=True, max_retries=5, acks_late=True)
def run_turn(run_id: str) -> str:
    """One turn of a run. Sent on every wake (start, settled step, due timer, signal). Safe to retry
    and to deliver twice: the claim is a compare-and-set on the run's lease. An engine write that
    failed mid-turn raises TurnInterrupted after giving the run back, and the task is retried."""
    return turns.execute_turn(run_id).outcome


@shared_task(name="durable.run_steps", autoretry_for=(OperationalError, InterfaceError), retry_backoff=True,
             max_retries=5, acks_late=True)
def run_steps(run_id: str, seqs: list[int]) -> dict:
    """A batch of one run's queued steps. Sent when a step or fan is started and by the tick for due
    retries. Safe to deliver twice: each step is claimed pending -> running once."""
    return steps.execute_steps(run_id, seqs)


@shared_task(name="durable.tick", ignore_result=True)
def run_tick() -> dict:
    """Beat, every second: leases, timers, step retries and timeouts, lost wakes, schedules.
    Safe to race: every phase claims rows with SKIP LOCKED or compare-and-set."""
    return tick.tick()


@shared_task(name="durable.retention", ignore_result=True)
def run_retention() -> dict:
    """Beat, every minute: retention policies and the buffered-event TTL. Safe to race."""
    return retention.retention_pass()


@shared_task(name="durable.reconcile", ignore_result=True)
def run_reconcile() -> dict:
    """Beat, every 30 s: rows of every owner (durable.owners) whose durable run ended without them,
    cancelled or declared dead elsewhere or deleted, take its end. Safe to race (each end is
    conditional on the row not having ended)."""
    return owners.reconcile()
