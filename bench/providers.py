"""providers: the platform against a slow provider, and the ceiling it is measured against.

A local OpenAI-compatible server answers every chat call after `--latency` seconds (1.0); every model
call of the platform goes to it through the real `openai` client. It speaks HTTP/1.1 with keep-alive, as
providers do, so the platform's clients and the ceiling's reuse their connections instead of opening one
a call. The platform runs as `make run` runs
it: a prefork worker (2 processes: turns, steps, the tick's queue) and the llm worker (one process, a
threads pool of LLM_MAX_IN_FLIGHT = `--in-flight`, 64), in a dedicated database (bench_providers,
dropped afterwards) with Celery on Redis database 13 (emptied afterwards); this process ticks the engine
twice a second (beat's work) and samples Postgres connections and the workers' memory.

Scenarios (node models are bare names, so they go to the server; distinct inputs, cache off):
  seq3        `--invocations` (200) invocations of a 3-node sequential workflow;
  fan         `--fans` (20) invocations of a 1 -> 16 -> 1 fan (16 parallel branches, then a join);
  eval        one eval run of `--eval-items` (100) items of a 3-node agent (token F1 grader, no judge),
              at `--eval-concurrency` lanes (default: EVAL_CONCURRENCY's default, 128; its items are dealt to
              that many lanes, child runs taking their items one after the other; an EVAL_CONCURRENCY in the
              environment is ignored);
  evolution   one generation of a GP evolution (population 8, `--evolution-items` (10) items);
  rate-limit  the seq3 workflow against a server that allows `--rpm` requests a minute and answers 429
              with Retry-After past it; the platform is told the same limit (LLM_PROVIDERS
              requests_per_minute), so it should wait on timers, never lose a call, and use the window;
              with `--unannounced` the workers are not told, so every call past the window is a 429 whose
              Retry-After is waited out on a durable timer (the server counts the refusals).

Reported for each: wall time (from the call that starts the work to the last invocation's end; what it
runs on, its workflow version and golden set, is made before), the time that call took, calls
answered, peak calls in flight (at the server), calls/s, engine time per call (per invocation: span /
calls on its critical path - the latency; median and p95), peak Postgres connections of the benchmark
database, peak RSS of the worker processes, the workers' CPU time per call (each worker's main process and
its pool processes apart), and, in the same run, the ceiling: the same calls, with the same dependencies, made by
`openai.AsyncOpenAI` under an asyncio semaphore of `--in-flight` with no persistence. Targets: every
scenario >= 0.8x the ceiling's calls/s; the rate-limited variant loses no call and starts >= 0.9 of what
the window allows over its span (N starts per minute begun, counted at the server).

    make bench NAME=providers
    python -m bench providers [--quick] [--latency 1.0] [--in-flight 64] [--only seq3,fan,...]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import common

NAME = "providers"
BENCH_DB = "bench_providers"
REDIS_DB_INDEX = 13
TARGET_RATIO = 0.8
TARGET_RATE_SHARE = 0.9
MODEL = "gpt-4.1-mini"
SCENARIOS = ("seq3", "fan", "eval", "evolution", "rate-limit")


# ------------------------------------------------------------------------------------- the provider


class SlowProvider:
    """POST /v1/chat/completions answered after `latency` seconds ("ok", small usage); with `per_minute`
    a request past that many starts in the last 60 s gets 429 and the Retry-After of the next free start.
    Counts calls in flight (and their peak), answered calls and their start times, and refusals."""

    def __init__(self, *, latency: float, per_minute: int | None = None):
        self.latency = latency
        self.per_minute = per_minute
        self.lock = threading.Lock()
        self.reset()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: every answer carries its Content-Length

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                status, headers, body = provider.answer(json.loads(self.rfile.read(length) or b"{}"))
                payload = body.encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def reset(self) -> None:
        with self.lock:
            self.in_flight = self.peak = self.answered = self.refused = 0
            self.starts: list[float] = []
            self._window: deque[float] = deque()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, payload: dict) -> tuple[int, dict, str]:
        now = time.monotonic()
        with self.lock:
            if self.per_minute:
                while self._window and self._window[0] <= now - 60:
                    self._window.popleft()
                if len(self._window) >= self.per_minute:
                    self.refused += 1
                    wait = max(1, math.ceil(self._window[0] + 60 - now))
                    return 429, {"Content-Type": "application/json", "Retry-After": str(wait)}, json.dumps(
                        {"error": {"message": "Rate limit reached for requests", "type": "requests"}})
                self._window.append(now)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.starts.append(now)
        try:
            time.sleep(self.latency)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.answered += 1
        answer = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": payload.get("model"),
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer)


def window_share(starts: list[float], per_minute: int) -> float:
    """Starts made over what a window of `per_minute` a minute allows from the first start to the last
    (`per_minute` for every minute begun)."""
    if not starts:
        return 0.0
    span = max(starts) - min(starts)
    return len(starts) / (per_minute * (math.floor(span / 60) + 1))


def in_flight_profile(starts: list[float], latency: float, step: float = 0.5) -> list[int]:
    """Calls in flight at the middle of each `step` seconds from the first start (a call is in flight for
    `latency` from its start): where the run kept the provider busy and where it left it waiting."""
    if not starts:
        return []
    first, last = min(starts), max(starts) + latency
    ordered = sorted(starts)
    profile, at = [], first + step / 2
    while at < last:
        profile.append(bisect.bisect_right(ordered, at) - bisect.bisect_right(ordered, at - latency))
        at += step
    return profile


# -------------------------------------------------------------------------------------- the ceiling


def ceiling(url: str, chains: list[list[int]], in_flight: int) -> dict:
    """The same calls with no platform: each chain is a list of levels (calls made at once), the levels
    of a chain one after another, every chain at once, at most `in_flight` calls in flight."""
    import openai

    async def run() -> float:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0, timeout=120)
        gate = asyncio.Semaphore(in_flight)

        async def call():
            async with gate:
                await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])

        async def chain(levels: list[int]):
            for width in levels:
                await asyncio.gather(*(call() for _ in range(width)))

        started = time.perf_counter()
        await asyncio.gather(*(chain(levels) for levels in chains))
        elapsed = time.perf_counter() - started
        await client.close()
        return elapsed

    calls = sum(sum(levels) for levels in chains)
    wall = asyncio.run(run())
    return {"calls": calls, "wall_s": round(wall, 3), "calls_per_s": round(calls / wall, 2)}


# ---------------------------------------------------------------------------------------- platform


def redis_url_for_bench(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{REDIS_DB_INDEX}"))


def worker_environment(url: str, in_flight: int, per_minute: int | None = None) -> dict[str, str]:
    env = {"LLM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": url,
           "LLM_CACHE_ENABLED": "false", "LLM_MAX_IN_FLIGHT": str(in_flight), "DEBUG": "false",
           "PYTHONUNBUFFERED": "1"}
    if per_minute:
        env["LLM_PROVIDERS"] = json.dumps({"openai": {"base_url": url, "requests_per_minute": per_minute}})
    return env


class Platform:
    """The prefork worker and the llm worker as `make run` starts them, logging into `log_dir`."""

    def __init__(self, log_dir: Path, env: dict[str, str], in_flight: int, database_url: str | None = None):
        from config.supervisor import llm_worker_command

        python = sys.executable
        self.env = {**os.environ, **env, **({"DATABASE_URL": database_url} if database_url else {})}
        suffix = f"{os.getpid()}-{time.monotonic_ns()}"
        self.commands = {
            "worker": [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "--concurrency", "2",
                       "-Q", "celery,turns,steps,ingest", "--hostname", f"benchturns-{suffix}@%h",
                       "--without-gossip", "--without-mingle"],
            "llm-worker": [*llm_worker_command(python, in_flight=in_flight, hostname=f"benchllm-{suffix}@%h"),
                           "--without-gossip", "--without-mingle"],
        }
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []

    def start(self, timeout: float = 90.0) -> float:
        started = time.perf_counter()
        logs = []
        for name, command in self.commands.items():
            log = self.log_dir / f"{name}.log"
            logs.append(log)
            self.processes.append(subprocess.Popen(command, env=self.env, cwd=common.BASE_DIR, stdout=log.open("wb"),
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"a worker exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            if all(" ready." in log.read_text(errors="replace") for log in logs):
                return time.perf_counter() - started
            time.sleep(0.2)
        raise RuntimeError("the workers were not ready within the timeout")

    def stop(self) -> None:
        from config.supervisor import stop_process_groups

        stop_process_groups(self.processes, timeout=20)
        self.processes.clear()

    def rss_mb(self) -> float:
        import psutil

        total = 0
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(process.pid)
                total += sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
        return total / 1024 / 1024

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each worker's processes have used so far: in all, and apart for its main
        process (a prefork worker's consumer, which reads, hands out and acknowledges every message) and,
        when it has any, its pool processes (which run the tasks)."""
        import psutil

        used = {}
        for name, process in zip(self.commands, self.processes, strict=True):
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(process.pid)
                main = sum(parent.cpu_times()[:2])
                pool = sum(sum(child.cpu_times()[:2]) for child in parent.children(recursive=True))
                used[name] = main + pool
                used[f"{name} main"] = main
                if pool:
                    used[f"{name} pool"] = pool
        return used

    def errors(self) -> list[str]:
        lines = []
        for log in self.log_dir.glob("*.log"):
            lines += [line for line in log.read_text(errors="replace").splitlines()
                      if "ERROR" in line or "Traceback" in line or "CRITICAL" in line]
        return lines[:20]


