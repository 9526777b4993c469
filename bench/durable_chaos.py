"""durable_chaos: the chaos suite of tests/durable/chaos.py, run longer.

A seeded mix of runs (inline and queued steps, slow steps with heartbeats and a timeout, fans with
wait_all and fail_fast, children, sleeps, signals, failing and retried steps) on 3 Celery worker
subprocesses (prefork, -c 1) that the driver SIGKILLs (the whole process group) at random points and
restarts, or SIGSTOPs for a few seconds; it also terminates workers' database connections and holds
table locks past their lock timeout now and then, runs the tick in a thread, sends signals, cancels
runs and retries failed or cancelled ones (plainly or with new input), and stages three scenarios (a
retried child then its parent, a stale worker's result against a retried attempt, a cancel during a
turn). Then the four invariants, each with its count:

1. every run ends in the state the driver expects (completed with the output it computes from the
   input, or cancelled / failed where it made it so);
2. no completed step's function started again after its checkpoint was written;
3. no run is left active past the tick's recovery horizon;
4. no checkpoint was settled twice without a delete (an operator retry) in between.

Everything runs in a dedicated database (bench_durable_chaos, dropped afterwards) and on its own Redis
database index (flushed before and after), on loopback only.

    make bench NAME=durable_chaos
    python -m bench durable_chaos [--seed N] [--duration 80] [--runs 160] [--workers 3] [--no-db-chaos]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import common

NAME = "durable_chaos"
BENCH_DB = "bench_durable_chaos"
REDIS_DB_INDEX = 12


def _redis_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{REDIS_DB_INDEX}"))


def _flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench durable_chaos")
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed, printed")
    parser.add_argument("--duration", type=float, default=80.0, help="seconds of kills, pauses and database trouble")
    parser.add_argument("--runs", type=int, default=160)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--no-db-chaos", action="store_true",
                        help="leave the database alone: no connection kills, no lock stalls")
    args = parser.parse_args()

    redis_url = _redis_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    os.environ["REDIS_URL"] = redis_url  # settings read it at set-up; the workers inherit it
    common.say(f"creating database {BENCH_DB}; Celery on Redis database {REDIS_DB_INDEX}")
    common.create_database(BENCH_DB)
    try:
        _flush_redis(redis_url)
        return _run(args)
    finally:
        common.close_django()
        common.drop_database(BENCH_DB)
        with contextlib.suppress(Exception):
            _flush_redis(redis_url)
        common.say("benchmark database dropped")


def _run(args) -> int:
    common.setup_django(BENCH_DB)
    from django.conf import settings
    from django.db import connection

    from tests.durable import chaos

    for key, value in chaos.ENGINE_SETTINGS.items():  # the driver's tick; the workers get them by environment
        setattr(settings, key, value)
    connection.ensure_connection()
    info = common.machine_info(connection.connection)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    chaos.install_side_tables()
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as log_dir:
        config = chaos.ChaosConfig(
            seed=seed, log_dir=Path(log_dir), runs=args.runs, duration=args.duration,
            start_window=max(1.0, args.duration - 15.0), workers=args.workers, log=common.say,
        )
        if args.no_db_chaos:
            config.db_kill_every = config.db_stall_every = None
        report = chaos.ChaosDriver(config).run()
    report.pop("plans")  # every run's story: the test prints it; here the details of the violations suffice

    common.print_table(f"durable_chaos: seed {seed}, {args.runs} runs, {args.workers} workers, "
                       f"{args.duration:.0f}s of chaos", ["measure", "value"], chaos.summary_rows(report))
    common.print_table("final run statuses (children included)", ["status", "runs"],
                       sorted(report["final_statuses"].items()))
    for name, rows in report["details"].items():
        if rows:
            print(f"\n{name} (first {len(rows)}):")
            for row in rows[:10]:
                print(f"  {row}")
    if report["likely_causes"]:
        common.print_table("violations by likely cause", ["likely cause", "violations"],
                           list(report["likely_causes"].items()))
    met = {name: count == 0 for name, count in report["invariants"].items()}
    common.print_table("invariants", ["invariant", "violations", "verdict"],
                       [[name, count, common.verdict(met[name])] for name, count in report["invariants"].items()])
    common.write_results(NAME, {"benchmark": NAME, "machine": info,
                                "parameters": {"seed": seed, "runs": args.runs, "workers": args.workers,
                                               "duration_s": args.duration, "db_chaos": not args.no_db_chaos},
                                **report, "targets": {f"invariant_{name}_holds": ok for name, ok in met.items()}})
    return 0
