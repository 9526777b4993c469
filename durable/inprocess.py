"""Run durable workflows in-process (tests, management commands, the demo seed, scripts).

Turns and queued steps are executed directly instead of by Celery workers, with the same
claims, checkpoints and settles, so a run driven here is indistinguishable from one run by
workers; a worker receiving a message for it later finds nothing to claim."""

from __future__ import annotations

import time

from django.db import connection
from django.utils import timezone

from durable import steps, store, turns
from durable.models import DurableRun


def _step_work(run_ids: list[str]) -> dict[str, list[int]]:
    """Queued steps ready to run: never attempted, or a retry that is due."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT run_id, seq FROM {store.CP_TABLE} WHERE run_id = ANY(%s) AND status = 'pending' "
            "AND queue <> '' AND (attempt = 0 OR wake_at IS NULL OR wake_at <= statement_timestamp()) ORDER BY run_id, seq",
            [run_ids],
        )
        work: dict[str, list[int]] = {}
        for run_id, seq in cursor.fetchall():
            work.setdefault(run_id, []).append(seq)
        return work


def _next_timer(run_ids: list[str]):
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT min(t) FROM (SELECT wake_at AS t FROM {store.RUN_TABLE} WHERE id = ANY(%s) "
            f"AND status = 'suspended' AND wake_at IS NOT NULL UNION ALL SELECT wake_at FROM {store.CP_TABLE} "
            "WHERE run_id = ANY(%s) AND status = 'pending' AND queue <> '' AND attempt > 0) AS timers",
            [run_ids, run_ids],
        )
        return cursor.fetchone()[0]


def run_until_settled(run_id: str, *, max_wait: float = 10.0, max_iterations: int = 10_000) -> DurableRun:
    """Drive a run (and its children) until it is terminal, or blocked on something only the outside
    world can deliver (a signal, an event, a timer further than `max_wait` seconds away)."""
    deadline = time.monotonic() + max_wait
    for _ in range(max_iterations):
        run_ids = [run_id, *store.descendant_run_ids([run_id])]
        progressed = False
        states = DurableRun.objects.filter(pk__in=run_ids).values_list("id", "status", "wake_pending", "wake_at")
        for current, status, wake_pending, wake_at in states:
            if status in DurableRun.Status.ACTIVE and (
                wake_pending or status == "pending" or (wake_at is not None and wake_at <= timezone.now())
            ):
                outcome = turns.execute_turn(current).outcome
                progressed = progressed or outcome != "not_claimed"
        for current, seqs in _step_work(run_ids).items():
            result = steps.execute_steps(current, seqs)
            progressed = progressed or result["claimed"] > 0
        run = DurableRun.objects.get(pk=run_id)
        if run.status in DurableRun.Status.TERMINAL:
            return run
        if progressed:
            continue
        timer = _next_timer(run_ids)
        if timer is None:
            return run
        wait = (timer - timezone.now()).total_seconds()
        if time.monotonic() + wait > deadline:
            return run
        time.sleep(max(0.0, wait) + 0.01)
    return DurableRun.objects.get(pk=run_id)


def drive_in_background(run_id: str, *, max_wait: float):
    """`run_until_settled` in a thread of its own (its own database connection), for a command that
    shows a run's progress while this process drives it. Returns the started thread."""
    import threading

    def drive():
        try:
            run_until_settled(run_id, max_wait=max_wait)
        finally:
            connection.close()

    thread = threading.Thread(target=drive, name=f"drive {run_id}", daemon=True)
    thread.start()
    return thread
