"""durable_steps: 50 workflows x 100 sequential inline steps; ours vs DBOS Transact vs the raw limit.

All three write to the same embedded Postgres with its durable settings (fsync and synchronous_commit
on), each in its own database, and run in one process in alternating rounds (A B C A B C ...):

- ours:  `bench.sequential` (100 `ctx.step` inline calls of a trivial function), started with
         durable.services.run_start (Celery dispatch off) and driven by durable.turns.execute_turn;
- DBOS:  a `@DBOS.workflow()` calling a `@DBOS.step()` 100 times, system database on the same server;
- raw:   one prepared single-row INSERT per step through psycopg, one commit each.

Targets: ours >= 4x DBOS, ours >= 0.5x raw. `--profile` adds a cProfile of one round of ours.

    make bench NAME=durable_steps
    python -m bench durable_steps [--rounds 3] [--workflows 50] [--steps 100] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import time
import uuid
from urllib.parse import quote, unquote, urlsplit

from bench import common

NAME = "durable_steps"
BENCH_DB = "bench_durable_steps"
DBOS_DB = "bench_durable_steps_dbos"
RAW_TABLE = "bench_raw_step"
TARGET_VS_DBOS = 4.0
TARGET_VS_RAW = 0.5


# ------------------------------------------------------------------------------------------ contenders


def run_ours(workflows: int, steps: int) -> float:
    """Start and drive `workflows` runs of `steps` inline steps each; returns elapsed seconds."""
    from durable import services, turns

    started = time.perf_counter()
    for _ in range(workflows):
        run = services.run_start(workflow="bench.sequential", input={"steps": steps})
        result = turns.execute_turn(run.id)
        if result.outcome != "completed":
            raise RuntimeError(f"run {run.id} ended {result.outcome}: {result.error}")
    return time.perf_counter() - started


RAW_INSERT = f"INSERT INTO {RAW_TABLE} (run_id, seq, name, output, created_at) VALUES (%s, %s, %s, %s, now())"


def prepare_raw(conn) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
    conn.execute(f"""CREATE TABLE {RAW_TABLE} (run_id varchar(255) NOT NULL, seq integer NOT NULL,
                     name varchar(255) NOT NULL, output text NOT NULL, created_at timestamptz NOT NULL,
                     PRIMARY KEY (run_id, seq))""")


def run_raw(conn, workflows: int, steps: int) -> float:
    """One prepared single-row INSERT per step, autocommit (one commit each); returns elapsed seconds."""
    cursor = conn.cursor()
    started = time.perf_counter()
    for _ in range(workflows):
        run_id = uuid.uuid4().hex
        for index in range(steps):
            cursor.execute(RAW_INSERT, (run_id, index, f"s{index}", str(index + 1)), prepare=True)
    return time.perf_counter() - started


def run_raw_checkpoint(conn, workflows: int, steps: int) -> float:
    """Diagnostic: the engine's own INSERT_DONE_SQL into durable_stepcheckpoint, one commit each, with no
    engine around it; separates the engine's Python cost from the schema's (row width, indexes)."""
    from datetime import UTC, datetime

    from durable.store import INSERT_DONE_SQL

    cursor = conn.cursor()
    started = time.perf_counter()
    for _ in range(workflows):
        run_id = "raw-" + uuid.uuid4().hex
        for index in range(steps):
            now = datetime.now(UTC)
            cursor.execute(INSERT_DONE_SQL, (run_id, index, f"s{index}", "step", str(index + 1), 1, 0, now, now),
                           prepare=True)
    return time.perf_counter() - started


class DbosContender:
    """DBOS Transact with its system database on the same server; no Conductor, no OTLP."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        # SQLAlchemy wants a unix-socket directory as the `host` query parameter
        socket_dir = unquote(parts.hostname or "")
        user = parts.username or "postgres"
        self.sys_url = f"postgresql://{user}@/{DBOS_DB}?host={quote(socket_dir, safe='')}"
        self.workflow = None

    def start(self) -> None:
        from dbos import DBOS

        logging.getLogger("dbos").setLevel(logging.WARNING)
        DBOS(config={
            "name": "lineage-bench",
            "system_database_url": self.sys_url,
            "log_level": "WARNING",
            "enable_otlp": False,
            "executor_id": "bench",
        })

        @DBOS.step()
        def dbos_trivial(index):
            return index + 1

        @DBOS.workflow()
        def dbos_sequential(steps):
            value = 0
            for index in range(steps):
                value = dbos_trivial(index)
            return value

        self.workflow = dbos_sequential
        DBOS.launch()

    def run(self, workflows: int, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(workflows):
            if self.workflow(steps) != steps:
                raise RuntimeError("DBOS workflow returned a wrong result")
        return time.perf_counter() - started

    def stop(self) -> None:
        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)


