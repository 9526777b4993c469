"""The engine's tunables, read from Django settings with REFERENCE.md's defaults."""

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
        lease_seconds=getattr(settings, "DURABLE_LEASE_SECONDS", 30.0),
        timer_batch=getattr(settings, "DURABLE_TIMER_BATCH", 500),
        max_recovery_attempts=getattr(settings, "DURABLE_MAX_RECOVERY_ATTEMPTS", 5),
        redispatch_after_seconds=float(getattr(settings, "DURABLE_REDISPATCH_AFTER_SECONDS", 30.0)),
        event_ttl_seconds=getattr(settings, "DURABLE_EVENT_TTL_SECONDS", 7 * 24 * 3600),
        fan_chunk=getattr(settings, "DURABLE_FAN_CHUNK", 100),
        heartbeat_persist_seconds=getattr(settings, "DURABLE_HEARTBEAT_PERSIST_SECONDS", 10.0),
        retention_policies=tuple(getattr(settings, "DURABLE_RETENTION_POLICIES", ())),
        default_step_queue=getattr(settings, "DURABLE_STEP_QUEUE", "steps"),
        turn_queue=getattr(settings, "DURABLE_TURN_QUEUE", "turns"),
        step_default_timeout=float(getattr(settings, "DURABLE_STEP_DEFAULT_TIMEOUT", 300.0)),
        step_max_defer_seconds=float(getattr(settings, "DURABLE_STEP_MAX_DEFER_SECONDS", 3600.0)),
    )
