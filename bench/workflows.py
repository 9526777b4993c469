"""workflows: the workflow runner end to end, and where its time goes per node.

A 5-node sequential workflow (planner -> researcher -> analyst -> writer -> reviewer -> end; short
distinct system prompts, no tools, so each node is one model call) answered by the offline model
(offline-directive-v1, well under a millisecond a call), in a dedicated database (bench_workflows,
dropped afterwards) with Celery on Redis database 14 (emptied afterwards).

1. Through real Celery workers (2 worker subprocesses, prefork, -c 1 each, as the other benchmarks
   on this 2-core machine): `--invocations` invocations (200) started through
   workflows.services.invocation_start in one transaction, so every turn is dispatched at its commit.
   Wall time from that commit to the last invocation's ended_at -> invocations/s and nodes/s. Three
   batches, each after an unmeasured warm-up:
     - cache off (LLM_CACHE_ENABLED=false in the workers' environment), distinct inputs: the
       measurement the target is read from;
     - cache on, identical inputs (the cache warmed first, so every model call is a hit);
     - cache on, distinct inputs (every call a miss: the lookup and the store, the default setting).
2. The engine's overhead per node, per invocation: (the invocation's ended_at - started_at, minus the
   time inside the provider, i.e. the sum of its assistant messages' `latency_ms`) / its nodes;
   median and p95 over the invocations. The invocation span is the right base: node durations
   (NodeInvocation started_at..ended_at) leave out what happens between nodes (the node's end
   checkpoint, the next node's start before its row is stamped), which is exactly the engine's cost.
   Also shown, stricter and laxer: the durable run's span (first claim to finish) and the sum of the
   node durations. Target: median < 5 ms a node.
   Per batch also: a worker's time per invocation (its share of the wall time) against the turn task's
   runtime as Celery logs it, the durable run's span and the invocation's span, which places what is
   spent outside the invocation (claim, begin, finish, Celery's own messaging). With the cache on,
   `latency_ms` is measured around llm.chat.chat(), so it holds the cache's lookup (and store) as well
   as the provider: the overhead of those batches leaves the cache's statements out.
3. Where it goes, in-process: `--repeats` invocations (50) driven one at a time with
   durable.inprocess.run_until_settled in this process (cache off), first plain (their overhead per
   node, as above), then with the engine's and the runner's functions wrapped with perf_counter timers
   (monkeypatched here for the duration; nothing is left in product code), every statement counted and
   timed at the psycopg cursor (so the engine's raw prepared statements count too, which Django's
   execute_wrapper never sees) and every commit timed; then as many again with the cache on (misses).
   Reports ms, statements and commits per node for each phase, the costliest statements, and a
   cProfile of `--repeats` more (`--no-profile` skips it).

This machine may be shared: the results record the load average at the start, after each batch and
at the end, so a noisy run can be recognised.

    make bench NAME=workflows
    python -m bench workflows [--invocations 200] [--workers 2] [--repeats 50] [--skip-workers] [--no-profile]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import re
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from bench import common

NAME = "workflows"
BENCH_DB = "bench_workflows"
REDIS_DB_INDEX = 14
TARGET_OVERHEAD_MS = 5.0
MODEL = "offline-directive-v1"
NODES = [
    ("planner", "You plan. List the steps that answer the question."),
    ("researcher", "You research. Gather the facts the plan needs."),
    ("analyst", "You analyse. Weigh the facts and draw the conclusions."),
    ("writer", "You write. Turn the analysis into a clear answer. Answer in at most 80 words."),
    ("reviewer", "You review. Check the answer and give its final version. Answer in one sentence."),
]
QUESTION = "How does a durable workflow survive a worker crash mid-run, and what does a replay cost?"


# ------------------------------------------------------------------------------------------ workflow


def workflow_dsl() -> dict:
    """planner -> researcher -> analyst -> writer -> reviewer -> end, one model call a node."""
    nodes = []
    for index, (node_id, prompt) in enumerate(NODES):
        following = NODES[index + 1][0] if index + 1 < len(NODES) else "end"
        nodes.append({"nodeId": node_id, "description": "", "systemPrompt": prompt, "modelName": MODEL,
                      "codeTools": [], "mcpTools": [], "handOffs": [following], "handOffType": "sequential",
                      "waitFor": [], "requiresApproval": False, "maxSteps": 1, "skills": []})
    return {"entryNodeId": NODES[0][0], "nodes": nodes}


def create_version(slug: str = "bench-workflows"):
    """A workspace, a workflow and its version of workflow_dsl()."""
    from workflows.services import workflow_create, workflow_version_create
    from workspaces.models import Workspace

    workspace = Workspace.objects.create(name="Workflows benchmark", slug=slug)
    workflow = workflow_create(workspace=workspace, name="five sequential nodes")
    version, _ = workflow_version_create(workflow=workflow, dsl=workflow_dsl())
    return version


def invocation_input(label: str, *, identical: bool = False) -> dict:
    """The input of an invocation: distinct per label (no model call is ever a cache hit) or identical."""
    return {"text": QUESTION if identical else f"Request {label}. {QUESTION}"}


# -------------------------------------------------------------------------------- through workers


def redis_url_for_bench(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{REDIS_DB_INDEX}"))


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """os.environ with `values` set for the block (durable_fan.Workers hands os.environ to its workers)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_batch(version, labels: list[str], *, identical: bool) -> tuple[list[int], datetime]:
    """Start one invocation per label in one transaction: every first turn is dispatched at its commit.
    Returns the invocation ids and the instant just before the commit (the batch's start)."""
    from django.db import transaction

    from workflows.services import invocation_start

    with transaction.atomic():
        ids = [invocation_start(version=version, input=invocation_input(label, identical=identical)).pk
               for label in labels]
        dispatched_at = datetime.now(UTC)
    return ids, dispatched_at


