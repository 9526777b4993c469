import hmac

from django.conf import settings
from django.http import Http404, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from config import telemetry
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


@never_cache
@require_GET
def metrics(request):
    """This web process's metrics for a Prometheus scrape: 404 unless OTEL_METRICS_EXPORTER names prometheus,
    401 without `Authorization: Bearer <METRICS_TOKEN>` when that is set."""
    if not telemetry.scrapes_kept():
        raise Http404("Metrics are not served: OTEL_METRICS_EXPORTER does not name prometheus.")
    if settings.METRICS_TOKEN and not _bearer_is(request, settings.METRICS_TOKEN):
        response = HttpResponse("A bearer token (METRICS_TOKEN) is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = telemetry.scrape(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)


def _bearer_is(request, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