class Sampler:
    """Ticks the engine (beat's work) and samples the benchmark database's connections and the workers'
    memory, in a thread of its own, until stopped."""

    def __init__(self, platform: Platform, database: str):
        self.platform, self.database = platform, database
        self.connections = self.rss = 0.0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(10)

    def _loop(self) -> None:
        from django.db import connection

        from durable import tick

        try:
            while not self._stop.wait(0.5):
                with contextlib.suppress(Exception):
                    tick.tick()
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.database])
                    # less this sampler's own connection
                    self.connections = max(self.connections, cursor.fetchone()[0] - 1)
                self.rss = max(self.rss, self.platform.rss_mb())
        finally:
            connection.close()


# --------------------------------------------------------------------------------------- scenarios


def _workspace():
    from workspaces.models import Workspace

    workspace, _ = Workspace.objects.get_or_create(slug="bench-providers", defaults={"name": "bench providers"})
    return workspace


def _node(node_id: str, prompt: str, handoffs: list[str], kind: str = "sequential", wait_for=()) -> dict:
    return {"nodeId": node_id, "systemPrompt": prompt, "modelName": MODEL, "handOffs": handoffs,
            "handOffType": kind, "waitFor": list(wait_for), "codeTools": [], "mcpTools": [], "maxSteps": 1}


