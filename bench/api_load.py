"""api_load: the API under concurrent clients, served as `make run` serves it; Postgres connections bounded.

In a dedicated database (bench_api_load, dropped afterwards) and Redis database 13 (emptied
afterwards), the benchmark seeds one workspace with a member, 5,000 finished durable runs and 20
knowledge sources (ingested in-process), then starts what `make run` starts against them: gunicorn
(`config.supervisor.gunicorn_command`: 2 workers x 4 threads by default), a Celery worker (prefork, 2
processes) and beat, with DEBUG off. N clients (32 by default), each a thread with one keep-alive
HTTP connection to 127.0.0.1, send requests for `--duration` seconds (60 by default) as the member
(a token), each picking one of:

    list runs 30%, run detail 25%, list knowledge sources 10%, knowledge search (hybrid) 20%,
    start a run (durable.demo.digest) 15%

and a poller counts the database's backends in pg_stat_activity every 50 ms. It reports requests/s,
p50 / p95 / p99 latency overall and per call, every response that is neither 2xx nor 4xx (and every
transport error), and the peak number of connections against the bound the configuration sets:
(web workers + Celery processes + beat) x DATABASE_POOL_MAX_SIZE.

    make bench NAME=api_load
    python -m bench api_load [--clients 32] [--duration 60] [--web-workers 2] [--web-threads 4]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import common

NAME = "api_load"
BENCH_DB = "bench_api_load"
REDIS_DB = 13
MIX = [("list runs", 30), ("run detail", 25), ("list sources", 10), ("search", 20), ("start run", 15)]
WORDS = ["durable", "checkpoint", "replay", "lease", "worker", "signal", "timer", "schedule", "fan", "join",
         "retry", "cancel", "workspace", "knowledge", "chunk", "embedding", "search", "hybrid", "vector", "token",
         "budget", "evolution", "genome", "fitness"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_url() -> str:
    parts = urlsplit(os.environ["REDIS_URL"])
    return urlunsplit(parts._replace(path=f"/{REDIS_DB}"))


# ------------------------------------------------------------------------------------------- seeding


def seed(runs: int, sources: int) -> dict:
    """A workspace, its member (with an API token), finished runs and ingested knowledge sources."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken

    from durable.inprocess import run_until_settled
    from durable.models import DurableRun
    from knowledge import services
    from workspaces.models import Membership, Workspace

    settings.DURABLE_DISPATCH_ENABLED = False  # the ingests are driven here, before any worker runs
    rng = random.Random(8)
    user = get_user_model().objects.create_user(username="load", password="load-bench-password")
    workspace = Workspace.objects.create(name="Load", slug="load")
    Membership.objects.create(user=user, workspace=workspace, role=Membership.Role.MEMBER)
    statuses = ["completed"] * 8 + ["failed", "cancelled"]
    DurableRun.objects.bulk_create(
        [DurableRun(id=f"load-{index:06d}", workflow="durable.demo.digest", namespace=workspace.namespace,
                    status=statuses[index % 10], input='{"texts": ["a b c"]}', output='{"words": 3}')
         for index in range(runs)], batch_size=2000)
    ids = []
    for index in range(sources):
        text = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) for _ in range(8))
        source, _ = services.source_create_text(workspace=workspace, text=text, title=f"Load source {index}")
        ids.append(source)
    for source in ids:
        run_until_settled(source.ingest_run_id, max_wait=120)
    _instance, token = AuthToken.objects.create(user=user)
    return {"workspace": workspace.pk, "token": token, "run_ids": [f"load-{i:06d}" for i in range(runs)]}


# ------------------------------------------------------------------------------------------ processes


