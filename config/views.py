from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from config.health import broker_health, database_health, readiness


@never_cache
@require_GET
def healthz(request):
    """200 when Postgres and the Redis broker both answer, else 503 naming which failed."""
    checks = {"database": database_health(), "broker": broker_health()}
    body = {name: ("ok" if error is None else f"error: {error}") for name, error in checks.items()}
    healthy = all(error is None for error in checks.values())
    body["status"] = "ok" if healthy else "unhealthy"
    return JsonResponse(body, status=200 if healthy else 503)


@never_cache
@require_GET
def healthz_live(request):
    """Liveness: the process answers requests (nothing else is asked: restarting it cures nothing else)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def healthz_ready(request):
    """Readiness: Postgres, Redis, migrations and the engine's heartbeat; 503 naming what fails."""
    body, ready = readiness()
    return JsonResponse(body, status=200 if ready else 503)
