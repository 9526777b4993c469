"""Celery: Redis is the broker; durable state lives in Postgres, so no result backend is needed."""

from config.env import env_bool, env_int, env_str

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
# Each process reserves one message beyond the one it runs (Celery's advice for long acks_late tasks): a
# worker busy with a long turn never holds back messages an idle worker could run. A threads pool (the llm
# worker) still reserves one per thread.
CELERY_WORKER_PREFETCH_MULTIPLIER = env_int("CELERY_WORKER_PREFETCH_MULTIPLIER", 1, minimum=1)
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
# The tick has a queue of its own, served by a small worker of its own (`make run`'s tick-worker, compose's
# tick-worker): behind long turns on a shared queue it would wait, and every timer, lease and retry with it.
DURABLE_TICK_QUEUE = env_str("DURABLE_TICK_QUEUE", "tick")
CELERY_TASK_ROUTES = {
    "durable.tick": {"queue": DURABLE_TICK_QUEUE},
    "durable.retention": {"queue": "celery"},
    "durable.reconcile": {"queue": "celery"},
}
# Time limits for the tasks whose work is bounded (a tick's phases work in batches; retention in chunks;
# the reconcilers in one pass each): one that runs past its limit is stuck (a lock, a hung connection),
# and its worker process is replaced instead of holding every later run of it. Turns and steps have no
# such bound: their silence is watched by leases and step timeouts instead. The soft limit raises inside
# the task first (a tick phase reports it as its error); the hard limit ends the process.
DURABLE_TICK_TIME_LIMIT = env_int("DURABLE_TICK_TIME_LIMIT", 60, minimum=5)
PERIODIC_TASK_TIME_LIMIT = env_int("PERIODIC_TASK_TIME_LIMIT", 300, minimum=10)
CELERY_TASK_ANNOTATIONS = {
    "durable.tick": {"soft_time_limit": DURABLE_TICK_TIME_LIMIT - 2, "time_limit": DURABLE_TICK_TIME_LIMIT},
    **{name: {"soft_time_limit": PERIODIC_TASK_TIME_LIMIT - 5, "time_limit": PERIODIC_TASK_TIME_LIMIT}
       for name in ("durable.retention", "workflows.reconcile", "evals.reconcile", "evolution.reconcile")},
}
