"""Health probes: /healthz (Postgres and Redis), /healthz/live (the process answers) and /healthz/ready
(Postgres, Redis, migrations applied, and the engine's heartbeat: the age of the last tick and whether a
Celery worker answered a ping lately), shared by the views and the supervisor.

Every probe answers within a few seconds whatever is down: Redis and the cache time out after a second,
a worker ping waits HEALTH_WORKER_PING_TIMEOUT (and up to a second more to close its connection) and
is sent at most every third of HEALTH_WORKER_MAX_AGE_SECONDS by all web processes together (its answer is
kept in the cache)."""

from __future__ import annotations

import functools
import time

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

clock = time.time  # the wall clock the heartbeats are written with (durable.tick, _ping_workers)
WORKERS_ANSWER_KEY = "health:workers:answered"
WORKERS_PINGED_KEY = "health:workers:pinged"


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def database_health() -> str | None:
    """Return None when the database answers, else a one-line reason."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure is a health answer, not a crash
        return _reason(exc)
    return None


def broker_health(url: str | None = None) -> str | None:
    """Return None when the Redis broker answers PING within a second, else a one-line reason."""
    client = redis.Redis.from_url(url or settings.CELERY_BROKER_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    except Exception as exc:
        return _reason(exc)
    finally:
        client.close()
    return None


@functools.cache
def code_migrations() -> frozenset[tuple[str, str]]:
    """Every migration the code holds, read once a process (the graph's files do not change under it)."""
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.nodes)


def migrations_health() -> str | None:
    """Return None when every migration of the code is applied, else the ones that are not: a probe reads
    the applied ones (one query), not the migration graph, which an unauthenticated endpoint would build
    again on every call."""
    try:
        applied = MigrationRecorder(connection).applied_migrations()
        missing = sorted(code_migrations() - set(applied))
    except Exception as exc:
        return _reason(exc)
    if not missing:
        return None
    names = [f"{app}.{name}" for app, name in missing]
    return f"{len(names)} not applied: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"


def tick_health() -> dict:
    """The age of the engine's last tick, "ok" while under HEALTH_TICK_MAX_AGE_SECONDS."""
    from durable.tick import last_tick_at

    limit = settings.HEALTH_TICK_MAX_AGE_SECONDS
    try:
        last = last_tick_at()
    except Exception as exc:
        return {"status": f"error: {_reason(exc)}", "max_age_seconds": limit}
    if last is None:
        return {"status": "no tick recorded (is beat running, and a worker on the tick queue?)",
                "max_age_seconds": limit}
    age = max(0.0, clock() - last)
    status = "ok" if age <= limit else "stale (is beat running, and a worker on the tick queue?)"
    return {"status": status, "age_seconds": round(age, 1), "max_age_seconds": limit}


def _ping_workers() -> None:
    from config.celery import app

    # On a connection of its own, closed before the probe answers: waiting for the answers leaves a BRPOP
    # outstanding on the connection. Back in the app's pool, a process forked later (a multiprocessing pool,
    # Celery's prefork) would read its reply as kombu's after-fork hook closes the pool in the child, on the
    # socket shared with this process and without a timeout: one child takes the reply, the next hangs.
    # Closing reads the reply here, within the BRPOP's 1 s on the server (bounded by socket_timeout).
    options = {"socket_connect_timeout": 1, "socket_timeout": 2}
    with app.connection_for_write(transport_options=options) as connection:
        replies = app.control.ping(timeout=settings.HEALTH_WORKER_PING_TIMEOUT, connection=connection)
    if replies:
        cache.set(WORKERS_ANSWER_KEY, {"at": clock(), "workers": sorted(name for reply in replies for name in reply)},
                  timeout=None)


def workers_health() -> dict:
    """When a Celery worker last answered a ping (and which), "ok" while under HEALTH_WORKER_MAX_AGE_SECONDS.
    Pings when no probe has for a third of that (cache.add: one probe of all web processes wins)."""
    limit = settings.HEALTH_WORKER_MAX_AGE_SECONDS
    try:
        if cache.add(WORKERS_PINGED_KEY, True, timeout=limit / 3):
            _ping_workers()
        answer = cache.get(WORKERS_ANSWER_KEY)
    except Exception as exc:
        return {"status": f"error: {_reason(exc)}", "max_age_seconds": limit}
    if answer is None:
        return {"status": "no worker answered a ping", "max_age_seconds": limit}
    age = max(0.0, clock() - answer["at"])
    return {"status": "ok" if age <= limit else "no worker answered a ping lately",
            "answered_seconds_ago": round(age, 1), "workers": answer["workers"], "max_age_seconds": limit}


def readiness() -> tuple[dict, bool]:
    """The /healthz/ready body and whether it is ready. "unhealthy" when Postgres, Redis or the schema
    fail; else "degraded" when the tick or the workers are silent; `failing` names each."""
    checks: dict = {"database": database_health(), "broker": broker_health()}
    checks["migrations"] = migrations_health() if checks["database"] is None else "not checked (no database)"
    body = {name: "ok" if error is None else f"error: {error}" for name, error in checks.items()}
    body["tick"] = tick_health()
    body["workers"] = workers_health() if checks["broker"] is None else {"status": "not checked (no broker)"}
    failing = [name for name, error in checks.items() if error is not None]
    silent = [name for name in ("tick", "workers") if body[name]["status"] != "ok"]
    body["status"] = "unhealthy" if failing else "degraded" if silent else "ok"
    body["failing"] = failing + silent
    return body, not body["failing"]