def sequential_version(name: str):
    from workflows.services import workflow_create, workflow_version_create

    dsl = {"entryNodeId": "plan", "nodes": [_node("plan", "You plan.", ["draft"]),
                                            _node("draft", "You draft.", ["review"]),
                                            _node("review", "You review.", ["end"])]}
    version, _ = workflow_version_create(workflow=workflow_create(workspace=_workspace(), name=name), dsl=dsl)
    return version


def fan_version(width: int = 16):
    from workflows.services import workflow_create, workflow_version_create

    branches = [f"branch{index}" for index in range(width)]
    dsl = {"entryNodeId": "split", "nodes": [
        _node("split", "You split the task.", branches, kind="parallel"),
        *(_node(name, f"You work on part {name}.", ["join"]) for name in branches),
        _node("join", "You join the parts.", ["end"], wait_for=branches)]}
    version, _ = workflow_version_create(workflow=workflow_create(workspace=_workspace(), name="fan"), dsl=dsl)
    return version


def start_invocations(version, count: int, label: str, *, node_budget: int | None = None) -> list:
    from django.db import transaction

    from workflows.services import invocation_start

    with transaction.atomic():  # every turn is dispatched at this commit
        return [invocation_start(version=version, input={"text": f"{label} {index}"}, node_budget=node_budget)
                for index in range(count)]


def golden_set(items: int, label: str, workflow=None):
    from evals.services import golden_item_add, golden_set_create

    gold = golden_set_create(workspace=_workspace(), name=f"{label} set", workflow=workflow,
                             graders=[{"kind": "token_f1"}])
    for index in range(items):
        golden_item_add(golden_set=gold, input={"text": f"{label} question {index}"}, expected_output="ok")
    return gold


