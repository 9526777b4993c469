"""The durable engine (see durable/settings.py for how each is used)."""

import json

from django.core.exceptions import ImproperlyConfigured

from config.env import env_float, env_int, env_list, env_str

DURABLE_LEASE_SECONDS = env_float("DURABLE_LEASE_SECONDS", 30.0, minimum=1.0)
DURABLE_TIMER_BATCH = env_int("DURABLE_TIMER_BATCH", 500, minimum=1)
DURABLE_MAX_RECOVERY_ATTEMPTS = env_int("DURABLE_MAX_RECOVERY_ATTEMPTS", 5, minimum=0)
DURABLE_EVENT_TTL_SECONDS = env_int("DURABLE_EVENT_TTL_SECONDS", 7 * 24 * 3600, minimum=1)
DURABLE_FAN_CHUNK = env_int("DURABLE_FAN_CHUNK", 100, minimum=1, maximum=1000)
# a running step's heartbeats reach the database at most this often (each one re-arms its timeout)
DURABLE_HEARTBEAT_PERSIST_SECONDS = 10.0
# the Celery queues of turns and of steps with no queue of their own (docker-compose.yml's worker consumes both)
DURABLE_TURN_QUEUE = "turns"
DURABLE_STEP_QUEUE = "steps"
# Encrypts run and step payloads at rest when set (comma-separated Fernet keys; the first encrypts).
DURABLE_PAYLOAD_KEYS = env_list("DURABLE_PAYLOAD_KEYS", [])
# Extra modules defining durable workflows, imported by every process (apps' durable_workflows modules are found
# automatically).
DURABLE_WORKFLOW_MODULES = env_list("DURABLE_WORKFLOW_MODULES", [])
DURABLE_DISPATCH_ENABLED = True
DURABLE_REDISPATCH_AFTER_SECONDS = env_float("DURABLE_REDISPATCH_AFTER_SECONDS", 30.0, minimum=0.0)
DURABLE_STEP_DEFAULT_TIMEOUT = env_float("DURABLE_STEP_DEFAULT_TIMEOUT", 300.0, minimum=0.1)
# A queued step that keeps raising TryLater (a provider's rate limit that never lifts) fails once it has
# been put off for this long in a row, with the last reason it was given.
DURABLE_STEP_MAX_DEFER_SECONDS = env_float("DURABLE_STEP_MAX_DEFER_SECONDS", 3600.0, minimum=1.0)

_policies = env_str("DURABLE_RETENTION_POLICIES", "")
try:
    # e.g. [{"statuses": ["completed"], "max_age_days": 30}, {"statuses": ["failed", "dead"], "max_count": 10000}]
    DURABLE_RETENTION_POLICIES = json.loads(_policies) if _policies else [
        {"statuses": ["completed", "cancelled"], "max_age_days": 30},
        {"statuses": ["failed", "dead"], "max_age_days": 90},
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"DURABLE_RETENTION_POLICIES is not valid JSON ({exc}).") from None
