"""The engine's periodic passes, run by Celery beat every second (retention every minute).

Each phase is independent and catches its own errors, so one failing pass never stops the
others. Every phase claims rows with a compare-and-set or FOR UPDATE SKIP LOCKED, so two
ticks racing (two beats, a manual tick) do the work once.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from durable import services, store
from durable.codec import encode
from durable.models import DurableRun, Schedule
from durable.schedules import due_windows, jitter_for, next_window, run_id_for
from durable.settings import durable_settings

logger = logging.getLogger("durable.tick")

MAX_BATCHES_PER_TICK = 20


def recover_expired_leases() -> int:
    """Runs whose worker stopped renewing its lease: count a recovery attempt and turn them again,
    or mark them dead past DURABLE_MAX_RECOVERY_ATTEMPTS."""
    settings = durable_settings()
    dead_error = encode({"type": "RecoveryExhausted",
                         "message": f"the run's lease expired more than {settings.max_recovery_attempts} times"})
    rows = store.runs_recover_expired(max_attempts=settings.max_recovery_attempts, dead_error_text=dead_error,
                                      batch=settings.timer_batch)
    for run_id, status, *_ in rows:
        if status == DurableRun.Status.DEAD:
            logger.error("durable: run %s is dead after too many recoveries", run_id)
        else:
            logger.warning("durable: recovering run %s (its lease expired)", run_id)
    return len(rows)


def resume_due_timers() -> int:
    """Suspended runs whose timer is due (sleeps, signal timeouts, inline retries): oldest first,
    in batches of DURABLE_TIMER_BATCH."""
    batch = durable_settings().timer_batch
    total = 0
    for _ in range(MAX_BATCHES_PER_TICK):
        resumed = len(store.runs_resume_due(batch=batch))
        total += resumed
        if resumed < batch:
            break
    return total


def dispatch_due_steps() -> int:
    """Queued steps of active runs whose retry is due, or whose message was never picked up: send them again."""
    settings = durable_settings()
    return len(store.steps_dispatch_due(redispatch_after=settings.redispatch_after_seconds,
                                        batch=settings.timer_batch))


def time_out_silent_steps() -> int:
    """Running steps silent for longer than their timeout: the attempt is abandoned and the step
    goes back to pending (or fails once its worker has been lost too many times)."""
    settings = durable_settings()
    timed_out = encode({"type": "StepTimeout", "message": "no heartbeat within the step's timeout"})
    rows = store.steps_time_out(max_timeouts=settings.max_recovery_attempts, error_text=timed_out,
                                batch=settings.timer_batch)
    for run_id, seq, status, _queue in rows:
        logger.warning("durable: step %s#%s timed out (%s)", run_id, seq, status)
    return len(rows)


def redispatch_lost_wakes() -> int:
    """Runs that want a turn but whose message was lost (a broker restart): send it again."""
    settings = durable_settings()
    return len(store.runs_redispatch_lost(after_seconds=settings.redispatch_after_seconds,
                                          batch=settings.timer_batch))


def fire_due_schedules(*, now=None) -> int:
    """Start one run per due window of each unpaused schedule (bounded catch-up, overlap policy)."""
    now = now or timezone.now()
    started = 0
    with transaction.atomic():
        schedules = list(
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(paused=False, next_fire_at__lte=now).order_by("next_fire_at")[:100]
        )
        for schedule in schedules:
            windows = due_windows(schedule, now=now)
            for window in windows:
                if schedule.overlap == Schedule.Overlap.SKIP and schedule.last_run_id and DurableRun.objects.filter(
                    pk=schedule.last_run_id, status__in=DurableRun.Status.ACTIVE
                ).exists():
                    logger.info("durable: schedule %s skipped window %s (previous run active)", schedule.key, window)
                    continue
                run_id = run_id_for(schedule, window)
                if services.run_create(run_id=run_id, workflow=schedule.workflow, input=schedule.input,
                                       namespace=schedule.namespace, tags=[*schedule.tags, f"schedule:{schedule.key}"]):
                    started += 1
                schedule.last_run_id = run_id
            if windows:
                schedule.last_fired_at = windows[-1]
            start = schedule.last_fired_at or (schedule.created_at - timedelta(seconds=1))
            upcoming = next_window(schedule, after=start)
            schedule.next_fire_at = upcoming + jitter_for(schedule, upcoming)
            schedule.save(update_fields=["last_fired_at", "last_run_id", "next_fire_at", "updated_at"])
    return started


PHASES = [recover_expired_leases, resume_due_timers, dispatch_due_steps, time_out_silent_steps,
          redispatch_lost_wakes, fire_due_schedules]


def tick() -> dict[str, int | str]:
    """Run every phase once; each catches and reports its own errors. Then record the heartbeat."""
    report: dict[str, int | str] = {}
    for phase in PHASES:
        try:
            report[phase.__name__] = phase()
        except Exception as exc:
            logger.exception("durable: tick phase %s failed", phase.__name__)
            report[phase.__name__] = f"error: {type(exc).__name__}: {exc}"
            connection.close_if_unusable_or_obsolete()
    heartbeat_record()
    return report


# The heartbeat is a key of Django's cache (on Redis), not a row: a write a second costs Redis nothing,
# where a row updated every second leaves Postgres 86,400 dead tuples a day to vacuum; and the tick's
# messages come through Redis anyway, so the key adds no failure of its own (a Redis that lost it reads as
# "no tick yet", which is true until the next one). The time is the wall clock, comparable across machines.
HEARTBEAT_KEY = "durable:tick:last"


def heartbeat_record() -> None:
    """When the last tick ended (its phases done, failed ones included: each reports its own error)."""
    try:
        cache.set(HEARTBEAT_KEY, time.time(), timeout=None)
    except Exception as exc:  # the tick's work is done; only the heartbeat is missing
        logger.warning("durable: the tick heartbeat could not be recorded (%s)", exc)


def last_tick_at() -> float | None:
    """The wall-clock time (epoch seconds) of the last tick's end, None when none was recorded."""
    return cache.get(HEARTBEAT_KEY)
