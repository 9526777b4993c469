import threading

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_the_vector_extension_is_installed():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extname FROM pg_extension")
        names = {row[0] for row in cursor.fetchall()}
    assert "vector" in names


def test_vector_operators_work_at_real_widths_on_this_cpu():
    """Wide vectors take pgvector's vectorised loops: a build for instructions this CPU lacks kills the
    backend here (SIGILL), where 3-dimensional vectors still pass."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE widths (e vector(384))")
        cursor.execute("CREATE INDEX ON widths USING hnsw (e vector_cosine_ops)")
        cursor.execute("INSERT INTO widths SELECT array_fill(g::real, ARRAY[384])::vector "
                       "FROM generate_series(1, 50) g")
        cursor.execute("SELECT '[1,0,0]'::vector <=> '[0,1,0]'::vector, "
                       "(SELECT count(*) FROM widths WHERE e <=> array_fill(1::real, ARRAY[384])::vector < 1e-6)")
        distance, parallel = cursor.fetchone()
    assert distance == pytest.approx(1.0)
    assert parallel == 50  # every row points the same way as the all-ones vector


def test_make_runs_connection_budget_counts_the_llm_worker_and_stays_under_the_embedded_servers_100(monkeypatch):
    from config.supervisor import TICK_WORKER_PROCESSES, connection_budget, llm_worker_command, tick_worker_command

    monkeypatch.delenv("DATABASE_POOL_MAX_SIZE", raising=False)
    budget = connection_budget(web_workers=2, celery_processes=3, llm_processes=1, tick_processes=TICK_WORKER_PROCESSES)
    assert budget == ("Postgres connections: at most 36 (2 web + 3 Celery + 1 llm worker + 2 tick worker + 1 beat "
                      "processes x a pool of 4)")
    # the tick's worker: one prefork child (time limits need prefork), its own queue only
    tick = tick_worker_command("python")
    assert tick[tick.index("-Q") + 1] == "tick" and tick[tick.index("--concurrency") + 1] == "1"
    assert tick[tick.index("--pool") + 1] == "prefork"
    # one process whatever its threads: 64 calls in flight share that process's one pool
    command = llm_worker_command("python", in_flight=64)
    assert command[command.index("--pool") + 1] == "threads" and command[command.index("--concurrency") + 1] == "64"
    assert command[command.index("-Q") + 1] == "llm"


@pytest.mark.django_db(transaction=True)
def test_migrate_waits_for_the_advisory_lock(settings):
    """A second `migrate` blocks while another holds the lock, then runs once it is released."""
    from django.core.management import call_command

    from config.management.commands.migrate import MIGRATE_LOCK_KEY

    holder = connection.Database.connect(**connection.get_connection_params(), autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
    done = threading.Event()
    errors = []

    def migrate():
        from django.db import connections

        try:
            call_command("migrate", verbosity=0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=migrate)
    thread.start()
    try:
        assert not done.wait(1.0), "migrate ran while another process held the migration lock"
        waiting = holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
            [MIGRATE_LOCK_KEY & 0xFFFFFFFF],
        ).fetchone()[0]
        assert waiting == 1
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])
        holder.close()
    assert done.wait(30)
    thread.join()
    assert errors == []


def test_the_pool_size_comes_from_the_environment():
    """Each process's connections are bounded by DATABASE_POOL_MAX_SIZE (persistent connections off)."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, django; from django.conf import settings; django.setup(); "
            "d = settings.DATABASES['default']; print(json.dumps([d['OPTIONS'].get('pool'), d['CONN_MAX_AGE']]))")

    def run(**extra):
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **extra}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    def configured(**extra):
        out = run(**extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    pool, max_age = configured(DATABASE_POOL_MAX_SIZE="3", DATABASE_POOL_TIMEOUT="2.5")
    assert pool["max_size"] == 3 and pool["timeout"] == 2.5 and pool["min_size"] <= 3
    assert max_age == 0
    pool, max_age = configured(DATABASE_POOL_MAX_SIZE="0", DATABASE_CONN_MAX_AGE="30")
    assert pool is None and max_age == 30
    bad = run(DATABASE_POOL_MAX_SIZE="many")
    assert bad.returncode != 0 and "DATABASE_POOL_MAX_SIZE" in bad.stderr


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_concurrent_requests_stays_within_the_pool(live_server, settings, member):
    """96 API requests, 32 at a time, against the live server (a thread per request) never hold more
    connections than this process's pool allows."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import psycopg
    from knox.models import AuthToken

    from durable.models import DurableRun

    bound = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    namespace = member.memberships.get().workspace.namespace
    DurableRun.objects.bulk_create([DurableRun(id=f"burst-{i}", workflow="tests.sequence", namespace=namespace)
                                    for i in range(60)])
    _instance, token = AuthToken.objects.create(user=member)
    sampler = psycopg.connect(**connection.get_connection_params(), autocommit=True)  # outside the pool
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            count = sampler.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()").fetchone()[0]
            peak[0] = max(peak[0], count)

    def get(index):
        request = urllib.request.Request(f"{live_server.url}/api/durable/runs/?page_size=50",  # noqa: S310
                                         headers={"Authorization": f"Token {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the loopback live server
            return response.status

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        with ThreadPoolExecutor(32) as executor:
            statuses = list(executor.map(get, range(96)))
    finally:
        stop.set()
        watcher.join()
        sampler.close()
    assert statuses == [200] * 96
    assert 1 <= peak[0] <= bound


def _answers_of_a_forked_process(marker: str) -> dict:
    """What a forked process gets back from its own queries (run in a `multiprocessing` fork pool)."""
    from django.db import connections

    wrong = 0
    with connection.cursor() as cursor:
        for i in range(200):
            cursor.execute("SELECT %s, %s, pg_backend_pid()", [marker, i])
            got, n, pid = cursor.fetchone()
            wrong += (got, n) != (marker, i)
    connections.close_all()
    return {"wrong": wrong, "pid": pid}


@pytest.mark.parametrize("parent_holds_a_connection", [False, True])
@pytest.mark.django_db(transaction=True)
def test_processes_forked_after_the_database_was_used_each_get_their_own_answers(parent_holds_a_connection):
    """A fork (a `multiprocessing` pool, Celery's prefork) after this process used the database: the
    children and the parent all query at once, and each reads the answers to its own statements."""
    import multiprocessing

    from django.db import connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        parent_pid = cursor.fetchone()[0]
    if not parent_holds_a_connection:
        connections.close_all()  # back to this process's pool, its socket still open
    with multiprocessing.get_context("fork").Pool(2) as pool:
        children = pool.map_async(_answers_of_a_forked_process, ["left", "right"])
        parent = _answers_of_a_forked_process("parent")
        children = children.get(timeout=20)
    assert [child["wrong"] for child in children] == [0, 0] and parent["wrong"] == 0
    assert len({parent["pid"], *(child["pid"] for child in children)}) == 3  # a session of its own each
    assert parent["pid"] == parent_pid or not parent_holds_a_connection  # the parent's session survived
