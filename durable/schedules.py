"""Schedule windows: every N seconds (aligned to the epoch) or cron in a time zone.

A window's run id is ``sched:<namespace>:<key>:<window>``, so however many ticks race, each window
starts at most one run; the schedule row is also claimed FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

import hashlib
import zoneinfo
from datetime import UTC, datetime, timedelta

from croniter import croniter
from django.core.exceptions import ValidationError


def validate_schedule(*, every_seconds: int | None, cron: str, timezone_name: str) -> None:
    if bool(every_seconds) == bool(cron):
        raise ValidationError({"every_seconds": "Set exactly one of every_seconds and cron."})
    if every_seconds is not None and every_seconds < 1:
        raise ValidationError({"every_seconds": "Must be at least 1 second."})
    if cron and not croniter.is_valid(cron):
        raise ValidationError({"cron": f"{cron!r} is not a valid cron expression."})
    try:
        zoneinfo.ZoneInfo(timezone_name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError({"timezone": f"Unknown time zone {timezone_name!r}."}) from None


def next_window(schedule, *, after: datetime) -> datetime:
    """The first window strictly after `after` (UTC)."""
    if schedule.every_seconds:
        step = int(schedule.every_seconds)
        epoch = int(after.timestamp())
        return datetime.fromtimestamp((epoch // step + 1) * step, tz=UTC)
    tz = zoneinfo.ZoneInfo(schedule.timezone or "UTC")
    return croniter(schedule.cron, after.astimezone(tz)).get_next(datetime).astimezone(UTC)


def jitter_for(schedule, window: datetime) -> timedelta:
    """A stable per-window delay in [0, jitter_seconds), so racing ticks agree on it."""
    if not schedule.jitter_seconds:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule.namespace}:{schedule.key}:{window.isoformat()}".encode()).digest()
    return timedelta(seconds=int.from_bytes(digest[:4], "big") % schedule.jitter_seconds)


def _latest_window(schedule, *, at: datetime) -> datetime:
    if schedule.every_seconds:
        step = int(schedule.every_seconds)
        return datetime.fromtimestamp(int(at.timestamp()) // step * step, tz=UTC)
    tz = zoneinfo.ZoneInfo(schedule.timezone or "UTC")
    return croniter(schedule.cron, (at + timedelta(microseconds=1)).astimezone(tz)).get_prev(datetime).astimezone(UTC)


def _previous_window(schedule, window: datetime) -> datetime:
    if schedule.every_seconds:
        return window - timedelta(seconds=int(schedule.every_seconds))
    tz = zoneinfo.ZoneInfo(schedule.timezone or "UTC")
    return croniter(schedule.cron, window.astimezone(tz)).get_prev(datetime).astimezone(UTC)


def due_windows(schedule, *, now: datetime) -> list[datetime]:
    """Windows due now that have not fired, oldest first: at most `catchup_limit` of them, the newest
    (bounded catch-up: a schedule paused or down for a week does not start a week of runs)."""
    start = schedule.last_fired_at or (schedule.created_at - timedelta(seconds=1))
    limit = max(1, schedule.catchup_limit)
    windows: list[datetime] = []
    window = _latest_window(schedule, at=now)
    while window > start and len(windows) < limit:
        if window + jitter_for(schedule, window) <= now:
            windows.append(window)
        window = _previous_window(schedule, window)
    return sorted(windows)


def run_id_for(schedule, window: datetime) -> str:
    return f"sched:{schedule.namespace}:{schedule.key}:{window.strftime('%Y%m%dT%H%M%SZ')}"
