"""Health probes shared by /healthz and the supervisor."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection


def database_health() -> str | None:
    """Return None when the database answers, else a one-line reason."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure is a health answer, not a crash
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def broker_health(url: str | None = None) -> str | None:
    """Return None when the Redis broker answers PING within a second, else a one-line reason."""
    client = redis.Redis.from_url(url or settings.CELERY_BROKER_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    finally:
        client.close()
    return None