# ------------------------------------------------------------------------------------------- profile


def profile_ours(workflows: int, steps: int) -> dict:
    """cProfile one round of ours; returns the top functions by cumulative and by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    elapsed = run_ours(workflows, steps)
    profiler.disable()
    total_steps = workflows * steps
    out = {}
    for key in ("tottime", "cumulative"):
        buffer = io.StringIO()
        stats = pstats.Stats(profiler, stream=buffer)
        stats.sort_stats(key).print_stats(25)
        out[key] = buffer.getvalue()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        rows.append({"function": f"{filename.rsplit('/', 2)[-1] if '/' in filename else filename}:{line}({func})",
                     "calls": ncalls, "own_us_per_step": round(tottime / total_steps * 1e6, 2),
                     "cum_us_per_step": round(cumtime / total_steps * 1e6, 2)})
    rows.sort(key=lambda r: r["own_us_per_step"], reverse=True)
    # time blocked on the server (psycopg's wait loop: round trip, execution, commit flush) vs Python
    waiting = sum(tottime for (filename, _line, func), (_cc, _n, tottime, _cum, _callers) in stats.stats.items()
                  if "psycopg" in filename and func.startswith("wait"))
    per_step = elapsed / total_steps * 1e6
    return {"elapsed_s_under_profiler": round(elapsed, 3), "us_per_step_under_profiler": round(per_step, 1),
            "db_wait_us_per_step": round(waiting / total_steps * 1e6, 1),
            "python_us_per_step": round(per_step - waiting / total_steps * 1e6, 1),
            "top_own_time": rows[:25], "text": out}


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench durable_steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=50)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the cProfile of one extra round of ours")
    parser.add_argument("--skip-dbos", action="store_true")
    args = parser.parse_args()

    common.say(f"creating databases {BENCH_DB} and {DBOS_DB} on the embedded server")
    url = common.create_database(BENCH_DB)
    dbos_url = common.create_database(DBOS_DB)
    try:
        return _run(args, url, dbos_url)
    finally:
        common.close_django()
        common.drop_database(BENCH_DB)
        common.drop_database(DBOS_DB)
        common.say("benchmark databases dropped")


def _run(args, url: str, dbos_url: str) -> int:
    common.setup_django(BENCH_DB)
    from django.conf import settings

    import bench.durable_workflows  # noqa: F401 - registers bench.sequential

    settings.DURABLE_DISPATCH_ENABLED = False
    raw_conn = common.connect(url, autocommit=True)
    prepare_raw(raw_conn)
    info = common.machine_info(raw_conn)
    common.say(f"Postgres {info['postgres']['server_version']}: fsync={info['postgres']['fsync']}, "
               f"synchronous_commit={info['postgres']['synchronous_commit']}")

    dbos = None
    if not args.skip_dbos:
        dbos = DbosContender(dbos_url)
        dbos.start()

    total = args.workflows * args.steps
    # warm-up: prepared statements, imports, DBOS's first connections (not measured)
    run_ours(2, args.steps)
    run_raw(raw_conn, 2, args.steps)
    run_raw_checkpoint(raw_conn, 2, args.steps)
    if dbos:
        dbos.run(2, args.steps)

    rounds = []
    for number in range(1, args.rounds + 1):
        entry = {"round": number}
        entry["ours_s"] = run_ours(args.workflows, args.steps)
        if dbos:
            entry["dbos_s"] = dbos.run(args.workflows, args.steps)
        entry["raw_s"] = run_raw(raw_conn, args.workflows, args.steps)
        entry["raw_checkpoint_s"] = run_raw_checkpoint(raw_conn, args.workflows, args.steps)
        for key in ("ours", "dbos", "raw", "raw_checkpoint"):
            if f"{key}_s" in entry:
                entry[f"{key}_steps_per_s"] = round(total / entry[f"{key}_s"], 1)
        rounds.append(entry)
        common.say(f"round {number}: ours {entry['ours_steps_per_s']:,.0f}/s, "
                   f"DBOS {entry.get('dbos_steps_per_s', float('nan')):,.0f}/s, raw {entry['raw_steps_per_s']:,.0f}/s")
    if dbos:
        dbos.stop()

    profile = profile_ours(args.workflows, args.steps) if args.profile else None
    raw_conn.close()

    def overall(key):
        seconds = sum(r[f"{key}_s"] for r in rounds if f"{key}_s" in r)
        return round(total * len(rounds) / seconds, 1) if seconds else None

    ours, raw, raw_cp = overall("ours"), overall("raw"), overall("raw_checkpoint")
    dbos_rate = overall("dbos") if dbos else None
    vs_dbos = round(ours / dbos_rate, 2) if dbos_rate else None
    vs_raw = round(ours / raw, 3)

    common.print_table(
        f"durable_steps: {args.workflows} workflows x {args.steps} sequential steps, {args.rounds} rounds (steps/s)",
        ["round", "ours", "DBOS 3.4", "raw INSERT+commit", "(diag) engine INSERT alone"],
        [[r["round"], r["ours_steps_per_s"], r.get("dbos_steps_per_s"), r["raw_steps_per_s"],
          r["raw_checkpoint_steps_per_s"]] for r in rounds]
        + [["all", ours, dbos_rate, raw, raw_cp]],
    )
    common.print_table(
        "per step",
        ["contender", "steps/s", "ms/step"],
        [["ours", ours, 1000 / ours], ["DBOS", dbos_rate, 1000 / dbos_rate if dbos_rate else None],
         ["raw", raw, 1000 / raw],
         ["(diag) engine's INSERT_DONE_SQL alone, same table", raw_cp, 1000 / raw_cp]],
    )
    targets = [
        ["ours / DBOS", vs_dbos, f">= {TARGET_VS_DBOS}",
         common.verdict(vs_dbos >= TARGET_VS_DBOS) if vs_dbos is not None else "not run"],
        ["ours / raw", vs_raw, f">= {TARGET_VS_RAW}", common.verdict(vs_raw >= TARGET_VS_RAW)],
    ]
    common.print_table("targets", ["ratio", "measured", "target", "verdict"], targets)
    if profile:
        print(f"\nours under cProfile: {profile['us_per_step_under_profiler']} us a step, of which "
              f"{profile['db_wait_us_per_step']} us waiting on Postgres (psycopg wait) and "
              f"{profile['python_us_per_step']} us of Python (profiler overhead included)")
        common.print_table("ours under cProfile: top own time per step (us)", ["function", "calls", "own us", "cum us"],
                           [[r["function"], r["calls"], r["own_us_per_step"], r["cum_us_per_step"]]
                            for r in profile["top_own_time"][:15]])

    common.write_results(NAME, {
        "benchmark": NAME,
        "description": "sequential inline steps: ours (run_start + execute_turn in-process) vs DBOS Transact vs "
                       "one prepared single-row INSERT per step with one commit each, alternating rounds",
        "machine": info,
        "parameters": {"workflows": args.workflows, "steps_per_workflow": args.steps, "rounds": args.rounds,
                       "order": "ours, DBOS, raw, then the diagnostic in each round", "django_debug": False,
                       "dbos_system_database": "separate database on the same server"},
        "rounds": rounds,
        "steps_per_s": {"ours": ours, "dbos": dbos_rate, "raw": raw, "diagnostic_engine_insert_alone": raw_cp},
        "ms_per_step": {"ours": round(1000 / ours, 4), "dbos": round(1000 / dbos_rate, 4) if dbos_rate else None,
                        "raw": round(1000 / raw, 4), "diagnostic_engine_insert_alone": round(1000 / raw_cp, 4)},
        "ratios": {"ours_vs_dbos": vs_dbos, "ours_vs_raw": vs_raw},
        "targets": {
            "ours_vs_dbos": {"target": f">= {TARGET_VS_DBOS}", "measured": vs_dbos,
                             "met": vs_dbos is not None and vs_dbos >= TARGET_VS_DBOS},
            "ours_vs_raw": {"target": f">= {TARGET_VS_RAW}", "measured": vs_raw, "met": vs_raw >= TARGET_VS_RAW},
        },
        "profile": {k: v for k, v in profile.items() if k != "text"} if profile else None,
    })
    return 0