def wait_rows(rows, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(row.status in type(row).TERMINAL for row in rows if row.refresh_from_db() or True):
            return True
        time.sleep(0.25)
    return False


def _invocations_since(first_id: int):
    from workflows.models import WorkflowInvocation

    return list(WorkflowInvocation.objects.filter(pk__gt=first_id).order_by("pk"))


def _last_invocation_id() -> int:
    from workflows.models import WorkflowInvocation

    return WorkflowInvocation.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def measure(name: str, prepare, *, levels: int, server: SlowProvider, platform: Platform, database: str,
            timeout: float) -> dict:
    """Run one scenario and measure it (module docstring): `prepare()` makes what it runs on and returns
    `start`, timed from its call; `start()` returns the rows to wait for."""
    from django.utils import timezone

    start = prepare()
    server.reset()
    before = _last_invocation_id()
    common.say(f"{name}: starting")
    cpu_before = platform.cpu_seconds()
    with Sampler(platform, database) as sampler:
        began = timezone.now()
        rows = start()
        start_s = (timezone.now() - began).total_seconds()
        finished = wait_rows(rows, timeout)
    cpu = {key: value - cpu_before.get(key, 0.0) for key, value in platform.cpu_seconds().items()}
    invocations = _invocations_since(before)
    ends = [row.ended_at for row in invocations if row.ended_at]
    wall = ((max(ends) - began).total_seconds() if ends else float("nan"))
    engine = [((row.ended_at - row.started_at).total_seconds() / levels - server.latency) * 1000
              for row in invocations if row.started_at and row.ended_at and row.status == "completed"]
    statuses: dict[str, int] = {}
    for row in invocations:
        statuses[row.status] = statuses.get(row.status, 0) + 1
    result = {
        "scenario": name, "finished": finished, "invocations": len(invocations), "statuses": statuses,
        "rows": [f"{type(row).__name__} {row.status}" for row in rows[:3]],
        "start_call_s": round(start_s, 3), "calls": server.answered, "refused_429": server.refused,
        "wall_s": round(wall, 3),
        "peak_in_flight": server.peak, "calls_per_s": round(server.answered / wall, 2) if wall else None,
        "engine_ms_per_call": {"median": round(common.median(engine), 1) if engine else None,
                               "p95": round(common.percentile(engine, 95), 1) if engine else None,
                               "definition": f"(invocation span / {levels} calls on its critical path) - latency"},
        "peak_postgres_connections": int(sampler.connections), "peak_worker_rss_mb": round(sampler.rss, 1),
        "worker_cpu_ms_per_call": {key: round(value * 1000 / max(1, server.answered), 1) for key, value in cpu.items()},
        "starts": server.starts,
    }
    common.say(f"{name}: {server.answered} calls in {wall:.1f}s, {result['calls_per_s']} calls/s, peak "
               f"{server.peak} in flight; CPU ms a call: {result['worker_cpu_ms_per_call']}")
    return result


def scenario_starts(args) -> dict:
    """name -> (prepare, critical-path calls per invocation, the ceiling's chains). `prepare()` makes what
    the scenario runs on (its workflow version, its golden set) and returns `start`, which starts the
    work and returns the rows to wait for: only `start` is timed."""
    def seq3():
        version = sequential_version("seq3")
        return lambda: start_invocations(version, args.invocations, "seq3")

    def fan():
        version = fan_version()
        return lambda: start_invocations(version, args.fans, "fan", node_budget=18)  # 1 + 16 + 1 nodes

    def eval_run():
        from evals.services import eval_run_start

        version = sequential_version("eval agent")
        gold = golden_set(args.eval_items, "eval", version.workflow)

        def start():
            run = eval_run_start(golden_set=gold, version=version, concurrency=args.eval_concurrency)
            common.say(f"eval: {run.config['concurrency']} lanes at most"
                       f"{'' if args.eval_concurrency else ' (EVAL_CONCURRENCY default)'}")
            return [run]
        return start

    def evolution():
        from evolution.services import evolution_start

        version = sequential_version("evolved agent")
        gold = golden_set(args.evolution_items, "evolution", version.workflow)
        return lambda: [evolution_start(workflow=version.workflow, golden_set=gold, base_version=version,
                                        config={"population": 8, "generations": 1, "seed": 1})]

    return {
        "seq3": (seq3, 3, [[1, 1, 1]] * args.invocations),
        "fan": (fan, 3, [[1, 16, 1]] * args.fans),
        "eval": (eval_run, 3, [[1, 1, 1]] * args.eval_items),
        "evolution": (evolution, 3, None),  # the ceiling takes the calls the run made, as chains of three
    }


def warm_up_the_caller() -> None:
    """This process starts the work as a web process would, and loads what a web process loads as it boots
    (config/wsgi.py): the provider client and the price database, which a start's USD budget check reads."""
    from llm.chat import load_provider_libraries

    load_provider_libraries()


def run_scenarios(args, *, database: str, database_url: str | None = None) -> dict:
    """Every scenario of `args.only` on one platform against one server, then the rate-limited variant on
    its own, each with its ceiling."""
    results: dict = {"scenarios": [], "worker_errors": []}
    wanted = [name for name in args.only if name in SCENARIOS]
    warm_up_the_caller()
    with tempfile.TemporaryDirectory(prefix="bench-providers-") as log_dir:
        plain = [name for name in wanted if name != "rate-limit"]
        if plain:
            with SlowProvider(latency=args.latency) as server:
                platform = Platform(Path(log_dir) / "plain", worker_environment(server.url, args.in_flight),
                                    args.in_flight, database_url)
                platform.log_dir.mkdir()
                try:
                    common.say(f"workers ready in {platform.start():.1f}s (llm worker: {args.in_flight} threads)")
                    starts = scenario_starts(args)
                    for name in plain:
                        prepare, levels, chains = starts[name]
                        result = measure(name, prepare, levels=levels, server=server, platform=platform,
                                         database=database, timeout=args.timeout)
                        chains = chains or [[1, 1, 1]] * max(1, result["calls"] // 3)
                        result["in_flight_each_half_second"] = in_flight_profile(result.pop("starts"), args.latency)
                        server.reset()
                        result["ceiling"] = ceiling(server.url, chains, args.in_flight)
                        result["ceiling"]["in_flight_each_half_second"] = in_flight_profile(server.starts, args.latency)
                        result["ratio"] = _ratio(result)
                        results["scenarios"].append(result)
                finally:
                    platform.stop()
                    results["worker_errors"] += platform.errors()
        if "rate-limit" in wanted:
            results["rate_limited"] = run_rate_limited(args, Path(log_dir) / "limited", database=database,
                                                       database_url=database_url)
    return results


def run_rate_limited(args, log_dir: Path, *, database: str, database_url: str | None) -> dict:
    log_dir.mkdir()
    with SlowProvider(latency=args.latency, per_minute=args.rpm) as server:
        told = None if args.unannounced else args.rpm
        platform = Platform(log_dir, worker_environment(server.url, args.in_flight, per_minute=told),
                            args.in_flight, database_url)
        try:
            common.say(f"rate-limited variant: {args.rpm} requests a minute "
                       f"({'not told to' if args.unannounced else 'told to'} the workers); "
                       f"workers ready in {platform.start():.1f}s")
            count = args.rate_invocations

            def prepare():
                version = sequential_version("limited")
                return lambda: start_invocations(version, count, "limited")

            result = measure("rate-limit", prepare, levels=3, server=server, platform=platform, database=database,
                             timeout=args.timeout)
        finally:
            platform.stop()
            errors = platform.errors()
    starts = result.pop("starts")
    result.update(requests_per_minute=args.rpm, limit_told_to_workers=not args.unannounced, expected_calls=3 * count,
                  lost_calls=3 * count - result["calls"], failed_invocations=count - result["statuses"].get(
                      "completed", 0), window_share=round(window_share(starts, args.rpm), 3),
                  start_span_s=round(max(starts) - min(starts), 1) if starts else None, worker_errors=errors)
    return result


def _ratio(result: dict) -> float | None:
    ours, ceiling_ = result.get("calls_per_s"), result["ceiling"]["calls_per_s"]
    return round(ours / ceiling_, 3) if ours and ceiling_ else None


def targets_of(results: dict) -> dict:
    targets = {}
    for scenario in results["scenarios"]:
        targets[f"{scenario['scenario']}_vs_ceiling"] = {
            "target": f">= {TARGET_RATIO}x the ceiling's calls/s", "measured": scenario["ratio"],
            "met": bool(scenario["ratio"] and scenario["ratio"] >= TARGET_RATIO)}
    limited = results.get("rate_limited")
    if limited:
        targets["rate_limit_no_lost_call"] = {"target": "0 calls lost", "measured": limited["lost_calls"],
                                              "met": limited["lost_calls"] == 0 and limited["failed_invocations"] == 0}
        if limited.get("limit_told_to_workers", True):  # untold, the workers learn the limit from its 429s only
            targets["rate_limit_window_share"] = {"target": f">= {TARGET_RATE_SHARE} of the allowed starts",
                                                  "measured": limited["window_share"],
                                                  "met": limited["window_share"] >= TARGET_RATE_SHARE}
    return targets


def report(results: dict) -> None:
    rows = []
    for item in [*results["scenarios"], *([results["rate_limited"]] if results.get("rate_limited") else [])]:
        ceiling_ = item.get("ceiling") or {}
        rows.append([item["scenario"], item["calls"], item["wall_s"], item["peak_in_flight"], item["calls_per_s"],
                     ceiling_.get("calls_per_s"), item.get("ratio"), item["engine_ms_per_call"]["median"],
                     item["engine_ms_per_call"]["p95"], item["peak_postgres_connections"], item["peak_worker_rss_mb"]])
    common.print_table(f"providers: {results['parameters']['latency_s']} s a call, LLM_MAX_IN_FLIGHT="
                       f"{results['parameters']['in_flight']}",
                       ["scenario", "calls", "wall s", "peak in flight", "calls/s", "ceiling calls/s", "ratio",
                        "engine ms/call", "p95", "peak pg conns", "worker RSS MB"], rows)
    limited = results.get("rate_limited")
    if limited:
        print(f"\nrate-limited: {limited['requests_per_minute']} requests/min; {limited['calls']} of "
              f"{limited['expected_calls']} calls answered, {limited['refused_429']} answered 429, "
              f"{limited['failed_invocations']} invocations failed; starts {limited['window_share']} of what the "
              f"window allows over {limited['start_span_s']} s")
    print("\ntargets:")
    for key, target in results["targets"].items():
        print(f"  {key}: {target['target']}: measured {target['measured']}: {common.verdict(target['met'])}")


def parse(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench providers")
    parser.add_argument("--quick", action="store_true", help="smaller scenarios (about two minutes in all)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the server takes to answer")
    parser.add_argument("--in-flight", type=int, default=64, help="LLM_MAX_IN_FLIGHT and the ceiling's semaphore")
    parser.add_argument("--invocations", type=int, default=None, help="seq3 invocations (200; quick 60)")
    parser.add_argument("--fans", type=int, default=None, help="fan invocations (20; quick 6)")
    parser.add_argument("--eval-items", type=int, default=None, help="eval run items (100; quick 30)")
    parser.add_argument("--evolution-items", type=int, default=None, help="evolution items (10; quick 5)")
    parser.add_argument("--eval-concurrency", type=int, default=None, help="the eval run's lanes (EVAL_CONCURRENCY)")
    parser.add_argument("--rpm", type=int, default=None, help="the rate-limited server's requests a minute")
    parser.add_argument("--unannounced", action="store_true",
                        help="the rate-limited variant's workers are not told the limit: past it, every call is "
                             "answered 429 with Retry-After and waits on a durable timer")
    parser.add_argument("--rate-invocations", type=int, default=None, help="seq3 invocations against it")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one scenario")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"invocations": (200, 60), "fans": (20, 6), "eval_items": (100, 30), "evolution_items": (10, 5),
                "rpm": (240, 120), "rate_invocations": (160, 80)}
    for key, (full, small) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if quick else full)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    return args


def main() -> int:
    args = parse()
    redis_url = redis_url_for_bench(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    os.environ["REDIS_URL"] = redis_url
    os.environ.pop("EVAL_CONCURRENCY", None)  # the eval scenario runs at the default, here and in the workers
    # this process starts the invocations: it resolves their models as the workers do
    os.environ.update(LLM_PROVIDER="openai", OPENAI_API_KEY="sk-bench", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    common.say(f"creating database {BENCH_DB}; Celery on Redis database {REDIS_DB_INDEX}")
    common.create_database(BENCH_DB)
    try:
        from bench.durable_fan import flush_redis

        flush_redis(redis_url)
        common.setup_django(BENCH_DB)
        from django.db import connection

        from evals.conf import eval_settings

        connection.ensure_connection()
        results = {"benchmark": NAME, "machine": common.machine_info(connection.connection),
                   "parameters": {"latency_s": args.latency, "in_flight": args.in_flight, "quick": args.quick,
                                  "invocations": args.invocations, "fans": args.fans, "fan_width": 16,
                                  "eval_items": args.eval_items,
                                  "eval_concurrency": args.eval_concurrency or eval_settings().concurrency,
                                  "evolution_items": args.evolution_items,
                                  "evolution_population": 8, "rpm": args.rpm,
                                  "rate_invocations": args.rate_invocations, "model": MODEL,
                                  "workers": "prefork -c 2 (celery,turns,steps,ingest) + llm threads -c in_flight"}}
        results.update(run_scenarios(args, database=BENCH_DB))
        results["targets"] = targets_of(results)
        results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        report(results)
        common.write_results(NAME, results)
        return 0
    finally:
        common.close_django()
        common.drop_database(BENCH_DB)
        with contextlib.suppress(Exception):
            from bench.durable_fan import flush_redis

            flush_redis(redis_url)
        common.say("benchmark database dropped")
