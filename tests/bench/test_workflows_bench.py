"""Smoke test of `python -m bench workflows` (bench/workflows.py) at a tiny size: 4 invocations a batch on
2 real Celery workers, a 3-invocation in-process breakdown. It completes and reports every field; timings
are never asserted (they are the benchmark's to report)."""

import os
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from bench import __main__ as bench_main
from bench import workflows as bench_workflows

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

STATS = ("n", "median", "p95", "mean", "min", "max")


def _test_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def _assert_stats(stats: dict, n: int) -> None:
    assert set(stats) == set(STATS)
    assert stats["n"] == n and all(stats[key] is not None for key in STATS)


def test_the_workflows_benchmark_runs_at_a_tiny_size_and_reports_every_field(capsys):
    assert "workflows" in bench_main.available()
    version = bench_workflows.create_version()

    celery = bench_workflows.run_on_workers(version, invocations=4, workers=2, timeout=120,
                                            database_url=_test_database_url(), warmup=1)
    off, hits, misses = celery["batches"]
    for batch in celery["batches"]:
        assert not batch["timed_out"] and batch["errors"] == []
        assert batch["invocations"] == batch["completed"] == 4
        assert batch["nodes"] == batch["llm_calls"] == 4 * len(bench_workflows.NODES)
        assert batch["wall_s"] > 0 and batch["invocations_per_s"] > 0 and batch["nodes_per_s"] > 0
        for key in ("queue_wait_ms", "invocation_span_ms", "run_span_ms", "provider_ms_per_node"):
            _assert_stats(batch[key], 4)
        assert batch["task_runtime_ms"]["n"] >= 4  # one turn task an invocation, read from the workers' logs
        assert set(batch["per_invocation_ms"]) == {"worker_ms", "task_runtime_ms", "turn_tasks", "run_span_ms",
                                                   "invocation_span_ms", "provider_ms"}
        assert None not in batch["per_invocation_ms"].values()
        assert set(batch["overhead_ms_per_node"]) == {"invocation_span", "run_span", "node_durations"}
        for stats in batch["overhead_ms_per_node"].values():
            _assert_stats(stats, 4)
    # the workers read LLM_CACHE_ENABLED from their environment: off stores nothing, on hits or stores
    assert off["cache_hits"] == 0 and off["cache_rows_written"] == 0
    assert hits["cache_hits"] == 20 and hits["cache_rows_written"] == 0
    assert misses["cache_hits"] == 0 and misses["cache_rows_written"] == 20

    inprocess = bench_workflows.breakdown(version, 3, warmup=1)
    assert inprocess["nodes"] == 3 * len(bench_workflows.NODES)
    _assert_stats(inprocess["plain"]["overhead_ms_per_node"]["invocation_span"], 3)
    labels = [label for *_, label in bench_workflows.PHASES]
    for result in (inprocess, inprocess["cache_on_misses"]):
        assert [phase["phase"] for phase in result["phases"]] == labels
        assert result["statements_per_node"] > 0 and result["commits_per_node"] > 0
        # the engine's raw prepared statements bypass Django, so its execute_wrapper sees fewer
        assert 0 < result["django_statements_per_node"] < result["statements_per_node"]
        assert result["engine_overhead_ms_per_node"] > 0 and result["top_statements"]
    calls = {phase["phase"]: phase["calls_per_node"] for phase in inprocess["phases"]}
    assert calls["node_start (NodeInvocation insert, hand-off messages)"] == 1.0
    assert calls["provider (offline model)"] == 1.0 and calls["cache lookup"] == 0
    on_calls = {phase["phase"]: phase["calls_per_node"] for phase in inprocess["cache_on_misses"]["phases"]}
    assert on_calls["cache lookup"] == on_calls["cache store"] == 1.0
    inprocess["profile"] = bench_workflows.profile_inprocess(version, 2)
    assert inprocess["profile"]["top_own_time"] and inprocess["profile"]["top_cumulative_project"]

    results = {"celery": celery, "breakdown": inprocess}
    results["targets"] = bench_workflows.targets_of(results)
    assert set(results["targets"]) == {"overhead_median", "overhead_p95", "all_completed", "overhead_inprocess"}
    assert results["targets"]["all_completed"]["met"]
    assert all(target["measured"] is not None for target in results["targets"].values())
    bench_workflows.report(results)
    out = capsys.readouterr().out
    for title in ("invocations/s", "a worker's time per invocation", "engine overhead per node",
                  "where the time of a node goes", "costliest statements", "under cProfile", "targets"):
        assert title in out
    assert all(label in out for label in labels)
