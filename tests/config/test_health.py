import pytest

from config.services import EmbeddedRedis

pytestmark = pytest.mark.django_db


def test_healthz_reports_database_and_broker(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok", "status": "ok"}


def test_healthz_fails_clearly_when_redis_is_down(client, settings, tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis", persistent=False)
    settings.CELERY_BROKER_URL = redis.start()
    try:
        assert client.get("/healthz").status_code == 200
    finally:
        redis.stop()
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert body["database"] == "ok"
    assert body["broker"].startswith("error: ConnectionError")


def test_a_stale_redis_is_stopped_before_a_new_start(tmp_path):
    first = EmbeddedRedis(tmp_path / "redis", persistent=False)
    first.start()
    stale_pid = first.process.pid
    second = EmbeddedRedis(tmp_path / "redis", persistent=False)  # as if the first supervisor was killed
    try:
        second.start()
        assert first.process.wait(10) is not None
        assert second.process.pid != stale_pid
    finally:
        second.stop()
