"""The engine under chaos: a mix of workflows on real Celery workers that are SIGKILLed and restarted at
random points, with worker database connections terminated and runs cancelled and retried; then the
four invariants of tests/durable/chaos.py. A failure prints its seed: CHAOS_SEED=<seed> replays the same
plan of runs, kills and operator actions (the interleavings still vary with timing)."""

import json
import os
import random

import pytest

from tests.durable import chaos

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _engine_settings(settings):
    # the driver's tick reads these; the workers get the same through their environment
    for key, value in chaos.ENGINE_SETTINGS.items():
        setattr(settings, key, value)


@pytest.fixture
def side_tables():
    chaos.install_side_tables()
    yield
    chaos.drop_side_tables()


def test_runs_end_right_whatever_is_killed(side_tables, tmp_path):
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
    report = chaos.ChaosDriver(chaos.ChaosConfig(seed=seed, log_dir=tmp_path)).run()
    shown = ("seed", "counts", "invariants", "likely_causes", "context", "details", "final_statuses",
             "tick_phase_errors", "worker_log_errors", "timings_s")
    text = json.dumps({key: report[key] for key in shown}, indent=1, default=str)
    print(json.dumps({"plans": report["plans"]}, indent=1, default=str))  # every run's story, shown on failure
    print(text)

    counts = report["counts"]
    assert counts["kills"] and counts["restarts"] and counts["cancels"] and counts["retries"], text
    assert report["invariants"] == {name: 0 for name in report["invariants"]}, f"CHAOS_SEED={seed}\n{text}"
