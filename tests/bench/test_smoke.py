"""Smoke tests of the benchmarks: every benchmark `python -m bench` lists runs end to end at a tiny size
(its results written to a temporary directory), and the core measurements of some are checked in-process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bench.durable_workflows  # noqa: F401 - registers the benchmark workflows
from bench import __main__ as bench_main
from bench import common, durable_fan, durable_steps, durable_timers

BASE_DIR = Path(__file__).resolve().parents[2]

# each benchmark's arguments for a run of seconds; a benchmark missing here fails the test below
TINY = {
    "admin_home": ["--rows", "2000", "--reps", "1"],
    "admin_search": ["--runs", "2000", "--reps", "1"],
    "api_load": ["--clients", "2", "--duration", "2", "--web-workers", "1", "--web-threads", "2",
                 "--celery-concurrency", "1", "--runs", "50", "--sources", "2"],
    "durable_chaos": ["--duration", "2", "--runs", "4", "--workers", "1", "--seed", "1"],
    "durable_fan": ["--steps", "300", "--settled", "200", "--workers", "1", "--reps", "5", "--count-reps", "2",
                    "--timeout", "120"],
    "durable_steps": ["--rounds", "1", "--workflows", "2", "--steps", "5", "--no-profile"],
    "durable_timers": ["--runs", "2000", "--due", "20", "--reps", "2"],
    "evolution": ["--generations", "2", "--population", "3", "--agents", "Research Analyst", "--depth", "20",
                  "--repeats", "2"],
    # two processes: the ingests are driven in forked children
    "knowledge": ["--chunks", "2000", "--queries", "5", "--processes", "2"],
    "providers": ["--latency", "0.2", "--in-flight", "8", "--invocations", "4", "--fans", "1", "--only", "seq3,fan",
                  "--timeout", "300"],
    "workflows": ["--skip-workers", "--repeats", "3", "--no-profile"],  # its workers: test_workflows_bench.py
}


def _providers_measured_every_call(results: dict) -> None:
    """The providers benchmark at its tiny size: every call answered, against its ceiling, measured."""
    seq3, fan = results["scenarios"]
    assert seq3["calls"] == 12 and seq3["statuses"] == {"completed": 4}
    assert fan["calls"] == 18 and fan["statuses"] == {"completed": 1}
    for scenario in (seq3, fan):
        assert scenario["ceiling"]["calls"] == scenario["calls"] and scenario["ratio"] > 0
        assert scenario["peak_in_flight"] >= 1 and scenario["peak_postgres_connections"] >= 1
        assert scenario["peak_worker_rss_mb"] > 0 and scenario["engine_ms_per_call"]["median"] is not None
    assert set(results["targets"]) == {"seq3_vs_ceiling", "fan_vs_ceiling"}


# what a benchmark's tiny run must have measured, beyond writing its results
CHECKS = {"providers": _providers_measured_every_call}


def test_the_benchmarks_are_listed_and_each_has_a_tiny_size():
    names = bench_main.available()
    assert {"durable_steps", "durable_fan", "durable_timers"} <= set(names)
    assert "common" not in names and "durable_workflows" not in names
    assert set(names) == set(TINY), "give every benchmark tiny arguments in TINY"


@pytest.mark.worker
@pytest.mark.parametrize("name", sorted(TINY))
def test_the_benchmark_runs_end_to_end_at_a_tiny_size(name, tmp_path):
    """`python -m bench <name>` as `make bench` runs it (its own database on this server), results aside."""
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench", name, *TINY[name]], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    results = json.loads((tmp_path / f"{name}.json").read_text())
    assert results and "Traceback" not in done.stderr
    if name in CHECKS:
        CHECKS[name](results)


def test_table_and_summary_helpers(capsys):
    common.print_table("t", ["a", "b"], [["x", 1234.5], ["y", None]])
    assert "1,234" in capsys.readouterr().out
    assert common.summary_ms([0.001, 0.002, 0.003])["median_ms"] == 2.0


@pytest.mark.django_db
def test_ours_runs_sequential_steps(settings):
    settings.DURABLE_DISPATCH_ENABLED = False
    assert durable_steps.run_ours(2, 5) > 0


@pytest.mark.django_db
def test_fan_join_check_and_bytes(settings):
    settings.DURABLE_DISPATCH_ENABLED = False
    durable_fan.build_fan("smoke-fan", 200, 150)
    join = durable_fan.time_join_check("smoke-fan", 0, reps=5, count_reps=2)
    assert join["pending_counted"] == 50
    assert "Index" in join["explain"]
    written = durable_fan.settle_bytes(samples=2, checkpoint=False)
    assert written["settle_steps_wal_bytes"]["median"] < written["full_row_rewrite_wal_bytes"]["median"]
    read = durable_fan.replay_bytes(steps=3)
    assert read["replay_sql_bytes"] * 100 < read["select_star_bytes"]


@pytest.mark.django_db
def test_timer_rows_load_and_the_due_query_answers():
    from django.db import connection

    blocks, counts = durable_timers.generate(1000, 10)
    assert counts["due"] == 10 and sum(counts.values()) == 1000
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY {durable_timers.RUN_TABLE} ({', '.join(durable_timers.COLUMNS)}) FROM STDIN") as copy:
            for block in blocks:
                copy.write(block)
        cursor.execute(durable_timers.DUE_SQL)
        assert len(cursor.fetchall()) == 10


@pytest.mark.django_db
def test_admin_search_renders_the_changelist_and_explains_it():
    from django.db import connection

    from bench import admin_search

    blocks, _counts = durable_timers.generate(1000, 10)
    connection.ensure_connection()
    columns = ", ".join(durable_timers.COLUMNS)
    with connection.connection.cursor() as cursor, cursor.copy(
            f"COPY {durable_timers.RUN_TABLE} ({columns}) FROM STDIN") as copy:
        for block in blocks:
            copy.write(block)
    admins, user = admin_search._admins()
    now = admin_search.time_case(admins["now"], user, "run-0000050", reps=1)
    before = admin_search.time_case(admins["icontains"], user, "run-0000050", reps=1)
    assert now["rows"] == before["rows"] == 10
    assert "LIKE" in now["sql"].upper() and "Limit" in now["explain"]


def test_the_providers_server_limits_a_window_and_the_ceiling_makes_every_call():
    import openai

    from bench import providers

    with providers.SlowProvider(latency=0.05) as server:
        result = providers.ceiling(server.url, [[1, 4, 1]] * 3, in_flight=4)
        assert result["calls"] == 18 and server.answered == 18 and server.peak == 4
    # past the window a start is refused with a Retry-After
    with providers.SlowProvider(latency=0.0, per_minute=1) as server:
        providers.ceiling(server.url, [[1]], in_flight=1)
        with pytest.raises(openai.RateLimitError):
            providers.ceiling(server.url, [[1]], in_flight=1)
        assert server.refused == 1
    assert providers.window_share([0.0, 1.0, 61.0], per_minute=2) == 0.75