def start_installation(args, env: dict, logdir: Path) -> list[subprocess.Popen]:
    """gunicorn + Celery worker + beat, each leading its own process group, logging into logdir."""
    from config.supervisor import gunicorn_command

    python = sys.executable
    commands = {
        "web": gunicorn_command(python, "127.0.0.1", args.port, workers=args.web_workers, threads=args.web_threads),
        "worker": [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "WARNING", "--concurrency",
                   str(args.celery_concurrency), "-Q", "celery,turns,steps,llm,ingest,tick", "--hostname",
                   "apiload@%h"],
        "beat": [python, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING", "--schedule",
                 str(logdir / "celerybeat-schedule")],
    }
    processes = []
    for name, command in commands.items():
        log = (logdir / f"{name}.log").open("wb")
        processes.append(subprocess.Popen(command, env=env, cwd=common.BASE_DIR, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    return processes


def wait_until_up(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the web server did not answer /healthz within {timeout:.0f} s")


# --------------------------------------------------------------------------------------------- load


class ConnectionPoller(threading.Thread):
    """Counts the benchmark database's backends (its own excluded) every 50 ms."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.conn = common.connect(url, autocommit=True)
        self.stop = threading.Event()
        self.samples: list[int] = []
        self.peak = 0

    def count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                                 "AND pid <> pg_backend_pid()", [BENCH_DB]).fetchone()[0]

    def run(self) -> None:
        while not self.stop.is_set():
            value = self.count()
            self.samples.append(value)
            self.peak = max(self.peak, value)
            time.sleep(0.05)


class Client(threading.Thread):
    def __init__(self, index: int, port: int, token: str, workspace: int, run_ids: list[str], deadline: float):
        super().__init__(daemon=True)
        self.rng = random.Random(index)
        self.port, self.workspace, self.run_ids, self.deadline = port, workspace, run_ids, deadline
        self.headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.statuses: Counter = Counter()
        self.errors: list[dict] = []
        self.started_runs: list[str] = []
        self.conn: http.client.HTTPConnection | None = None

    def pick(self) -> tuple[str, str, str, dict | None]:
        kind = self.rng.choices([name for name, _ in MIX], weights=[weight for _, weight in MIX])[0]
        if kind == "list runs":
            status = self.rng.choice(["", "&status=completed", "&status=failed"])
            return kind, "GET", f"/api/durable/runs/?page_size=50{status}", None
        if kind == "run detail":
            run_id = self.rng.choice(self.started_runs[-20:] or self.run_ids) if self.rng.random() < 0.2 \
                else self.rng.choice(self.run_ids)
            return kind, "GET", f"/api/durable/runs/{run_id}/", None
        if kind == "list sources":
            return kind, "GET", f"/api/knowledge/sources/?workspace={self.workspace}", None
        if kind == "search":
            query = "+".join(self.rng.sample(WORDS, 3))
            return kind, "GET", f"/api/knowledge/search/?workspace={self.workspace}&query={query}&k=10", None
        body = {"workflow": "durable.demo.digest", "workspace": self.workspace,
                "input": {"texts": [" ".join(self.rng.sample(WORDS, 5))], "pause_seconds": 0}}
        return kind, "POST", "/api/durable/runs/", body

    def request(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = dict(self.headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=payload, headers=headers)
        response = self.conn.getresponse()
        return response.status, response.read()

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            kind, method, path, body = self.pick()
            start = time.perf_counter()
            try:
                status, content = self.request(method, path, body)
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append({"call": kind, "path": path, "error": f"{type(exc).__name__}: {exc}"})
                self.statuses["transport error"] += 1
                with contextlib.suppress(Exception):
                    self.conn.close()
                self.conn = None
                continue
            self.latencies[kind].append(time.perf_counter() - start)
            self.statuses[status] += 1
            if not (200 <= status < 500):
                self.errors.append({"call": kind, "path": path, "status": status, "body": content[:300].decode(
                    errors="replace")})
            elif kind == "start run" and status in (200, 201):
                with contextlib.suppress(ValueError, KeyError):
                    self.started_runs.append(json.loads(content)["id"])


def percentiles(samples: list[float]) -> dict:
    ms = [value * 1000 for value in samples]
    return {"n": len(ms), "p50_ms": round(common.percentile(ms, 50), 2), "p95_ms": round(common.percentile(ms, 95), 2),
            "p99_ms": round(common.percentile(ms, 99), 2), "max_ms": round(max(ms), 2) if ms else None}


# --------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench api_load")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--web-threads", type=int, default=4)
    parser.add_argument("--celery-concurrency", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--port", type=int, default=0, help="loopback port for the server (default: a free one)")
    args = parser.parse_args()
    args.port = args.port or _free_port()

    common.say(f"creating database {BENCH_DB}")
    common.create_database(BENCH_DB)
    try:
        return _run(args)
    finally:
        common.close_django()
        with contextlib.suppress(Exception):
            import redis

            redis.Redis.from_url(_redis_url()).flushdb()
        common.drop_database(BENCH_DB)
        common.say("benchmark database dropped, Redis database 13 emptied")


def _run(args) -> int:
    from config.supervisor import stop_process_groups

    common.setup_django(BENCH_DB)
    from django.conf import settings

    pool_max = settings.DATABASE_POOL_MAX_SIZE
    started = time.perf_counter()
    data = seed(args.runs, args.sources)
    common.say(f"seeded {args.runs:,} runs and {args.sources} ingested sources in {time.perf_counter() - started:.1f}s")
    common.close_django()
    bench_url = common.database_url(BENCH_DB)
    admin = common.connect(bench_url, autocommit=True)
    info = common.machine_info(admin)
    max_connections = int(admin.execute("SHOW max_connections").fetchone()[0])
    admin.close()

    env = {**os.environ, "DATABASE_URL": bench_url, "REDIS_URL": _redis_url(), "DEBUG": "false",
           "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "false", "LOG_LEVEL": "WARNING",
           "PYTHONUNBUFFERED": "1", "CACHE_URL": _redis_url(),
           # one member's writes are the benchmark's load, not abuse
           "API_THROTTLE_WRITE_RATE": "off"}
    env.setdefault("SECRET_KEY", "api-load-benchmark-only")
    celery_processes = args.celery_concurrency + 1  # the prefork parent and its children
    bound = (args.web_workers + celery_processes + 1) * pool_max if pool_max else None
    logdir = Path(tempfile.mkdtemp(prefix="lineage-api-load-"))
    poller = ConnectionPoller(bench_url)
    processes = start_installation(args, env, logdir)
    try:
        wait_until_up(args.port)
        idle = poller.count()
        poller.start()
        common.say(f"gunicorn ({args.web_workers} x {args.web_threads} threads), Celery worker "
                   f"(-c {args.celery_concurrency}) and beat up; {args.clients} clients for {args.duration:.0f}s")
        deadline = time.monotonic() + args.duration
        clients = [Client(i, args.port, data["token"], data["workspace"], data["run_ids"], deadline)
                   for i in range(args.clients)]
        load_started = time.perf_counter()
        for client in clients:
            client.start()
        for client in clients:
            client.join(args.duration + 120)
        elapsed = time.perf_counter() - load_started
        time.sleep(1.0)  # the worker finishing the started runs still counts towards the peak
        poller.stop.set()
        poller.join(5)
        after = poller.count()
        exited = [(p.args[2] if len(p.args) > 2 else p.args[0], p.returncode) for p in processes
                  if p.poll() is not None]
    finally:
        stop_process_groups(processes, timeout=15)
        poller.conn.close()

    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: Counter = Counter()
    errors: list[dict] = []
    started_runs = 0
    for client in clients:
        for kind, values in client.latencies.items():
            latencies[kind].extend(values)
        statuses.update(client.statuses)
        errors.extend(client.errors)
        started_runs += len(client.started_runs)
    everything = [value for values in latencies.values() for value in values]
    total = sum(statuses.values())
    rate = total / elapsed
    overall = percentiles(everything)
    per_call = {kind: percentiles(latencies[kind]) for kind, _ in MIX}
    by_status = {str(key): value for key, value in sorted(statuses.items(), key=lambda item: str(item[0]))}
    bounded = bound is not None and poller.peak <= bound

    common.print_table(
        f"api_load: {args.clients} clients, {elapsed:.0f}s, gunicorn {args.web_workers}x{args.web_threads}, "
        f"pool max {pool_max} per process (ms)",
        ["call", "requests", "p50", "p95", "p99", "max"],
        [[kind, stats["n"], stats["p50_ms"], stats["p95_ms"], stats["p99_ms"], stats["max_ms"]]
         for kind, stats in [*per_call.items(), ("all", overall)]])
    common.print_table("responses", ["status", "count"], list(by_status.items()))
    for error in errors[:20]:
        print(f"  error: {error}")
    common.print_table("Postgres connections to the benchmark database", ["measure", "value"], [
        ["idle installation (before the load)", idle], ["peak under load (50 ms samples)", poller.peak],
        ["after the load", after],
        ["bound: (web workers + Celery processes + beat) x pool max", bound],
        ["server max_connections", max_connections]])
    common.print_table("targets", ["target", "measured", "verdict"], [
        ["0 responses that are neither 2xx nor 4xx (or transport errors)", len(errors), common.verdict(not errors)],
        ["peak connections <= the configured bound", poller.peak, common.verdict(bounded)],
        ["no server process exited", len(exited), common.verdict(not exited)],
    ])
    common.say(f"{total:,} requests, {rate:,.0f} requests/s, {started_runs:,} runs started; "
               f"server logs in {logdir}")
    common.write_results(NAME, {
        "benchmark": NAME, "machine": info,
        "parameters": {"clients": args.clients, "duration_s": args.duration, "web_workers": args.web_workers,
                       "web_threads": args.web_threads, "celery_concurrency": args.celery_concurrency,
                       "database_pool_max_size": pool_max, "runs": args.runs, "sources": args.sources,
                       "mix": dict(MIX)},
        "requests": total, "elapsed_s": round(elapsed, 2), "requests_per_s": round(rate, 1),
        "latency_overall": overall, "latency_per_call": per_call, "responses": by_status,
        "errors": errors[:50], "error_count": len(errors), "runs_started": started_runs,
        "connections": {"idle": idle, "peak": poller.peak, "after": after, "bound": bound,
                        "max_connections": max_connections, "samples": len(poller.samples)},
        "exited_processes": exited,
        "targets": {"no_errors": not errors, "connections_bounded": bounded},
    })
    return 0 if not errors and bounded else 1
