"""The engine's tunables, read from Django settings (their defaults: config/settings/durable.py, and
docs/durable-defaults.md for where they come from)."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class DurableSettings:
    lease_seconds: float
    timer_batch: int
    max_recovery_attempts: int
    redispatch_after_seconds: float
    event_ttl_seconds: int
    fan_chunk: int
    heartbeat_persist_seconds: float
    retention_policies: tuple
    default_step_queue: str
    turn_queue: str
    step_default_timeout: float
    step_max_defer_seconds: float


def durable_settings() -> DurableSettings:
    return DurableSettings(
        lease_seconds=settings.DURABLE_LEASE_SECONDS,
        timer_batch=settings.DURABLE_TIMER_BATCH,
        max_recovery_attempts=settings.DURABLE_MAX_RECOVERY_ATTEMPTS,
        redispatch_after_seconds=float(settings.DURABLE_REDISPATCH_AFTER_SECONDS),
        event_ttl_seconds=settings.DURABLE_EVENT_TTL_SECONDS,
        fan_chunk=settings.DURABLE_FAN_CHUNK,
        heartbeat_persist_seconds=settings.DURABLE_HEARTBEAT_PERSIST_SECONDS,
        retention_policies=tuple(settings.DURABLE_RETENTION_POLICIES),
        default_step_queue=settings.DURABLE_STEP_QUEUE,
        turn_queue=settings.DURABLE_TURN_QUEUE,
        step_default_timeout=float(settings.DURABLE_STEP_DEFAULT_TIMEOUT),
        step_max_defer_seconds=float(settings.DURABLE_STEP_MAX_DEFER_SECONDS),
    )
