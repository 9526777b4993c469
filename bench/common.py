"""Helpers shared by the benchmarks: dedicated databases on the embedded server, Django set-up,
machine information, readable tables and the JSON results under bench/results/.

Benchmarks only talk to the server named by DATABASE_URL (a unix socket under `make bench`) and to
the Redis of REDIS_URL (loopback); they create their own databases on that server and drop them
when done, so the run database's data is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

RESULTS_DIR = Path(__file__).resolve().parent / "results"  # BENCH_RESULTS_DIR elsewhere (the smoke tests)
BASE_DIR = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ databases


_SERVER_URL: str | None = None


def server_url() -> str:
    """The DATABASE_URL the benchmark was started with (the run database), remembered before
    setup_django() repoints DATABASE_URL at a benchmark database."""
    global _SERVER_URL
    if _SERVER_URL is None:
        url = os.environ.get("BENCH_SERVER_URL") or os.environ.get("DATABASE_URL")
        if not url:
            raise SystemExit("DATABASE_URL is not set: run benchmarks with `make bench NAME=<name>`.")
        _SERVER_URL = url
    return _SERVER_URL


def database_url(name: str, base: str | None = None) -> str:
    """DATABASE_URL with its database name replaced by `name` (same server, same socket)."""
    parts = urlsplit(base or server_url())
    return urlunsplit(parts._replace(path="/" + name))


def libpq_conninfo(url: str) -> str:
    """psycopg accepts the postgres:// URL as is (a percent-encoded socket directory as host)."""
    return url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url


def _admin() -> psycopg.Connection:
    # the run database's connection is used only to CREATE / DROP the benchmark's own databases
    return psycopg.connect(libpq_conninfo(server_url()), autocommit=True)


def drop_database(name: str) -> None:
    with _admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def create_database(name: str) -> str:
    """(Re)create an empty database `name` on the embedded server and return its URL."""
    if not name.startswith("bench_"):
        raise ValueError("benchmark databases are named bench_*")
    with _admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(name)


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(libpq_conninfo(url), **kwargs)


def serve_admin_pages() -> None:
    """Let a Django test client render admin pages in a bench process: any host, and (DEBUG off, as in
    production, but no collectstatic ran) plain static URLs, no manifest."""
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    settings.STORAGES = {**settings.STORAGES,
                         "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}


def setup_django(database: str | None, *, migrate: bool = True) -> None:
    """Point Django at `database` (created beforehand) on the same server, set it up and migrate it.
    DEBUG is forced off: with DEBUG on Django records every query, which is not what production pays."""
    if database is not None:
        os.environ["BENCH_SERVER_URL"] = server_url()
        os.environ["DATABASE_URL"] = database_url(database)
    if os.environ.get("SECRET_KEY"):
        os.environ["DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def close_django() -> None:
    with contextlib.suppress(Exception):
        from django.db import connections

        connections.close_all()


@contextlib.contextmanager
def temporary_database(name: str):
    """Create the benchmark's own database, and drop it (Django's connections closed first) however the
    benchmark ends."""
    say(f"creating database {name}")
    create_database(name)
    try:
        yield
    finally:
        close_django()
        drop_database(name)
        say("benchmark database dropped")


# -------------------------------------------------------------------------------------- machine info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    with contextlib.suppress(Exception):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BASE_DIR, capture_output=True, text=True,
                             timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def postgres_info(conn: psycopg.Connection) -> dict:
    info = {}
    for key in ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers",
                "work_mem", "max_wal_size"):
        info[key] = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(key))).fetchone()[0]
    info["socket"] = "unix" if conn.info.host.startswith("/") else conn.info.host
    return info


def machine_info(conn: psycopg.Connection | None = None) -> dict:
    info = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gb": _memory_gb(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": {name: _version(name) for name in ("django", "psycopg", "psycopg-binary", "celery", "dbos")},
        "git_commit": _git_commit(),
    }
    if conn is not None:
        info["postgres"] = postgres_info(conn)
    return info


# ------------------------------------------------------------------------------------------- output


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence]) -> None:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    print(f"\n{title}")
    print("  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(cell.rjust(widths[i]) if i else cell.ljust(widths[i]) for i, cell in enumerate(row)))
    sys.stdout.flush()


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def write_results(name: str, data: dict) -> Path:
    directory = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    say(f"results written to {path}")
    return path


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


# ------------------------------------------------------------------------------------------- timing


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples_s: Sequence[float]) -> dict:
    ms = [s * 1000 for s in samples_s]
    return {"n": len(ms), "median_ms": round(median(ms), 4), "p95_ms": round(percentile(ms, 95), 4),
            "min_ms": round(min(ms), 4), "max_ms": round(max(ms), 4)}


class Stopwatch:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.start
        return False


def explain(cursor, query: str, params: Sequence = (), *, analyze: bool = True) -> str:
    options = "ANALYZE, BUFFERS" if analyze else "COSTS"
    cursor.execute(f"EXPLAIN ({options}) {query}", params)
    return "\n".join(row[0] for row in cursor.fetchall())