def wait_for(ids: list[int], timeout: float) -> bool:
    """Poll until every invocation and its durable run have ended; False on timeout."""
    from durable.models import DurableRun
    from workflows.models import WorkflowInvocation

    deadline = time.monotonic() + timeout
    invocations = WorkflowInvocation.objects.filter(pk__in=ids)
    while time.monotonic() < deadline:
        if not invocations.exclude(status__in=WorkflowInvocation.TERMINAL).exists() and not DurableRun.objects.filter(
                pk__in=invocations.values("durable_run_id")).exclude(status__in=DurableRun.Status.TERMINAL).exists():
            return True
        time.sleep(0.1)
    return False


def _ms(delta) -> float:
    return delta.total_seconds() * 1000


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "median": None, "p95": None, "mean": None, "min": None, "max": None}
    return {"n": len(values), "median": round(common.median(values), 3), "p95": round(common.percentile(values, 95), 3),
            "mean": round(sum(values) / len(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def collect(ids: list[int], dispatched_at: datetime | None = None) -> dict:
    """Per-invocation timings of ended invocations, summarised: throughput, spans, the provider's share
    and the engine's overhead per node under three definitions (see the module docstring)."""
    from durable.models import DurableRun
    from workflows.models import Message, NodeInvocation, WorkflowInvocation

    rows = list(WorkflowInvocation.objects.filter(pk__in=ids).values(
        "pk", "status", "error", "started_at", "ended_at", "node_count", "llm_calls", "cache_hits", "durable_run_id"))
    runs = dict((pk, (started, ended)) for pk, started, ended in DurableRun.objects.filter(
        pk__in=[row["durable_run_id"] for row in rows]).values_list("pk", "started_at", "ended_at"))
    provider = defaultdict(float)
    for invocation_id, latency in Message.objects.filter(workflow_invocation_id__in=ids, role="assistant") \
            .values_list("workflow_invocation_id", "payload__latency_ms"):
        provider[invocation_id] += float(latency or 0)
    node_ms = defaultdict(float)
    for invocation_id, started, ended in NodeInvocation.objects.filter(workflow_invocation_id__in=ids) \
            .values_list("workflow_invocation_id", "started_at", "ended_at"):
        if started and ended:
            node_ms[invocation_id] += _ms(ended - started)

    done = [row for row in rows if row["status"] == WorkflowInvocation.Status.COMPLETED and row["ended_at"]]
    per_node = {"invocation_span": [], "run_span": [], "node_durations": []}
    spans, run_spans, provider_per_node, waits = [], [], [], []
    for row in done:
        nodes = row["node_count"] or 1
        span = _ms(row["ended_at"] - row["started_at"])
        spans.append(span)
        provider_per_node.append(provider[row["pk"]] / nodes)
        per_node["invocation_span"].append((span - provider[row["pk"]]) / nodes)
        run_started, run_ended = runs.get(row["durable_run_id"], (None, None))
        if run_started and run_ended:
            run_spans.append(_ms(run_ended - run_started))
            per_node["run_span"].append((run_spans[-1] - provider[row["pk"]]) / nodes)
        per_node["node_durations"].append((node_ms[row["pk"]] - provider[row["pk"]]) / nodes)
        if dispatched_at is not None:
            waits.append(_ms(row["started_at"] - dispatched_at))
    nodes_total = sum(row["node_count"] for row in done)
    result = {
        "invocations": len(rows), "completed": len(done), "nodes": nodes_total,
        "llm_calls": sum(row["llm_calls"] for row in done), "cache_hits": sum(row["cache_hits"] for row in done),
        "errors": sorted({row["error"][:300] for row in rows if row["error"]})[:5],
        "invocation_span_ms": _stats(spans), "run_span_ms": _stats(run_spans),
        "provider_ms_per_node": _stats(provider_per_node),
        "overhead_ms_per_node": {key: _stats(values) for key, values in per_node.items()},
    }
    if done:
        first_start = min(row["started_at"] for row in done)
        last_end = max(row["ended_at"] for row in done)
        result["worker_span_s"] = round((last_end - first_start).total_seconds(), 3)
        if dispatched_at is not None:
            wall = (last_end - dispatched_at).total_seconds()
            result["wall_s"] = round(wall, 3)
            result["invocations_per_s"] = round(len(done) / wall, 2) if wall > 0 else None
            result["nodes_per_s"] = round(nodes_total / wall, 1) if wall > 0 else None
            result["queue_wait_ms"] = _stats(waits)
    return result


def _llm_calls_stored() -> int:
    from workflows.models import LlmCall

    return LlmCall.objects.count()


TASK_DONE = re.compile(r"Task (durable\.run_turn)\[[^\]]+\] succeeded in ([0-9.eE-]+)s")


def _log_sizes(pool) -> list[int]:
    return [log.stat().st_size if log.exists() else 0 for log in pool.logs]


def task_runtimes(pool, sizes: list[int]) -> list[float]:
    """Runtimes (ms) Celery logged for the turn tasks since `sizes` (the logs' sizes before a batch):
    the task as the worker's pool process ran it, Django's connection handling around it included."""
    runtimes = []
    for log, size in zip(pool.logs, sizes, strict=True):
        with log.open("rb") as handle:
            handle.seek(size)
            text = handle.read().decode(errors="replace")
        runtimes += [float(match.group(2)) * 1000 for match in TASK_DONE.finditer(text)]
    return runtimes


def _per_invocation(result: dict, workers: int, runtimes: list[float]) -> dict:
    """Where a worker's time per invocation goes (means, ms): the worker's share of the wall time, the
    turn task as Celery timed it, the durable run (claim to finish) and the invocation's own span."""
    done = result["completed"]
    if not done or not result.get("wall_s"):
        return {}
    return {"worker_ms": round(result["wall_s"] * 1000 * workers / done, 3),
            "task_runtime_ms": round(sum(runtimes) / len(runtimes), 3) if runtimes else None,
            "turn_tasks": len(runtimes),
            "run_span_ms": result["run_span_ms"]["mean"], "invocation_span_ms": result["invocation_span_ms"]["mean"],
            "provider_ms": round(result["provider_ms_per_node"]["mean"] * result["nodes"] / done, 3)}


def run_batch(version, name: str, count: int, *, identical: bool, timeout: float, warmup: int, pool) -> dict:
    """An unmeasured warm-up (one invocation alone, so an identical input fills the cache, then
    `warmup` at once), then `count` invocations started at once and timed."""
    prefix = name.split(",")[0].replace(" ", "-")
    if warmup:
        for labels in ([f"{prefix}-warm-0"], [f"{prefix}-warm-{i}" for i in range(1, warmup + 1)]):
            ids, _ = start_batch(version, labels, identical=identical)
            if not wait_for(ids, timeout):
                raise RuntimeError(f"{name}: the warm-up invocations did not end within {timeout:.0f} s")
    stored_before = _llm_calls_stored()
    sizes = _log_sizes(pool)
    ids, dispatched_at = start_batch(version, [f"{prefix}-{i}" for i in range(count)], identical=identical)
    finished = wait_for(ids, timeout)
    time.sleep(0.3)  # the last tasks' "succeeded" lines follow their commit
    runtimes = task_runtimes(pool, sizes)
    result = {"scenario": name, "identical_inputs": identical, "timed_out": not finished,
              **collect(ids, dispatched_at), "cache_rows_written": _llm_calls_stored() - stored_before,
              "task_runtime_ms": _stats(runtimes), "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    result["per_invocation_ms"] = _per_invocation(result, pool.count, runtimes)
    common.say(f"  {name}: {result['completed']}/{count} completed in {result.get('wall_s', float('nan')):.2f}s, "
               f"{result.get('invocations_per_s') or 0:.1f} invocations/s, overhead per node median "
               f"{result['overhead_ms_per_node']['invocation_span']['median']} ms")
    return result


def run_on_workers(version, *, invocations: int, workers: int, timeout: float, database_url: str | None = None,
                   warmup: int | None = None) -> dict:
    """The three batches (module docstring) on `workers` Celery worker subprocesses, started once with
    the cache off and once with it on. `database_url` points the workers at another database than
    os.environ's DATABASE_URL (the test database in the smoke test)."""
    from bench.durable_fan import Workers

    warmup = 2 * workers if warmup is None else warmup
    plans = [("false", [("cache off, distinct inputs", False)]),
             ("true", [("cache on, identical inputs (hits)", True), ("cache on, distinct inputs (misses)", False)])]
    env = {"DEBUG": "false", **({"DATABASE_URL": database_url} if database_url else {})}
    batches, errors = [], []
    with tempfile.TemporaryDirectory(prefix="bench-workflows-") as log_dir:
        for cache, scenarios in plans:
            pool = Workers(workers, Path(log_dir) / f"cache-{cache}")
            pool.log_dir.mkdir()
            try:
                with _environ({**env, "LLM_CACHE_ENABLED": cache}):
                    ready_s = pool.start()
                common.say(f"{workers} Celery workers ready in {ready_s:.1f}s (LLM_CACHE_ENABLED={cache})")
                for name, identical in scenarios:
                    batches.append(run_batch(version, name, invocations, identical=identical, timeout=timeout,
                                             warmup=warmup, pool=pool))
            finally:
                pool.stop()
                errors += pool.errors()
    return {"workers": workers, "worker_concurrency": 1, "invocations_per_batch": invocations,
            "warmup_invocations": 1 + warmup, "batches": batches, "worker_errors": errors[:20]}


# ------------------------------------------------------------------------------ in-process breakdown


# (module, class or "", attribute, phase): each wrapped with a timer for the breakdown, restored afterwards
PHASES = [
    ("durable.inprocess", "", "run_until_settled", "in-process driver (polls; not on a worker's path)"),
    ("durable.turns", "", "execute_turn", "turn: the rest (the workflow's code, claim to finish)"),
    ("durable.store", "", "run_claim", "turn: claim"),
    ("durable.store", "", "run_release", "turn: release (suspend)"),
    ("durable.store", "", "run_finish", "turn: finish"),
    ("durable.context", "Context", "step", "ctx.step (inline step bookkeeping)"),
    ("durable.context", "Context", "transaction", "ctx.transaction (its atomic block and commit)"),
    ("durable.store", "", "checkpoint_record", "checkpoint writes (every step)"),
    ("workflows.services", "", "invocation_start", "invocation_start (API side, before the run)"),
    ("durable.owners", "", "begin", "invocation begin"),
    ("workflows.execution", "", "invocation_finish", "invocation finish"),
    ("workflows.execution", "", "node_start", "node_start (NodeInvocation insert, hand-off messages)"),
    ("workflows.execution", "", "llm_call", "llm_call outside chat() (request, messages insert)"),
    ("workflows.execution", "", "chat", "chat() outside the provider (model resolution, usage)"),
    ("workflows.llm_cache", "ChatCache", "get", "cache lookup"),
    ("workflows.llm_cache", "ChatCache", "put", "cache store"),
    ("workflows.execution", "", "node_finish", "node_end (NodeInvocation update, result message)"),
    ("workflows.execution", "", "_update_totals", "totals aggregate (_update_totals)"),
    ("llm.offline_chat", "OfflineChatProvider", "complete", "provider (offline model)"),
]
PROVIDER = "provider (offline model)"
OUTSIDE_TURN = ("in-process driver (polls; not on a worker's path)", "invocation_start (API side, before the run)")
TURN = "turn: the rest (the workflow's code, claim to finish)"
WRITES = ("INSERT", "UPDATE", "DELETE")


def _statement_key(query) -> str:
    text = query.decode() if isinstance(query, bytes) else str(query)
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\(%s(, %s)*\)(, \(%s(, %s)*\))*", "(...)", text)
    return text[:90]


class Instrument:
    """Timers around PHASES (exclusive time: a phase's nested phases are subtracted), and every
    statement and commit of this thread counted, timed and charged to the innermost open phase."""

    def __init__(self):
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls: Counter = Counter()
        self.statements: Counter = Counter()
        self.commits: Counter = Counter()
        self.db_seconds: dict[str, float] = defaultdict(float)
        self.django_statements: Counter = Counter()  # what Django's execute_wrapper sees (no raw cursors)
        self.by_statement: dict[tuple[str, str], list] = {}
        self.turn_seconds = 0.0
        self._stack: list[list] = []
        self._thread = threading.get_ident()
        self._saved: list[tuple[object, str, object]] = []

    def current(self) -> str:
        return self._stack[-1][0] if self._stack else "outside"

    def _wrap(self, label: str, fn):
        instrument = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            frame = [label, 0.0]
            instrument._stack.append(frame)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                instrument._stack.pop()
                instrument.exclusive[label] += elapsed - frame[1]
                instrument.calls[label] += 1
                if label == TURN:
                    instrument.turn_seconds += elapsed
                if instrument._stack:
                    instrument._stack[-1][1] += elapsed

        return timed

    def _record_db(self, key: str, seconds: float, *, commit: bool) -> None:
        if threading.get_ident() != self._thread:
            return  # the lease keeper's thread renews leases on its own connection
        phase = self.current()
        if commit:
            self.commits[phase] += 1
        else:
            self.statements[phase] += 1
        self.db_seconds[phase] += seconds
        entry = self.by_statement.setdefault((phase, key), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    def _patch(self, owner, attribute: str, replacement) -> None:
        self._saved.append((owner, attribute, owner.__dict__[attribute] if isinstance(owner, type)
                            else getattr(owner, attribute)))
        setattr(owner, attribute, replacement)

    def __enter__(self):
        import psycopg

        for module, cls, attribute, label in PHASES:
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            self._patch(owner, attribute, self._wrap(label, getattr(owner, attribute)))
        instrument = self
        execute, executemany, commit = psycopg.Cursor.execute, psycopg.Cursor.executemany, psycopg.Connection.commit

        def timed_execute(cursor, query, params=None, **kwargs):
            started = time.perf_counter()
            try:
                return execute(cursor, query, params, **kwargs)
            finally:
                key = _statement_key(query)
                implicit = cursor.connection.autocommit and key.upper().startswith(WRITES)
                instrument._record_db(key + (" [autocommit]" if implicit else ""), time.perf_counter() - started,
                                      commit=False)
                if implicit:
                    instrument.commits[instrument.current()] += 1

        def timed_executemany(cursor, query, params_seq, **kwargs):
            started = time.perf_counter()
            try:
                return executemany(cursor, query, params_seq, **kwargs)
            finally:
                instrument._record_db(_statement_key(query), time.perf_counter() - started, commit=False)

        def timed_commit(connection):
            started = time.perf_counter()
            try:
                return commit(connection)
            finally:
                instrument._record_db("COMMIT", time.perf_counter() - started, commit=True)

        from django.db import connection

        def django_counter(execute, sql, params, many, context):
            instrument.django_statements[instrument.current()] += 1
            return execute(sql, params, many, context)

        self._django_wrapper = connection.execute_wrapper(django_counter)
        self._django_wrapper.__enter__()
        self._patch(psycopg.Cursor, "execute", timed_execute)
        self._patch(psycopg.Cursor, "executemany", timed_executemany)
        self._patch(psycopg.Connection, "commit", timed_commit)
        return self

    def __exit__(self, *exc):
        self._django_wrapper.__exit__(*exc)
        while self._saved:
            owner, attribute, original = self._saved.pop()
            setattr(owner, attribute, original)
        return False


def _invoke_inprocess(version, label: str) -> int:
    from durable.inprocess import run_until_settled
    from workflows import services

    invocation = services.invocation_start(version=version, input=invocation_input(label))
    run = run_until_settled(invocation.durable_run_id, max_wait=30)
    if run.status != "completed":
        raise RuntimeError(f"in-process invocation {invocation.pk} ended {run.status}: {run.error[:500]}")
    return invocation.pk


def profile_inprocess(version, repeats: int, nodes_per_invocation: int = len(NODES)) -> dict:
    """cProfile `repeats` in-process invocations (cache off): the top functions by own time per node."""
    import cProfile
    import pstats

    from django.test.utils import override_settings

    profiler = cProfile.Profile()
    with override_settings(DURABLE_DISPATCH_ENABLED=False, LLM_CACHE_ENABLED=False):
        started = time.perf_counter()
        profiler.enable()
        for index in range(repeats):
            _invoke_inprocess(version, f"inprocess-profiled-{index}")
        profiler.disable()
        elapsed = time.perf_counter() - started
    nodes = repeats * nodes_per_invocation
    stats = pstats.Stats(profiler)
    rows, ours, waiting = [], [], 0.0
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        where = "/".join(filename.rsplit("/", 2)[-2:]) if "/" in filename else filename
        row = {"function": f"{where}:{line}({func})", "calls_per_node": round(ncalls / nodes, 2),
               "own_us_per_node": round(tottime / nodes * 1e6, 1), "cum_us_per_node": round(cumtime / nodes * 1e6, 1)}
        rows.append(row)
        if str(common.BASE_DIR) in filename and "/.venv/" not in filename and "/bench/" not in filename:
            ours.append(row)  # the project's own functions, for the cumulative view
        if "psycopg" in filename and func.startswith("wait"):
            waiting += tottime
    rows.sort(key=lambda row: row["own_us_per_node"], reverse=True)
    ours.sort(key=lambda row: row["cum_us_per_node"], reverse=True)
    per_node = elapsed / nodes * 1e6
    return {"repeats": repeats, "us_per_node": round(per_node, 1),
            "db_wait_us_per_node": round(waiting / nodes * 1e6, 1),
            "python_us_per_node": round(per_node - waiting / nodes * 1e6, 1), "top_own_time": rows[:30],
            "top_cumulative_project": ours[:30],
            "note": "everything per invocation (invocation_start and the in-process driver included), per node"}


def _analyse(instrument: Instrument, nodes: int) -> dict:
    """Per-node figures of an instrumented pass: each phase's exclusive ms, statements, commits, DB time."""
    ms = {label: seconds * 1000 / nodes for label, seconds in instrument.exclusive.items()}
    in_turn = [label for *_, label in PHASES if label not in OUTSIDE_TURN]
    overhead_ms = sum(ms.get(label, 0.0) for label in in_turn if label != PROVIDER)
    phases = []
    for *_, label in PHASES:
        phases.append({
            "phase": label, "calls_per_node": round(instrument.calls[label] / nodes, 2),
            "ms_per_node": round(ms.get(label, 0.0), 4),
            "pct_of_overhead": round(100 * ms.get(label, 0.0) / overhead_ms, 1)
            if label in in_turn and label != PROVIDER and overhead_ms else None,
            "statements_per_node": round(instrument.statements[label] / nodes, 2),
            "django_statements_per_node": round(instrument.django_statements[label] / nodes, 2),
            "commits_per_node": round(instrument.commits[label] / nodes, 2),
            "db_ms_per_node": round(instrument.db_seconds[label] * 1000 / nodes, 4),
        })
    statements = sorted(
        ({"phase": phase, "statement": key, "per_node": round(count / nodes, 2),
          "ms_per_node": round(seconds * 1000 / nodes, 4), "ms_each": round(seconds * 1000 / count, 4)}
         for (phase, key), (count, seconds) in instrument.by_statement.items()),
        key=lambda row: row["ms_per_node"], reverse=True)
    turn_db = sum(instrument.db_seconds[label] for label in in_turn) * 1000 / nodes
    return {
        "turn_ms_per_node": round(instrument.turn_seconds * 1000 / nodes, 4),
        "engine_overhead_ms_per_node": round(overhead_ms, 4), "provider_ms_per_node": round(ms.get(PROVIDER, 0.0), 4),
        "statements_per_node": round(sum(instrument.statements[label] for label in in_turn) / nodes, 2),
        "django_statements_per_node": round(sum(instrument.django_statements[label] for label in in_turn) / nodes, 2),
        "commits_per_node": round(sum(instrument.commits[label] for label in in_turn) / nodes, 2),
        "db_ms_per_node": round(turn_db, 4), "python_ms_per_node": round(overhead_ms - turn_db, 4),
        "statements_per_node_outside_turn": {label: round(instrument.statements[label] / nodes, 2)
                                             for label in OUTSIDE_TURN},
        "phases": phases, "top_statements": statements[:25],
    }


def breakdown(version, repeats: int, *, warmup: int = 3) -> dict:
    """`repeats` invocations driven in this process with the cache off, first plain (their overhead per
    node, measured as through the workers), then as many again under Instrument; then as many under
    Instrument with the cache on and distinct inputs (every call a miss: lookup and store)."""
    from django.test.utils import override_settings

    passes = {}
    for cache in (False, True):
        with override_settings(DURABLE_DISPATCH_ENABLED=False, LLM_CACHE_ENABLED=cache):
            name = "cache-on" if cache else "cache-off"
            if not cache:
                for index in range(warmup):
                    _invoke_inprocess(version, f"inprocess-warm-{index}")
                plain = collect([_invoke_inprocess(version, f"inprocess-plain-{index}") for index in range(repeats)])
            with Instrument() as instrument:
                ids = [_invoke_inprocess(version, f"inprocess-{name}-{index}") for index in range(repeats)]
            timed = collect(ids)
            passes[name] = {"collected": timed, **_analyse(instrument, timed["nodes"])}
    off, on = passes["cache-off"], passes["cache-on"]
    return {
        "repeats": repeats, "nodes": off["collected"]["nodes"],
        "plain": {"overhead_ms_per_node": plain["overhead_ms_per_node"], "provider_ms_per_node":
                  plain["provider_ms_per_node"], "invocation_span_ms": plain["invocation_span_ms"]},
        "instrumented": {"overhead_ms_per_node": off["collected"]["overhead_ms_per_node"],
                         "invocation_span_ms": off["collected"]["invocation_span_ms"]},
        **{key: value for key, value in off.items() if key != "collected"},
        "cache_on_misses": {key: value for key, value in on.items() if key != "collected"},
    }


# --------------------------------------------------------------------------------------------- report


def _fmt_stats(stats: dict) -> list:
    return [stats["median"], stats["p95"], stats["mean"]]


def report(results: dict) -> None:
    """The tables (results as main() writes them)."""
    celery = results.get("celery")
    if celery:
        common.print_table(
            f"workflows: {celery['invocations_per_batch']} invocations x {len(NODES)} nodes each batch, started at "
            f"once, on {celery['workers']} Celery workers (prefork, -c 1); offline model",
            ["batch", "completed", "wall (s)", "invocations/s", "nodes/s", "queue wait p50 (ms)",
             "span p50 (ms)", "overhead/node p50", "p95", "provider ms/node", "cache hits"],
            [[b["scenario"], f"{b['completed']}/{b['invocations']}", b.get("wall_s"), b.get("invocations_per_s"),
              b.get("nodes_per_s"), (b.get("queue_wait_ms") or {}).get("median"), b["invocation_span_ms"]["median"],
              b["overhead_ms_per_node"]["invocation_span"]["median"],
              b["overhead_ms_per_node"]["invocation_span"]["p95"], b["provider_ms_per_node"]["median"],
              b["cache_hits"]] for b in celery["batches"]])
        common.print_table(
            "a worker's time per invocation (means, ms): its share of the wall time, the turn task as Celery "
            "logged it, the durable run (claim to finish), the invocation's span, the provider inside it",
            ["batch", "worker time", "turn task", "run span", "invocation span", "provider"],
            [[b["scenario"], *(b["per_invocation_ms"].get(key) for key in
                               ("worker_ms", "task_runtime_ms", "run_span_ms", "invocation_span_ms", "provider_ms"))]
             for b in celery["batches"]])
        main_batch = celery["batches"][0]
        rows = [[f"workers, {main_batch['scenario']}: {label}", *_fmt_stats(main_batch["overhead_ms_per_node"][key])]
                for key, label in DEFINITIONS]
    else:
        rows = []
    inprocess = results.get("breakdown")
    if inprocess:
        rows += [[f"in-process, one at a time: {label}", *_fmt_stats(inprocess["plain"]["overhead_ms_per_node"][key])]
                 for key, label in DEFINITIONS]
        rows.append(["in-process, instrumented (timers' own cost included): invocation span",
                     *_fmt_stats(inprocess["instrumented"]["overhead_ms_per_node"]["invocation_span"])])
    if rows:
        common.print_table("engine overhead per node (ms): (span - time in the provider) / nodes, per invocation",
                           ["measured", "median", "p95", "mean"], rows)
    if inprocess:
        on = inprocess["cache_on_misses"]
        common.print_table(
            f"where the time of a node goes: {inprocess['repeats']} invocations in-process, cache off "
            f"(ms per node; per-invocation phases are shared by its {len(NODES)} nodes)",
            ["phase", "calls/node", "ms/node", "% of overhead", "statements/node", "commits/node", "of which DB ms",
             "cache on (misses): ms/node", "commits/node"],
            [[p["phase"], p["calls_per_node"], p["ms_per_node"], p["pct_of_overhead"], p["statements_per_node"],
              p["commits_per_node"], p["db_ms_per_node"], q["ms_per_node"], q["commits_per_node"]]
             for p, q in zip(inprocess["phases"], on["phases"], strict=True)]
            + [["engine overhead in the turn (all but the provider)", None, inprocess["engine_overhead_ms_per_node"],
                100.0, inprocess["statements_per_node"], inprocess["commits_per_node"], inprocess["db_ms_per_node"],
                on["engine_overhead_ms_per_node"], on["commits_per_node"]],
               ["  of which waiting on Postgres (statements and commits)", None, inprocess["db_ms_per_node"], None,
                None, None, None, on["db_ms_per_node"], None],
               ["  of which Python", None, inprocess["python_ms_per_node"], None, None, None, None,
                on["python_ms_per_node"], None]])
        print(f"\nstatements per node in the turn: {inprocess['statements_per_node']} at the psycopg cursor, of which "
              f"{inprocess['django_statements_per_node']} through Django (connection.execute_wrapper; the rest are the "
              f"engine's raw prepared statements); {inprocess['commits_per_node']} commits per node")
        common.print_table(
            "costliest statements (in-process, per node; COMMIT = an explicit commit, [autocommit] = a write "
            "that commits by itself)",
            ["statement", "phase", "per node", "ms/node", "ms each"],
            [[s["statement"], s["phase"].split(" (")[0], s["per_node"], s["ms_per_node"], s["ms_each"]]
             for s in inprocess["top_statements"][:16]])
    profile = (inprocess or {}).get("profile")
    if profile:
        print(f"\nin-process under cProfile: {profile['us_per_node']} us a node, of which "
              f"{profile['db_wait_us_per_node']} us waiting on Postgres (psycopg wait) and "
              f"{profile['python_us_per_node']} us of Python (profiler overhead included)")
        common.print_table("under cProfile: top own time per node (us)", ["function", "calls/node", "own us", "cum us"],
                           [[r["function"], r["calls_per_node"], r["own_us_per_node"], r["cum_us_per_node"]]
                            for r in profile["top_own_time"][:12]])
        common.print_table("under cProfile: the project's functions by cumulative time per node (us)",
                           ["function", "calls/node", "own us", "cum us"],
                           [[r["function"], r["calls_per_node"], r["own_us_per_node"], r["cum_us_per_node"]]
                            for r in profile["top_cumulative_project"][:20]])
    targets = results.get("targets") or {}
    if targets:
        common.print_table("targets", ["target", "measured", "verdict"],
                           [[t["target"], t["measured"], common.verdict(t["met"])] for t in targets.values()])


DEFINITIONS = [("invocation_span", "invocation started_at..ended_at (the target's measure)"),
               ("run_span", "durable run claim..finish (stricter)"),
               ("node_durations", "sum of node durations (laxer: misses the gaps)")]


def targets_of(results: dict) -> dict:
    targets = {}
    celery = results.get("celery")
    if celery:
        main_batch = celery["batches"][0]
        overhead = main_batch["overhead_ms_per_node"]["invocation_span"]
        targets["overhead_median"] = {
            "target": f"overhead per node, median < {TARGET_OVERHEAD_MS:g} ms ({main_batch['scenario']}, workers)",
            "measured": overhead["median"], "met": overhead["median"] is not None
            and overhead["median"] < TARGET_OVERHEAD_MS}
        targets["overhead_p95"] = {
            "target": f"(for information) overhead per node, p95 < {TARGET_OVERHEAD_MS:g} ms",
            "measured": overhead["p95"], "met": overhead["p95"] is not None and overhead["p95"] < TARGET_OVERHEAD_MS}
        targets["all_completed"] = {
            "target": "every invocation of every batch completed",
            "measured": sum(b["completed"] for b in celery["batches"]),
            "met": all(b["completed"] == b["invocations"] for b in celery["batches"])}
    inprocess = results.get("breakdown")
    if inprocess:
        median = inprocess["plain"]["overhead_ms_per_node"]["invocation_span"]["median"]
        targets["overhead_inprocess"] = {
            "target": f"(for information) overhead per node in-process, median < {TARGET_OVERHEAD_MS:g} ms",
            "measured": median, "met": median is not None and median < TARGET_OVERHEAD_MS}
    return targets


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench workflows")
    parser.add_argument("--invocations", type=int, default=200, help="invocations per batch on the workers")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50, help="invocations of the in-process breakdown")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a batch")
    parser.add_argument("--skip-workers", action="store_true", help="only the in-process breakdown")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the cProfile of `--repeats` more in-process invocations")
    args = parser.parse_args()

    redis_url = redis_url_for_bench(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    os.environ["REDIS_URL"] = redis_url  # settings read it at set-up; the workers inherit it
    common.say(f"creating database {BENCH_DB}; Celery on Redis database {REDIS_DB_INDEX}")
    common.create_database(BENCH_DB)
    try:
        return _run(args, redis_url)
    finally:
        common.close_django()
        common.drop_database(BENCH_DB)
        if not args.skip_workers:
            from bench.durable_fan import flush_redis

            with contextlib.suppress(Exception):
                flush_redis(redis_url)
        common.say("benchmark database dropped")


def _run(args, redis_url: str) -> int:
    common.setup_django(BENCH_DB)
    from django.db import connection

    connection.ensure_connection()
    info = common.machine_info(connection.connection)
    version = create_version()
    results: dict = {
        "benchmark": NAME, "machine": info,
        "parameters": {"invocations_per_batch": args.invocations, "workers": args.workers, "worker_concurrency": 1,
                       "repeats": args.repeats, "nodes_per_invocation": len(NODES), "model": MODEL,
                       "workflow": " -> ".join([node for node, _ in NODES] + ["end"]),
                       "overhead_definition": "per invocation: (ended_at - started_at - sum of assistant "
                                              "latency_ms) / nodes; median and p95 over invocations"},
    }
    if not args.skip_workers:
        from bench.durable_fan import flush_redis

        flush_redis(redis_url)
        results["celery"] = run_on_workers(version, invocations=args.invocations, workers=args.workers,
                                           timeout=args.timeout)
    common.say(f"in-process breakdown: {args.repeats} invocations plain, then {args.repeats} instrumented")
    results["breakdown"] = breakdown(version, args.repeats)
    if args.profile:
        results["breakdown"]["profile"] = profile_inprocess(version, args.repeats)
    results["targets"] = targets_of(results)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report(results)
    if results.get("celery", {}).get("worker_errors"):
        print("\nworker log errors:\n  " + "\n  ".join(results["celery"]["worker_errors"]))
    common.write_results(NAME, results)
    return 0 if all(t["met"] for key, t in results["targets"].items() if key == "all_completed") else 1
