"""Celery: Redis is the broker; durable state lives in Postgres, so no result backend is needed."""

from config.env import env_bool, env_int

from .base import REDIS_URL

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True
# A task is acknowledged after it ran, so a pool process killed mid-task has it put back on its queue (by the
# worker's main process); the durable engine's leases and compare-and-set updates make the redelivery harmless.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = env_int("CELERY_WORKER_PREFETCH_MULTIPLIER", 4, minimum=1)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No acknowledgement emulation on Redis: it cost a worker's main process two Redis transactions a message (the
# message copied to an "unacked" hash as it is received, removed when acknowledged) for a redelivery only after
# a visibility timeout of an hour, once a whole worker died. Postgres, not the broker, is what the engine
# recovers from: a lost turn message is sent again by the tick (the run keeps wake_pending), a lost step
# message too (a pending step carries its re-dispatch time, a claimed one its timeout), within seconds.
# A worker still puts back what it reserved when it stops, and a task whose pool process died (above).
CELERY_BROKER_TRANSPORT_OPTIONS = {"ack_emulation": False}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connections before and after every task and, in a prefork worker
# with Django's pool, the whole pool (celery/celery#10554): each task opened a new Postgres session. A reuse
# count no worker reaches turns that off; config/celery.py gives a task's connection back to the process's
# pool at the task's edges instead, as Django does at a request's.
CELERY_DB_REUSE_MAX = 2**62
# Priorities 0 (first) .. 9 on the Redis transport; durable runs map their priority onto them.
CELERY_BROKER_TRANSPORT_OPTIONS["queue_order_strategy"] = "priority"
CELERY_BROKER_TRANSPORT_OPTIONS["priority_steps"] = list(range(10))
CELERY_BROKER_TRANSPORT_OPTIONS["sep"] = ":"
CELERY_TASK_ROUTES = {
    "durable.tick": {"queue": "celery"},
    "durable.retention": {"queue": "celery"},
    "durable.reconcile": {"queue": "celery"},
}
