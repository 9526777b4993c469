"""Real Celery worker subprocesses whose model calls go to a local OpenAI-compatible server, and the
kill-and-resume drill the crash tests share (a worker SIGKILLed while a model call it made is held open
by the server, a second worker finishing the work)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from django.db import connection

from config.supervisor import BASE_DIR, stop_process_groups
from durable import tick


def test_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def worker(name: str, base_url: str, *, queues: str = "turns,steps,llm", pool: str = "prefork",
           concurrency: int = 1, **env: str) -> subprocess.Popen:
    """A worker with short leases, its model calls to `base_url`, no LLM cache and no retries: every call
    the work needs reaches the server, once per attempt. By default one prefork process serving turns,
    steps and model calls; `env` adds or overrides environment variables."""
    environment = {**os.environ, "DATABASE_URL": test_database_url(), "DURABLE_LEASE_SECONDS": "2",
                   "DURABLE_STEP_DEFAULT_TIMEOUT": "3", "DURABLE_REDISPATCH_AFTER_SECONDS": "3",
                   "LLM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": base_url,
                   "LLM_CACHE_ENABLED": "false", "LLM_MAX_RETRIES": "0", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queues, "-c", str(concurrency), "--pool",
         pool, "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{name}@%h",
         "--loglevel", "WARNING"], cwd=BASE_DIR, env=environment, start_new_session=True)


def llm_worker(name: str, base_url: str) -> subprocess.Popen:
    """One prefork process serving turns, steps and model calls."""
    return worker(name, base_url)


def split_workers(name: str, base_url: str, *, in_flight: int = 32, **env: str) -> list[subprocess.Popen]:
    """The platform's layout: turns and steps on one prefork process, model calls on a threads-pool
    worker keeping up to `in_flight` calls at once (as `make run` starts them). A call's step may be
    silent for 15 s (a loaded machine slows many calls at once; a shorter clock would hand calls still
    in flight to another thread, which asks the provider again)."""
    env = {"DURABLE_STEP_DEFAULT_TIMEOUT": "15", **env}
    return [worker(f"{name}-turns", base_url, queues="turns,steps", **env),
            worker(f"{name}-llm", base_url, queues="llm", pool="threads", concurrency=in_flight,
                   LLM_MAX_IN_FLIGHT=str(in_flight), **env)]


@contextlib.contextmanager
def split_workers_running(name: str, base_url: str, *, in_flight: int = 32, **env: str):
    """split_workers for the `with` block, both stopped at its end whatever happened in it."""
    workers = split_workers(name, base_url, in_flight=in_flight, **env)
    try:
        yield workers
    finally:
        stop_process_groups(workers, timeout=20)


def drive_until_ended(rows, *, timeout: float = 120) -> None:
    """Tick (the beat's work) until every row (invocations, eval runs) has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(row.status in type(row).TERMINAL for row in rows if row.refresh_from_db() or True):
            return
        tick.tick()
        time.sleep(0.3)


def kill_mid_call_and_finish(row, *, base_url: str, in_flight, release, before_kill=None, wait: float = 120,
                             finish: float = 180):
    """Start a worker; once `in_flight` is set (the server holds one of its calls), SIGKILL it (after
    `before_kill()`, to look at the state the crash leaves), start a second worker and tick until `row`
    (an invocation, eval run or evolution run) ends. `release` lets the held call go at the end."""
    workers = [llm_worker("first", base_url)]
    try:
        assert in_flight.wait(wait), "the first worker never reached the held call"
        if before_kill is not None:
            before_kill()
        os.killpg(workers[0].pid, signal.SIGKILL)
        workers[0].wait(10)
        workers.append(llm_worker("second", base_url))
        deadline = time.monotonic() + finish
        while time.monotonic() < deadline:
            row.refresh_from_db()
            if row.status in type(row).TERMINAL:
                break
            tick.tick()
            time.sleep(0.3)
    finally:
        release.set()
        stop_process_groups(workers, timeout=20)
    return row
