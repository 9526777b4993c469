"""A chaos suite for the durable engine: workflows and driver, shared by tests/durable/test_chaos.py and
`python -m bench durable_chaos`.

Celery workers import this module (DURABLE_WORKFLOW_MODULES=tests.durable.chaos): the workflows register
as ``chaos.*`` and the step functions are module-level, so queued steps resolve here.

The driver starts a seeded mix of runs (inline and queued steps, slow steps with heartbeats and a
timeout, fans with wait_all and fail_fast, children, sleeps, signals, failing and retried steps) on real
Celery worker subprocesses (prefork, -c 1) and, at random points of a chaos window:

- SIGKILLs a worker's process group (now and then all of them) and restarts it;
- SIGSTOPs one for a few seconds (longer than a lease and a step timeout), so it wakes up stale;
- terminates a worker's database connection, or holds a table lock past the workers' lock timeout, so
  the engine meets database errors mid-turn and mid-step;
- sends signals, cancels runs and retries failed or cancelled ones (plainly or with new input).

Some scenarios are staged on purpose: runs that fail until the driver opens a gate, then are retried
(a step, a fan item, or a child retried before its parent: ``gated*``); a worker paused inside a
queued step while its run is cancelled and retried with new input (``stale``); a cancel landing while a
turn is inside a long inline step (``cancel_mid_turn``). The tick runs in a thread of its own.
Afterwards, from the database alone, four invariants:

1. every run ends in the state the driver expects: completed with the output the driver computes from
   the input, or cancelled / failed where the driver made it so (and no child is started by a run
   after it was cancelled);
2. no completed step's function started again after its checkpoint was written (each execution is
   logged by the step function itself, in autocommit, on a connection of its own);
3. no run is left active once nothing has progressed for longer than the tick's recovery horizon;
4. no checkpoint was settled twice without a delete (an operator retry) in between (a trigger on
   durable_stepcheckpoint logs every status transition and every delete).

Each violation carries a hint naming the engine behaviour it usually points at. Only the engine's public
surface is used: durable.services, durable.tick.tick, durable.models, and
``from durable import workflow, Step, Child, StepFailed, heartbeat``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg

from durable import Child, Step, StepFailed, heartbeat, workflow

MODULE = "tests.durable.chaos"
QUEUES = ("turns", "steps")
SIDE_APPLICATION = "chaos-side"
MODULUS = 1_000_003
SLOW_TIMEOUT = 1.5  # a slow step's allowed silence; its heartbeats re-arm it every SLOW_TIMEOUT / 3
# Workers' statements give up after waiting this long for a lock, so the driver's lock stalls surface in them
# as database errors (as a statement or lock timeout, a failover or a deadlock would).
WORKER_LOCK_TIMEOUT_MS = 500

# The engine's tunables for a chaos run, in the workers and in the driver (whose tick reads them): short
# leases, timeouts and re-dispatch delays so recovery happens within seconds; a recovery limit high
# enough that repeated kills never make a run dead (a dead run would be the suite's doing, not a bug);
# fan chunks of 3 so a fan's steps are spread over several messages and workers.
ENGINE_SETTINGS = {
    "DURABLE_LEASE_SECONDS": 2.0,
    "DURABLE_STEP_DEFAULT_TIMEOUT": 3.0,
    "DURABLE_REDISPATCH_AFTER_SECONDS": 3.0,
    "DURABLE_MAX_RECOVERY_ATTEMPTS": 50,
    "DURABLE_FAN_CHUNK": 3,
}


# ------------------------------------------------------------------------------------- side tables


SIDE_TABLES_SQL = """
CREATE TABLE chaos_execution (
    id bigserial PRIMARY KEY, run_id text NOT NULL, step text NOT NULL, worker text NOT NULL, pid integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX chaos_execution_step ON chaos_execution (run_id, step);
CREATE TABLE chaos_gate (name text PRIMARY KEY);
CREATE TABLE chaos_transition (
    id bigserial PRIMARY KEY, run_id text NOT NULL, seq integer NOT NULL, name text NOT NULL,
    op text NOT NULL, old_status text, new_status text, attempt integer, timed_out boolean NOT NULL DEFAULT false,
    app text NOT NULL DEFAULT current_setting('application_name'), at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION chaos_log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO chaos_transition (run_id, seq, name, op, old_status, attempt)
        VALUES (OLD.run_id, OLD.seq, OLD.name, 'delete', OLD.status, OLD.attempt);
        RETURN OLD;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO chaos_transition (run_id, seq, name, op, new_status, attempt)
        VALUES (NEW.run_id, NEW.seq, NEW.name, 'insert', NEW.status, NEW.attempt);
    ELSIF OLD.status IS DISTINCT FROM NEW.status
          OR (OLD.status IN ('completed', 'failed')
              AND (OLD.output, OLD.error, OLD.attempt) IS DISTINCT FROM (NEW.output, NEW.error, NEW.attempt)) THEN
        INSERT INTO chaos_transition (run_id, seq, name, op, old_status, new_status, attempt, timed_out)
        VALUES (NEW.run_id, NEW.seq, NEW.name, 'update', OLD.status, NEW.status, NEW.attempt,
                OLD.status = 'running' AND NEW.status IN ('pending', 'failed') AND NEW.error LIKE '%StepTimeout%');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_transition AFTER INSERT OR UPDATE OR DELETE ON durable_stepcheckpoint
    FOR EACH ROW EXECUTE FUNCTION chaos_log_transition();
"""

DROP_SIDE_TABLES_SQL = """
DROP TRIGGER IF EXISTS chaos_transition ON durable_stepcheckpoint;
DROP FUNCTION IF EXISTS chaos_log_transition();
DROP TABLE IF EXISTS chaos_execution, chaos_gate, chaos_transition;
"""


def install_side_tables() -> None:
    """The execution log, the gates and the checkpoint-transition trigger (test databases only)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(DROP_SIDE_TABLES_SQL)
        cursor.execute(SIDE_TABLES_SQL)


def drop_side_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(DROP_SIDE_TABLES_SQL)


def database_url(application_name: str = "", options: str = "") -> str:
    """DATABASE_URL pointed at the database Django is using now (a test database under pytest), its
    connections named `application_name` (so the checks can tell which worker wrote what) and started
    with libpq `options` (such as a lock timeout)."""
    from django.db import connection

    parts = urlsplit(os.environ["DATABASE_URL"])
    query = {key: value for key, value in (("application_name", application_name), ("options", options)) if value}
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"],
                                     query=urlencode(query) if query else parts.query))


def side_connection(application_name: str = SIDE_APPLICATION) -> psycopg.Connection:
    """An autocommit connection of the suite's own to the database Django is using."""
    from django.db import connection as django_connection

    settings = django_connection.settings_dict
    params = {"dbname": settings["NAME"], "user": settings.get("USER"), "password": settings.get("PASSWORD"),
              "host": settings.get("HOST"), "port": settings.get("PORT")}
    return psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True,
                           application_name=application_name)


# ------------------------------------------------------------------------------------ step functions


class PlannedFailure(Exception):
    pass


_side: dict = {"pid": None, "conn": None}


def _side_query(sql: str, params: tuple):
    """One autocommit statement on this process's own connection: committed before the step's result
    is, so an execution is on record even when its worker dies right after."""
    for attempt in range(3):
        conn = _side["conn"]
        try:
            if conn is None or conn.closed or _side["pid"] != os.getpid():
                conn = side_connection()
                _side.update(conn=conn, pid=os.getpid())
            return conn.execute(sql, params).fetchone()
        except psycopg.OperationalError:
            _side["conn"] = None
            if attempt == 2:
                raise
            time.sleep(0.1)
    return None


def record_execution(run_id: str, step: str) -> int:
    """Log that `step` of `run_id` starts now; returns how many times it has started, this one included."""
    row = _side_query(
        "WITH started AS (INSERT INTO chaos_execution (run_id, step, worker, pid) VALUES (%s, %s, %s, %s) "
        "RETURNING id) SELECT (SELECT count(*) FROM chaos_execution WHERE run_id = %s AND step = %s) + 1 FROM started",
        (run_id, step, os.environ.get("CHAOS_WORKER", ""), os.getpid(), run_id, step),
    )
    return int(row[0])


def mix(value: int, label: str) -> int:
    """The suite's deterministic arithmetic: what every step returns, and what the driver recomputes."""
    return (int(value) * 7919 + zlib.crc32(label.encode())) % MODULUS


def compute(run_id, step, value):
    record_execution(run_id, step)
    return mix(value, step)


def slow(run_id, step, value, seconds):
    """A slow step that heartbeats, so its timeout (shorter than its run time) never fires while it lives."""
    record_execution(run_id, step)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heartbeat({"left": round(end - time.monotonic(), 2)})
        time.sleep(0.05)
    return mix(value, step)


def flaky(run_id, step, value, failures):
    """Fails its first `failures` executions (counted in the execution log, so across workers), then succeeds."""
    count = record_execution(run_id, step)
    if count <= failures:
        raise PlannedFailure(f"{step}: planned failure {count} of {failures}")
    return mix(value, step)


def gated(run_id, step, value, gate):
    """Fails while the driver has not opened `gate`."""
    record_execution(run_id, step)
    if _side_query("SELECT count(*) FROM chaos_gate WHERE name = %s", (gate,))[0] == 0:
        raise PlannedFailure(f"{step}: gate {gate} is closed")
    return mix(value, step)


def busy(run_id, step, value, seconds):
    """A long inline step: the turn (and its lease) is held while it runs, and nothing heartbeats."""
    record_execution(run_id, step)
    time.sleep(seconds)
    return mix(value, step)


def fail_after(run_id, step, seconds):
    record_execution(run_id, step)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heartbeat()
        time.sleep(0.05)
    raise PlannedFailure(f"{step}: fails after {seconds}s")


def boom(run_id, step):
    record_execution(run_id, step)
    raise PlannedFailure(f"{step}: fails at once")


def _retrying(failures: int) -> dict:
    return {"retries": failures + 4, "backoff": "fixed", "backoff_base": 0.2, "jitter": False}


# ------------------------------------------------------------------------------------------- workflows


@workflow("chaos.inline")
def inline_chain(ctx, input):
    value = input["x"]
    for index in range(input["n"]):
        value = ctx.step(f"s{index}", compute, ctx.run_id, f"s{index}", value)
    value = ctx.step("flaky", flaky, ctx.run_id, "flaky", value, input["failures"], **_retrying(input["failures"]))
    return {"v": value}


@workflow("chaos.queued")
def queued_chain(ctx, input):
    value = input["x"]
    for index in range(input["n"]):
        value = ctx.step(f"q{index}", compute, ctx.run_id, f"q{index}", value, queue="steps")
    value = ctx.step("qflaky", flaky, ctx.run_id, "qflaky", value, input["failures"], queue="steps",
                     **_retrying(input["failures"]))
    return {"v": value}


@workflow("chaos.slow")
def slow_step(ctx, input):
    value = ctx.step("prep", compute, ctx.run_id, "prep", input["x"])
    value = ctx.step("slow", slow, ctx.run_id, "slow", value, input["seconds"], queue="steps", timeout=SLOW_TIMEOUT)
    return {"v": ctx.step("after", compute, ctx.run_id, "after", value)}


@workflow("chaos.slow_fan")
def slow_fan(ctx, input):
    """Slow steps whose run time together exceeds one step's timeout: claimed in one chunk, the last ones
    must not time out while they wait for their turn in the chunk."""
    items = [Step(f"w{index}", slow, (ctx.run_id, f"w{index}", input["x"] + index, seconds), timeout=SLOW_TIMEOUT)
             for index, seconds in enumerate(input["seconds"])]
    return {"v": sum(ctx.all(items)) % MODULUS}


@workflow("chaos.fan")
def fan(ctx, input):
    items = []
    for index in range(input["k"]):
        name = f"f{index}"
        planned = input["failures"].get(str(index), 0)
        if planned:
            items.append(Step(name, flaky, (ctx.run_id, name, input["x"] + index, planned), **_retrying(planned)))
        else:
            items.append(Step(name, compute, (ctx.run_id, name, input["x"] + index)))
    return {"v": sum(ctx.all(items)) % MODULUS}


@workflow("chaos.fail_fast")
def fail_fast(ctx, input):
    """A fail_fast fan whose two failures settle at different times: whichever the workflow caught first
    must be the one every later replay catches (the step name after it depends on it)."""
    run_id = ctx.run_id
    items = [Step("late", fail_after, (run_id, "late", 1.2), timeout=3.0),
             Step("ok1", slow, (run_id, "ok1", input["x"], 0.4), timeout=3.0),
             Step("ok2", slow, (run_id, "ok2", input["x"], 0.4), timeout=3.0),
             Step("early", boom, (run_id, "early"))]
    try:
        ctx.all(items, mode="fail_fast")
        caught = "none"
    except StepFailed as exc:
        caught = exc.name
    value = ctx.step(f"caught-{caught}", compute, run_id, f"caught-{caught}", input["x"])
    ctx.sleep(2.0)  # long enough for the other failure to settle before the next replay
    return {"caught": caught, "v": value}


@workflow("chaos.leaf")
def leaf(ctx, input):
    value = ctx.step("l0", compute, ctx.run_id, "l0", input["x"])
    value = ctx.step("l1", compute, ctx.run_id, "l1", value, queue="steps")
    ctx.sleep(input["sleep"])
    return {"v": ctx.step("l2", compute, ctx.run_id, "l2", value)}


@workflow("chaos.parent")
def parent(ctx, input):
    x, sleep = input["x"], input["sleep"]
    first = ctx.child("chaos.leaf", {"x": x, "sleep": sleep}, name="c1")
    results = ctx.all([Child("chaos.leaf", {"x": x + 1, "sleep": sleep}, name="c2"),
                       Child("chaos.leaf", {"x": x + 2, "sleep": sleep}, name="c3"),
                       Step("fs", compute, (ctx.run_id, "fs", x + 3))])
    total = first["v"] + results[0]["v"] + results[1]["v"] + results[2]
    return {"v": ctx.step("join", compute, ctx.run_id, "join", total)}


@workflow("chaos.sleepy")
def sleepy(ctx, input):
    value = input["x"]
    for index, seconds in enumerate(input["sleeps"]):
        value = ctx.step(f"z{index}", compute, ctx.run_id, f"z{index}", value)
        ctx.sleep(seconds)
    return {"v": ctx.step("zend", compute, ctx.run_id, "zend", value)}


@workflow("chaos.signal")
def signalled(ctx, input):
    value = ctx.step("pre", compute, ctx.run_id, "pre", input["x"])
    payload = ctx.wait_for_signal("go")
    return {"v": ctx.step("post", compute, ctx.run_id, "post", value + payload["add"]), "p": payload["add"]}


@workflow("chaos.signal_timeout")
def signal_timeout(ctx, input):
    payload = ctx.wait_for_signal("never", timeout=input["timeout"], default={"add": -1})
    return {"v": ctx.step("post", compute, ctx.run_id, "post", input["x"] + payload["add"])}


@workflow("chaos.gated")
def gated_run(ctx, input):
    value = ctx.step("pre", compute, ctx.run_id, "pre", input["x"])
    value = ctx.step("gate", gated, ctx.run_id, "gate", value, input["gate"], retries=1, backoff="fixed",
                     backoff_base=0.2, jitter=False, queue="steps" if input["queued"] else None)
    return {"v": value}


@workflow("chaos.gated_fan")
def gated_fan(ctx, input):
    """A fan with one item that fails while its gate is closed: the run fails, the driver opens the gate and
    retries it; the settled items are kept (plain retry) or everything starts over (new input)."""
    x = input["x"]
    items = [Step(f"f{index}", compute, (ctx.run_id, f"f{index}", x + index)) for index in range(input["k"])]
    items.append(Step("gate", gated, (ctx.run_id, "gate", x, input["gate"]), retries=1, backoff="fixed",
                      backoff_base=0.2, jitter=False))
    return {"v": sum(ctx.all(items)) % MODULUS}


@workflow("chaos.gated_parent")
def gated_parent(ctx, input):
    result = ctx.child("chaos.gated", {"x": input["x"], "gate": input["gate"], "queued": input["queued"]},
                       name="gc")
    return {"v": ctx.step("after", compute, ctx.run_id, "after", result["v"])}


@workflow("chaos.inline_slow")
def inline_slow(ctx, input):
    """Long inline steps: a worker paused in one loses its lease, another takes the run over, and the
    paused one wakes up later as a stale owner."""
    value = input["x"]
    for index, seconds in enumerate(input["seconds"]):
        value = ctx.step(f"i{index}", busy, ctx.run_id, f"i{index}", value, seconds)
    return {"v": value}


@workflow("chaos.stale")
def stale(ctx, input):
    """The driver pauses the worker running `slow`, cancels the run, retries it with new input, and lets
    the paused worker go once another one runs the new attempt: the old result must not be kept."""
    value = ctx.step("prep", compute, ctx.run_id, "prep", input["x"])
    value = ctx.step("slow", slow, ctx.run_id, "slow", value, input["seconds"], queue="steps", timeout=SLOW_TIMEOUT)
    return {"v": value}


@workflow("chaos.cancel_mid_turn")
def cancel_mid_turn(ctx, input):
    """The driver cancels the run while its turn is in `think`: the turn must not start the children."""
    value = ctx.step("think", busy, ctx.run_id, "think", input["x"], input["seconds"])
    results = ctx.all([Child("chaos.leaf", {"x": value + index, "sleep": 0.2}, name=f"k{index}")
                       for index in range(2)])
    return {"v": sum(result["v"] for result in results) % MODULUS}


# ---------------------------------------------------------------------------- expected outputs (driver)


def _chain(value: int, labels) -> int:
    for label in labels:
        value = mix(value, label)
    return value


def _leaf(x: int) -> int:
    return _chain(x, ["l0", "l1", "l2"])


def _expect(kind: str, input: dict, output) -> object:
    """The output a run of `kind` must end with, computed from its input without the engine. For a
    fail_fast run either failure may be caught first: the rest must follow from the one it reports."""
    x = input.get("x")
    if kind == "inline":
        return {"v": _chain(x, [*(f"s{i}" for i in range(input["n"])), "flaky"])}
    if kind == "queued":
        return {"v": _chain(x, [*(f"q{i}" for i in range(input["n"])), "qflaky"])}
    if kind == "slow":
        return {"v": _chain(x, ["prep", "slow", "after"])}
    if kind == "slow_fan":
        return {"v": sum(mix(x + i, f"w{i}") for i in range(len(input["seconds"]))) % MODULUS}
    if kind == "fan":
        return {"v": sum(mix(x + i, f"f{i}") for i in range(input["k"])) % MODULUS}
    if kind == "fail_fast":
        caught = output.get("caught") if isinstance(output, dict) else None
        if caught not in ("late", "early"):
            return {"caught": "late or early", "v": "mix(x, caught-<name>)"}
        return {"caught": caught, "v": mix(x, f"caught-{caught}")}
    if kind == "parent":
        return {"v": mix(_leaf(x) + _leaf(x + 1) + _leaf(x + 2) + mix(x + 3, "fs"), "join")}
    if kind == "sleepy":
        return {"v": _chain(x, [*(f"z{i}" for i in range(len(input["sleeps"]))), "zend"])}
    if kind == "signal":
        return {"v": mix(mix(x, "pre") + input["add"], "post"), "p": input["add"]}
    if kind == "signal_timeout":
        return {"v": mix(x - 1, "post")}
    if kind == "gated":
        return {"v": _chain(x, ["pre", "gate"])}
    if kind == "gated_parent":
        return {"v": _chain(x, ["pre", "gate", "after"])}
    if kind == "gated_fan":
        return {"v": (sum(mix(x + i, f"f{i}") for i in range(input["k"])) + mix(x, "gate")) % MODULUS}
    if kind == "inline_slow":
        return {"v": _chain(x, [f"i{i}" for i in range(len(input["seconds"]))])}
    if kind == "stale":
        return {"v": _chain(x, ["prep", "slow"])}
    if kind == "cancel_mid_turn":
        return {"v": sum(_leaf(mix(x, "think") + i) for i in range(2)) % MODULUS}
    raise ValueError(kind)


# ------------------------------------------------------------------------------------------------- plans


KINDS = {  # kind: (workflow, weight, may the driver cancel it at random)
    "inline": ("chaos.inline", 3, True),
    "queued": ("chaos.queued", 3, True),
    "slow": ("chaos.slow", 2, True),
    "slow_fan": ("chaos.slow_fan", 1, True),
    "fan": ("chaos.fan", 2, True),
    "fail_fast": ("chaos.fail_fast", 1, True),
    "parent": ("chaos.parent", 2, True),
    "sleepy": ("chaos.sleepy", 2, True),
    "signal": ("chaos.signal", 2, True),
    "signal_timeout": ("chaos.signal_timeout", 1, True),
    "gated": ("chaos.gated", 2, False),
    "gated_parent": ("chaos.gated_parent", 1, False),
    "gated_fan": ("chaos.gated_fan", 1, False),
    "inline_slow": ("chaos.inline_slow", 2, True),
    "stale": ("chaos.stale", 1, False),
    "cancel_mid_turn": ("chaos.cancel_mid_turn", 1, False),
}


@dataclass
class Plan:
    """One run and what the driver does to it. Times are seconds from the driver's start."""

    run_id: str
    kind: str
    input: dict
    start_at: float
    expected: str = "completed"
    signal_at: float | None = None
    cancel_at: float | None = None
    after_cancel: str = ""  # "", "retry" or "new_input"
    retry_at: float | None = None
    retry_new_input: bool = False
    gate_mode: str = ""  # gated kinds: "leave", "retry", "new_input", "child_then_parent"
    stage: str = ""  # the next thing the driver waits for (gated, stale and cancel_mid_turn kinds), or "done"
    held: tuple | None = None  # stale kind: (worker index, worker label, database time of the retry, deadline)
    started: bool = False
    cancel_windows: list = field(default_factory=list)  # [db time cancelled, db time retried or None]
    history: list = field(default_factory=list)

    @property
    def workflow(self) -> str:
        return KINDS[self.kind][0]

    def note(self, now: float, text: str) -> None:
        self.history.append(f"{now:.1f}s {text}")


def _input_for(kind: str, rng: random.Random, run_id: str) -> dict:
    x = rng.randint(0, 10**6)
    if kind == "inline":
        return {"x": x, "n": rng.randint(3, 8), "failures": rng.randint(0, 2)}
    if kind == "queued":
        return {"x": x, "n": rng.randint(2, 5), "failures": rng.randint(0, 2)}
    if kind == "slow":
        return {"x": x, "seconds": round(rng.uniform(1.5, 3.0), 2)}
    if kind == "slow_fan":
        return {"x": x, "seconds": [round(rng.uniform(0.7, 1.0), 2) for _ in range(3)]}
    if kind == "fan":
        k = rng.randint(4, 10)
        return {"x": x, "k": k, "failures": {str(i): rng.randint(1, 2) for i in range(k) if rng.random() < 0.25}}
    if kind == "parent":
        return {"x": x, "sleep": round(rng.uniform(0.2, 1.0), 2)}
    if kind == "sleepy":
        return {"x": x, "sleeps": [round(rng.uniform(0.2, 2.0), 2) for _ in range(rng.randint(1, 3))]}
    if kind == "signal":
        return {"x": x, "add": rng.randint(1, 99)}
    if kind == "signal_timeout":
        return {"x": x, "timeout": round(rng.uniform(0.5, 2.0), 2)}
    if kind in ("gated", "gated_parent"):
        return {"x": x, "gate": run_id, "queued": rng.random() < 0.5}
    if kind == "gated_fan":
        return {"x": x, "k": rng.randint(2, 5), "gate": run_id}
    if kind == "inline_slow":
        return {"x": x, "seconds": [round(rng.uniform(0.5, 1.2), 2) for _ in range(3)]}
    if kind == "stale":
        return {"x": x, "seconds": 3.0}
    if kind == "cancel_mid_turn":
        return {"x": x, "seconds": 1.5}
    return {"x": x}


def make_plans(rng: random.Random, *, prefix: str, runs: int, start_window: float, cancel_chance: float,
               retry_after_cancel_chance: float) -> list[Plan]:
    kinds = list(KINDS)
    weights = [KINDS[kind][1] for kind in kinds]
    plans = []
    for index in range(runs):
        # every kind at least once, then by weight
        kind = kinds[index] if index < len(kinds) else rng.choices(kinds, weights)[0]
        run_id = f"{prefix}{index:03d}-{kind}"
        plan = Plan(run_id=run_id, kind=kind, input=_input_for(kind, rng, run_id),
                    start_at=round(rng.uniform(0, start_window), 2))
        if kind == "signal":
            plan.signal_at = plan.start_at + rng.uniform(0, 4)
        if kind in ("gated", "gated_fan"):
            plan.gate_mode = rng.choice(["leave", "retry", "retry", "new_input"])
        elif kind == "gated_parent":
            plan.gate_mode = "child_then_parent"
        if plan.gate_mode:
            plan.expected, plan.stage = "failed", "await_failure"
        elif kind == "stale":
            plan.stage = "await_execution"
        elif kind == "cancel_mid_turn":
            plan.stage = "await_think"
        elif KINDS[kind][2] and rng.random() < cancel_chance:
            plan.cancel_at = plan.start_at + rng.uniform(0.2, 4.0)
            if rng.random() < retry_after_cancel_chance:
                plan.after_cancel = rng.choice(["retry", "new_input"])
        plans.append(plan)
    return plans


# ------------------------------------------------------------------------------------ workers and tick


class WorkerPool:
    """Celery worker subprocesses (prefork, -c 1), each leading its own process group, so a kill takes
    the pool child with it, as a machine or container dying would."""

    def __init__(self, count: int, env: dict, log_dir: Path):
        from config.supervisor import BASE_DIR

        self.base_dir = BASE_DIR
        self.env = env
        self.log_dir = log_dir
        self.slots: list[subprocess.Popen | None] = [None] * count
        self.labels = [""] * count
        self.paused: dict[int, float | None] = {}  # index: when to resume it (None: a scenario holds it)
        self.started = 0
        self.exited = 0  # exits nobody asked for
        self.logs: list[Path] = []

    def start(self, index: int) -> None:
        """Start worker `index` under a new label (worker<index>.<n>): its database connections carry the
        label as their application_name and its step executions are logged with it."""
        self.started += 1
        label = f"worker{index}.{self.started}"
        self.labels[index] = label
        log = self.log_dir / f"{label}.log"
        self.logs.append(log)
        env = {**self.env, "DATABASE_URL": database_url(label, f"-c lock_timeout={WORKER_LOCK_TIMEOUT_MS}"),
               "CHAOS_WORKER": label}
        command = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", ",".join(QUEUES), "-c", "1",
                   "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "-n", f"chaos-{label}-{os.getpid()}@%h", "--loglevel", "WARNING"]
        with log.open("wb") as handle:
            self.slots[index] = subprocess.Popen(command, cwd=self.base_dir, env=env, stdout=handle,
                                                 stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> list[int]:
        alive = []
        for index, process in enumerate(self.slots):
            if process is None:
                continue
            if process.poll() is None:
                alive.append(index)
            else:
                self.exited += 1
                self.slots[index] = None
        return alive

    def dead(self) -> list[int]:
        alive = set(self.alive())
        return [index for index in range(len(self.slots)) if index not in alive]

    def index_of(self, label: str) -> int | None:
        return self.labels.index(label) if label in self.labels and self.slots[self.labels.index(label)] else None

    def kill(self, index: int) -> None:
        process = self.slots[index]
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        self.slots[index] = None
        self.paused.pop(index, None)

    def pause(self, index: int, resume_at: float | None) -> None:
        """SIGSTOP the worker's process group: alive but silent, like a machine stalled by its hypervisor
        or a long GC pause; its leases and step timeouts expire while it sleeps."""
        process = self.slots[index]
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGSTOP)
            self.paused[index] = resume_at

    def resume(self, index: int) -> None:
        process = self.slots[index]
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)
        self.paused.pop(index, None)

    def stop(self) -> None:
        from config.supervisor import stop_process_groups

        for index in list(self.paused):
            self.resume(index)
        stop_process_groups([p for p in self.slots if p is not None], timeout=20)
        self.slots = [None] * len(self.slots)

    def error_lines(self, limit: int = 20) -> tuple[int, list[str]]:
        lines = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                          if "Traceback" in line or " ERROR" in line or "CRITICAL" in line]
        return len(lines), lines[:limit]


class Ticker(threading.Thread):
    """durable.tick.tick() every `interval` seconds, on this thread's own database connection."""

    def __init__(self, interval: float):
        super().__init__(name="chaos-tick", daemon=True)
        self.interval = interval
        self.halt = threading.Event()
        self.ticks = 0
        self.phase_errors: Counter = Counter()

    def run(self) -> None:
        from django.db import connection

        from durable import tick

        try:
            while not self.halt.is_set():
                try:
                    report = tick.tick()
                    self.ticks += 1
                    for phase, value in report.items():
                        if isinstance(value, str):
                            self.phase_errors[phase] += 1
                except Exception:
                    self.phase_errors["tick"] += 1
                    connection.close()
                self.halt.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def purge_queues() -> None:
    """Drop the messages left in the turn and step queues (their runs are gone with the database)."""
    from config.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in QUEUES:
            with contextlib.suppress(Exception):
                channel.queue_purge(name)


# ------------------------------------------------------------------------------------------------ driver


@dataclass
class ChaosConfig:
    seed: int
    log_dir: Path
    runs: int = 54
    duration: float = 45.0  # seconds of chaos: kills, pauses and database trouble happen in this window
    start_window: float = 33.0  # runs start within this window
    workers: int = 3
    kill_every: tuple[float, float] | None = (2.0, 5.0)
    restart_after: tuple[float, float] = (0.5, 2.5)
    outage_chance: float = 0.15  # a kill takes every live worker down at once
    pause_every: tuple[float, float] | None = (3.0, 7.0)
    pause_for: tuple[float, float] = (2.5, 4.5)  # longer than a lease and a slow step's timeout
    db_kill_every: tuple[float, float] | None = (2.0, 5.0)
    db_stall_every: tuple[float, float] | None = (6.0, 12.0)
    db_stall_for: float = 1.0  # a table locked this long: workers' statements hit their lock timeout
    cancel_chance: float = 0.25
    retry_after_cancel_chance: float = 0.6
    tick_every: float = 0.25
    stall_seconds: float = 15.0  # the recovery horizon: nothing moved for this long means what is left is stuck
    drain_cap: float = 60.0  # at most this long after the chaos window
    log: Callable[[str], None] = print


class ChaosDriver:
    def __init__(self, config: ChaosConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.prefix = f"chaos-{config.seed}-"
        self.stats = Counter()
        # (worker label, or "*" for every worker; database clock) of each kill, pause and database stall:
        # the checks use them to tell a timeout the suite caused from one the engine caused
        self.disruptions: list[tuple[str, object]] = []
        self.stall_threads: list[threading.Thread] = []
        self.started = 0.0
        self.pool: WorkerPool | None = None

    # -- helpers

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _db_now(self):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]

    def _uniform(self, bounds: tuple[float, float]) -> float:
        return self.rng.uniform(*bounds)

    def _next(self, bounds: tuple[float, float] | None, now: float) -> float | None:
        return None if bounds is None else now + self._uniform(bounds)

    def worker_env(self) -> dict:
        env = {**os.environ, "DURABLE_WORKFLOW_MODULES": MODULE, "PYTHONUNBUFFERED": "1"}
        env.update({key: str(value) for key, value in ENGINE_SETTINGS.items()})
        return env

    def _statuses(self) -> dict[str, str]:
        from durable.models import DurableRun

        return dict(DurableRun.objects.filter(id__startswith=self.prefix).values_list("id", "status"))

    def _executions(self, run_id: str, step: str) -> list[tuple[str, object]]:
        """(worker label, database time) of each start of `step` of `run_id`."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT worker, started_at FROM chaos_execution WHERE run_id = %s AND step = %s "
                           "ORDER BY id", [run_id, step])
            return cursor.fetchall()

    # -- the run

    def run(self) -> dict:
        config = self.config
        config.log(f"chaos: seed {config.seed} (reproduce with CHAOS_SEED={config.seed}); {config.runs} runs, "
                   f"{config.workers} workers, {config.duration:.0f}s of chaos")
        plans = make_plans(self.rng, prefix=self.prefix, runs=config.runs, start_window=config.start_window,
                           cancel_chance=config.cancel_chance,
                           retry_after_cancel_chance=config.retry_after_cancel_chance)
        purge_queues()
        pool = self.pool = WorkerPool(config.workers, self.worker_env(), config.log_dir)
        ticker = Ticker(config.tick_every)
        self.started = time.monotonic()
        timings = {}
        try:
            for index in range(config.workers):
                pool.start(index)
            ticker.start()
            timings = self._loop(plans, pool)
        finally:
            ticker.stop()
            pool.stop()
            for thread in self.stall_threads:
                thread.join(10)
            purge_queues()
        error_count, error_sample = pool.error_lines()
        report = check(self.prefix, plans, self.disruptions)
        report["seed"] = config.seed
        report["counts"] = {
            "runs": len(plans), "child_runs": report.pop("child_runs"), "kills": self.stats["kills"],
            "restarts": self.stats["restarts"], "pauses": self.stats["pauses"],
            "db_connection_kills": self.stats["db_kills"], "db_lock_stalls": self.stats["db_stalls"],
            "cancels": self.stats["cancels"], "retries": self.stats["retries"],
            "retries_new_input": self.stats["retries_new_input"], "signals": self.stats["signals"],
            "gates_opened": self.stats["gates"], "stale_worker_scenarios": self.stats["stale_scenarios"],
            "worker_starts": pool.started, "unexpected_worker_exits": pool.exited, "ticks": ticker.ticks,
        }
        report["tick_phase_errors"] = dict(ticker.phase_errors)
        report["worker_log_errors"] = {"count": error_count, "sample": error_sample}
        report["timings_s"] = timings
        report["config"] = {k: v for k, v in config.__dict__.items() if k not in ("log", "log_dir")}
        report["engine_settings"] = {**ENGINE_SETTINGS, "worker lock_timeout ms": WORKER_LOCK_TIMEOUT_MS}
        return report

    def _loop(self, plans: list[Plan], pool: WorkerPool) -> dict:
        config = self.config
        next_kill = self._next(config.kill_every, 0)
        next_pause = self._next(config.pause_every, 0)
        next_db_kill = self._next(config.db_kill_every, 0)
        next_db_stall = self._next(config.db_stall_every, 0)
        restart_at: dict[int, float] = {}
        last_fingerprint, last_progress = None, 0.0
        next_report = 5.0
        chaos_ended_at = None
        while True:
            now = self._now()
            chaos = now < config.duration
            statuses = self._statuses()
            for plan in plans:
                self._act(plan, now, statuses)
            for index, resume_at in list(pool.paused.items()):
                if resume_at is not None and (now >= resume_at or not chaos):
                    pool.resume(index)
                    self.disruptions.append((pool.labels[index], self._db_now()))
            if chaos:
                if next_kill is not None and now >= next_kill:
                    self._kill_workers(pool, now, restart_at)
                    next_kill = self._next(config.kill_every, now)
                if next_pause is not None and now >= next_pause:
                    self._pause_a_worker(pool, now)
                    next_pause = self._next(config.pause_every, now)
                if next_db_kill is not None and now >= next_db_kill:
                    self._kill_a_connection()
                    next_db_kill = self._next(config.db_kill_every, now)
                if next_db_stall is not None and now >= next_db_stall:
                    self._stall_a_table()
                    next_db_stall = self._next(config.db_stall_every, now)
                for index in pool.dead():
                    if index not in restart_at:  # it died on its own: bring it back like the others
                        restart_at[index] = now + self._uniform(config.restart_after)
                for index, when in list(restart_at.items()):
                    if now >= when:
                        pool.start(index)
                        self.stats["restarts"] += 1
                        del restart_at[index]
            else:
                if chaos_ended_at is None:
                    chaos_ended_at = now
                    config.log(f"chaos: {now:.1f}s chaos over; draining")
                for index in pool.dead():
                    pool.start(index)
                    self.stats["restarts"] += 1
                restart_at.clear()
                statuses = self._statuses()  # again: this round's actions (a retry) may have revived a run
                fingerprint = self._fingerprint(plans, statuses)
                if fingerprint != last_fingerprint:
                    last_fingerprint, last_progress = fingerprint, now
                active = [rid for rid, status in statuses.items() if status in ("pending", "running", "suspended")]
                if not active and not self._driver_busy(plans):
                    break
                if now - last_progress > config.stall_seconds:
                    config.log(f"chaos: {now:.1f}s nothing moved for {config.stall_seconds:.0f}s; "
                               f"{len(active)} runs still active")
                    break
                if now - chaos_ended_at > config.drain_cap:
                    config.log(f"chaos: {now:.1f}s drain cap reached; {len(active)} runs still active")
                    break
            if now >= next_report:
                counts = Counter(statuses.values())
                config.log(f"chaos: {now:5.1f}s " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                           + f"; kills {self.stats['kills']}, pauses {self.stats['pauses']}, "
                           f"workers alive {len(pool.alive())}")
                next_report = now + 5.0
            time.sleep(0.1)
        end = self._now()
        return {"chaos": round(chaos_ended_at or end, 1), "drain": round(end - (chaos_ended_at or end), 1),
                "total": round(end, 1)}

    def _fingerprint(self, plans, statuses) -> tuple:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT coalesce(sum(turns), 0) FROM durable_durablerun WHERE id LIKE %s), "
                "(SELECT count(*) FROM chaos_transition)", [self.prefix + "%"])
            row = cursor.fetchone()
        pending_actions = sum(1 for plan in plans if self._plan_busy(plan))
        return (tuple(sorted(Counter(statuses.values()).items())), row, pending_actions)

    @staticmethod
    def _plan_busy(plan: Plan) -> bool:
        return (not plan.started or plan.cancel_at is not None or plan.retry_at is not None
                or plan.signal_at is not None or plan.stage not in ("", "done"))

    def _driver_busy(self, plans) -> bool:
        return any(self._plan_busy(plan) for plan in plans)

    # -- chaos

    def _kill_workers(self, pool: WorkerPool, now: float, restart_at: dict[int, float]) -> None:
        held = {index for index, resume_at in pool.paused.items() if resume_at is None}
        alive = [index for index in pool.alive() if index not in held]
        if not alive:
            return
        victims = alive if self.rng.random() < self.config.outage_chance else [self.rng.choice(alive)]
        for index in victims:
            label = pool.labels[index]
            pool.kill(index)
            self.disruptions.append((label, self._db_now()))
            self.stats["kills"] += 1
            restart_at[index] = now + self._uniform(self.config.restart_after)

    def _pause_a_worker(self, pool: WorkerPool, now: float) -> None:
        candidates = [index for index in pool.alive() if index not in pool.paused]
        if len(candidates) < 2:  # keep one worker running
            return
        index = self.rng.choice(candidates)
        self.disruptions.append((pool.labels[index], self._db_now()))
        pool.pause(index, now + self._uniform(self.config.pause_for))
        self.stats["pauses"] += 1

    def _kill_a_connection(self) -> None:
        """Terminate one database connection of a worker: the engine meets a connection error mid-turn
        or mid-step, as it would on a database failover."""
        from django.db import connection

        with connection.cursor() as cursor:
            # workers' connections only (named after their worker): never the driver's, the tick's or the suite's
            cursor.execute(
                "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND application_name LIKE %s ORDER BY pid",
                ["worker%"],
            )
            backends = cursor.fetchall()
            if not backends:
                return
            pid, label = self.rng.choice(backends)
            cursor.execute("SELECT pg_terminate_backend(%s), clock_timestamp()", [pid])
            terminated, at = cursor.fetchone()
        if terminated:
            self.stats["db_kills"] += 1
            self.disruptions.append((label, at))

    def _stall_a_table(self) -> None:
        """Hold an EXCLUSIVE lock (reads pass, writes wait) on the run or the checkpoint table for a while,
        from a thread of the suite's own: workers' writes wait past their lock timeout and fail."""
        table = self.rng.choice(["durable_durablerun", "durable_stepcheckpoint"])
        seconds = self.config.db_stall_for

        def stall():
            with contextlib.suppress(psycopg.Error), side_connection("chaos-stall") as conn, conn.transaction():
                conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
                time.sleep(seconds)

        self.stall_threads = [thread for thread in self.stall_threads if thread.is_alive()]
        thread = threading.Thread(target=stall, name="chaos-stall", daemon=True)
        thread.start()
        self.stall_threads.append(thread)
        self.disruptions.append(("*", self._db_now()))
        self.stats["db_stalls"] += 1

    # -- the driver's actions on one run

    def _act(self, plan: Plan, now: float, statuses: dict[str, str]) -> None:
        from durable import errors, services

        if not plan.started:
            if now >= plan.start_at:
                services.run_start(workflow=plan.workflow, input=plan.input, run_id=plan.run_id)
                plan.started = True
                plan.note(now, "started")
            return
        status = statuses.get(plan.run_id)
        if plan.signal_at is not None and now >= plan.signal_at:
            try:
                outcome = services.signal_send(run_id=plan.run_id, name="go", payload={"add": plan.input["add"]})
                self.stats["signals"] += 1
                plan.note(now, f"signal {outcome}")
            except errors.InvalidRunState:
                plan.note(now, f"signal refused ({status})")
            plan.signal_at = None
        if plan.cancel_at is not None and now >= plan.cancel_at:
            plan.cancel_at = None
            if self._cancel(plan, now, status) and plan.after_cancel:
                plan.retry_at = now + self.rng.uniform(0.3, 2.0)
                plan.retry_new_input = plan.after_cancel == "new_input"
        if plan.retry_at is not None and now >= plan.retry_at:
            plan.retry_at = None
            self._retry(plan, plan.run_id, now, new_input=plan.retry_new_input)
        if plan.stage in ("await_failure", "await_child"):
            self._act_gated(plan, now, status)
        elif plan.stage in ("await_execution", "await_second"):
            self._act_stale(plan, now, status)
        elif plan.stage == "await_think":
            if self._executions(plan.run_id, "think"):
                self._cancel(plan, now, status)  # while the turn is still inside the step
                plan.stage = "done"
            elif status not in ("pending", "running", "suspended"):
                plan.stage = "done"

    def _cancel(self, plan: Plan, now: float, status: str | None) -> bool:
        from durable import services
        from durable.models import DurableRun

        if not services.run_cancel(run_id=plan.run_id, reason="chaos: cancelled by the driver"):
            plan.note(now, f"cancel refused ({status})")
            return False
        self.stats["cancels"] += 1
        plan.expected = "cancelled"
        ended = DurableRun.objects.filter(pk=plan.run_id).values_list("ended_at", flat=True).get()
        plan.cancel_windows.append([ended, None])
        plan.note(now, "cancelled")
        return True

    def _act_gated(self, plan: Plan, now: float, status: str | None) -> None:
        from durable.models import DurableRun

        if plan.stage == "await_failure" and status in ("failed", "completed", "cancelled", "dead"):
            if status != "failed":
                plan.note(now, f"ended {status} with its gate closed")
                plan.stage = "done"
            elif plan.gate_mode == "leave":
                plan.note(now, "failed; left failed")
                plan.stage = "done"
            else:
                self._open_gate(plan)
                if plan.gate_mode == "child_then_parent":
                    child = DurableRun.objects.filter(parent_id=plan.run_id).values_list("id", flat=True).first()
                    if child is None:
                        plan.note(now, "failed but has no child")
                        plan.stage = "done"
                    else:
                        self._retry(plan, child, now, new_input=False, expect=False)
                        plan.stage = "await_child"
                else:
                    self._retry(plan, plan.run_id, now, new_input=plan.gate_mode == "new_input")
                    plan.stage = "done"
        elif plan.stage == "await_child":
            child = DurableRun.objects.filter(parent_id=plan.run_id).values_list("id", "status").first()
            if child and child[1] in ("failed", "cancelled", "dead"):
                plan.note(now, f"child {child[0]} ended {child[1]} after its retry")
                plan.stage = "done"
            elif child and child[1] == "completed":
                self._retry(plan, plan.run_id, now, new_input=False)
                plan.stage = "done"

    def _act_stale(self, plan: Plan, now: float, status: str | None) -> None:
        """Pause the worker running `slow`, cancel, retry with new input (and a longer step), and let the
        paused worker go once another worker has started the new attempt."""
        pool = self.pool
        if plan.stage == "await_execution":
            executions = self._executions(plan.run_id, "slow")
            if status not in ("pending", "running", "suspended"):
                plan.stage = "done"
                return
            if not executions:
                return
            label = executions[-1][0]
            index = pool.index_of(label)
            others = [i for i in pool.alive() if i != index and i not in pool.paused]
            if index is None or index in pool.paused or not others:
                plan.note(now, f"stale scenario skipped ({label} not available alone)")
                plan.stage = "done"
                return
            pool.pause(index, None)
            self.disruptions.append((label, self._db_now()))
            self.stats["stale_scenarios"] += 1
            plan.note(now, f"paused {label} inside slow")
            if not self._cancel(plan, now, status):
                pool.resume(index)
                plan.stage = "done"
                return
            retried_at = self._db_now()
            self._retry(plan, plan.run_id, now, new_input=True, longer=True)
            plan.held = (index, label, retried_at, now + 10.0)
            plan.stage = "await_second"
        else:
            index, label, retried_at, deadline = plan.held
            second = [w for w, at in self._executions(plan.run_id, "slow") if w != label and at > retried_at]
            if second or now >= deadline or pool.labels[index] != label:
                if pool.labels[index] == label and index in pool.paused:
                    pool.resume(index)
                    self.disruptions.append((label, self._db_now()))
                plan.note(now, f"resumed {label}" + (f" after {second[0]} started the new attempt" if second
                                                     else " (no other worker started the new attempt)"))
                plan.stage = "done"

    def _retry(self, plan: Plan, run_id: str, now: float, *, new_input: bool, expect: bool = True,
               longer: bool = False) -> None:
        from durable import services

        before = self._db_now()
        new = None
        if new_input:
            new = copy.deepcopy(plan.input)
            new["x"] = new["x"] + 1000
            if longer:
                new["seconds"] = new["seconds"] + 2.0
        if services.run_retry(run_id=run_id, input=new, new_input=new_input):
            self.stats["retries"] += 1
            self.stats["retries_new_input"] += int(new_input)
            if expect:
                plan.expected = "completed"
                if new_input:
                    plan.input = new
            for window in plan.cancel_windows:
                if window[1] is None:
                    window[1] = before
            plan.note(now, f"retried {run_id}" + (" with new input" if new_input else ""))
            if plan.kind == "signal":
                plan.signal_at = now + self.rng.uniform(0, 1.0)
        else:
            plan.note(now, f"retry of {run_id} refused")

    def _open_gate(self, plan: Plan) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO chaos_gate (name) VALUES (%s) ON CONFLICT DO NOTHING", [plan.input["gate"]])
        self.stats["gates"] += 1


# ---------------------------------------------------------------------------------------------- checks


def _decode(text):
    from durable.codec import decode

    return decode(text, column="chaos", row="chaos") if text else None


def check(prefix: str, plans: list[Plan], disruptions: list[tuple[str, object]]) -> dict:
    """The four invariants (each with its count and the offending rows), and a few numbers that explain them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, workflow, status, output, error, parent_id, created_at, wake_pending, wake_at, locked_until, "
            "recovery_attempts, turns, ended_at FROM durable_durablerun WHERE id LIKE %s", [prefix + "%"])
        runs = {row[0]: row for row in cursor.fetchall()}
        cursor.execute(
            "SELECT run_id, seq, name, kind, status, queue, child_run_id, parallel_group, wake_at, attempt, options "
            "FROM durable_stepcheckpoint WHERE run_id LIKE %s ORDER BY run_id, seq", [prefix + "%"])
        checkpoints = defaultdict(list)
        for row in cursor.fetchall():
            checkpoints[row[0]].append(row)
        # 2. an execution that started after its step's checkpoint was written
        cursor.execute(
            """SELECT e.run_id, e.step, e.worker, e.started_at, c.completed_at, c.attempt, c.queue
               FROM chaos_execution e JOIN durable_stepcheckpoint c
                 ON c.run_id = e.run_id AND c.name = e.step AND c.kind = 'step' AND c.status = 'completed'
               WHERE e.run_id LIKE %s AND e.started_at > c.completed_at ORDER BY e.started_at""", [prefix + "%"])
        late = cursor.fetchall()
        cursor.execute(
            "SELECT count(*), count(DISTINCT (run_id, step)) FROM chaos_execution WHERE run_id LIKE %s", [prefix + "%"])
        executions, executed_steps = cursor.fetchone()
        cursor.execute(
            "SELECT id, run_id, seq, name, op, old_status, new_status, attempt, timed_out, app, at "
            "FROM chaos_transition WHERE run_id LIKE %s ORDER BY id", [prefix + "%"])
        transitions = cursor.fetchall()
        cursor.execute("SELECT run_id, step, started_at FROM chaos_execution WHERE run_id LIKE %s", [prefix + "%"])
        started_at = defaultdict(list)
        for run_id, step, at in cursor.fetchall():
            started_at[(run_id, step)].append(at)

    # 1. every run in the state the driver expects
    wrong = []
    for plan in plans:
        row = runs.get(plan.run_id)
        status = row[2] if row else "missing"
        output = _decode(row[3]) if row else None
        problem = None
        if status != plan.expected:
            problem = f"{status}, expected {plan.expected}"
            if status in ("pending", "running", "suspended"):
                problem += f" ({_diagnose(row, checkpoints[plan.run_id], runs)})"
        elif status == "completed":
            expected = _expect(plan.kind, plan.input, output)
            if output != expected:
                problem = f"output {output}, expected {expected}"
        if problem:
            error = _decode(row[4]) if row else None
            entry = {"run_id": plan.run_id, "kind": plan.kind, "problem": problem, "error": _short_error(error),
                     "history": plan.history}
            entry["hint"] = _hint(entry, error.get("traceback", "") if isinstance(error, dict) else "")
            wrong.append(entry)
    # children created after their root was cancelled (and before it was retried) that were not cancelled
    # with it, or ran anyway
    windows = {plan.run_id: plan.cancel_windows for plan in plans if plan.cancel_windows}
    for run_id, row in runs.items():
        if "/" not in run_id or (row[2] == "cancelled" and not row[11]):
            continue
        root = run_id.split("/", 1)[0]
        for cancelled, retried in windows.get(root, ()):
            if row[6] > cancelled and (retried is None or row[6] < retried):
                wrong.append({"run_id": run_id, "kind": "child", "problem":
                              f"created {(row[6] - cancelled).total_seconds():.3f}s after its root was cancelled",
                              "error": None, "history": [],
                              "hint": "a turn still running when its run was cancelled went on to start children"})

    # 2. executions after the checkpoint
    ran_again = [{"run_id": r[0], "step": r[1], "worker": r[2], "after_s": round((r[3] - r[4]).total_seconds(), 3),
                  "checkpoint_attempt": r[5], "queued": bool(r[6]),
                  "hint": ("a worker started a queued step it had claimed (often in a chunk, behind other steps) "
                           "after its claim timed out and another worker completed it") if r[6] else
                          ("a turn that had lost its lease ran an inline step the new lease holder had already "
                           "checkpointed")} for r in late]

    # 3. stuck runs
    stuck = []
    for run_id, row in runs.items():
        if row[2] in ("pending", "running", "suspended"):
            why = _diagnose(row, checkpoints[run_id], runs)
            stuck.append({"run_id": run_id, "status": row[2], "why": why, "wake_pending": row[7], "turns": row[11],
                          "recovery_attempts": row[10], "hint": _hint({"problem": why})})

    # 4. double settles
    settled_twice, unsettled = [], []
    state: dict[tuple, int] = {}
    for _id, run_id, seq, name, op, old, new, _attempt, _timed_out, _app, at in transitions:
        key = (run_id, seq)
        if op == "delete":
            state.pop(key, None)
            continue
        if op == "update" and old in ("completed", "failed") and new not in ("completed", "failed"):
            unsettled.append({"run_id": run_id, "seq": seq, "name": name, "from": old, "to": new, "at": str(at)})
            continue
        if new in ("completed", "failed"):  # an insert or update into a settled status, or a settled row rewritten
            state[key] = state.get(key, 0) + 1
            if state[key] == 2:
                settled_twice.append({"run_id": run_id, "seq": seq, "name": name, "status": new, "at": str(at)})

    # context. A step that timed out though the worker that claimed it was neither killed, paused nor cut off
    # from the database in between waited behind its chunk's other steps, to start (ran false) or to be
    # settled (ran true).
    claims: dict[tuple, tuple] = {}
    timeouts, alive_timeouts, timeout_rows = 0, [], []
    for _id, run_id, seq, name, op, old, new, attempt, timed_out, app, at in transitions:
        if op == "update" and old == "pending" and new == "running":
            claims[(run_id, seq, attempt)] = (app, at)
        elif timed_out:
            timeouts += 1
            claimer, claimed = claims.get((run_id, seq, attempt), (None, None))
            if claimed is None:
                continue
            ran = any(claimed <= t <= at for t in started_at.get((run_id, name), ()))
            killed = any(label in (claimer, "*") and claimed <= t <= at for label, t in disruptions)
            timeout_rows.append({"run_id": run_id, "seq": seq, "name": name, "attempt": attempt, "worker": claimer,
                                 "ran": ran, "killed": killed, "silent_s": round((at - claimed).total_seconds(), 2)})
            if not killed:
                alive_timeouts.append(timeout_rows[-1])
    completed_steps = sum(1 for rows in checkpoints.values() for r in rows if r[3] == "step" and r[4] == "completed")
    # queued steps still open on an ended run; re-dispatched after the end when their re-dispatch time
    # (pushed forward at each dispatch) lies beyond the run's end plus one re-dispatch interval
    redispatch = timedelta(seconds=ENGINE_SETTINGS["DURABLE_REDISPATCH_AFTER_SECONDS"])
    orphans, redispatched = [], 0
    for run_id, rows in checkpoints.items():
        run = runs.get(run_id)
        if run is None or run[2] in ("pending", "running", "suspended"):
            continue
        for r in rows:
            if r[4] in ("pending", "running") and r[5]:
                late_dispatch = bool(r[8] and run[12] and r[8] > run[12] + redispatch)
                redispatched += late_dispatch
                orphans.append(f"{r[0]}#{r[1]} {r[2]} ({r[4]}, run {run[2]}"
                               + (", re-dispatched after the run ended)" if late_dispatch else ")"))

    hints = Counter(entry["hint"] or "(no hint)" for entry in [*wrong, *ran_again, *stuck])
    children = defaultdict(list)
    for run_id, row in runs.items():
        if "/" in run_id:
            children[run_id.split("/", 1)[0]].append(f"{run_id.split('/', 1)[1]}:{row[2]}")
    return {
        "plans": [{"run_id": plan.run_id, "kind": plan.kind, "expected": plan.expected,
                   "status": runs[plan.run_id][2] if plan.run_id in runs else "missing",
                   "children": sorted(children[plan.run_id]), "history": plan.history} for plan in plans],
        "likely_causes": dict(hints.most_common()),
        "invariants": {
            "1_runs_in_wrong_state": len(wrong),
            "2_steps_run_after_their_checkpoint": len(ran_again),
            "3_runs_stuck": len(stuck),
            "4_checkpoints_settled_twice": len(settled_twice) + len(unsettled),
        },
        "child_runs": sum(1 for run_id in runs if "/" in run_id),
        "final_statuses": dict(Counter(row[2] for row in runs.values())),
        "context": {
            "step_executions": executions, "steps_executed": executed_steps, "completed_steps": completed_steps,
            "step_timeouts": timeouts, "steps_timed_out_while_their_worker_lived": len(alive_timeouts),
            "queued_steps_left_open_on_ended_runs": len(orphans),
            "of_which_re_dispatched_after_the_run_ended": redispatched,
        },
        "details": {
            "1_runs_in_wrong_state": wrong[:30],
            "2_steps_run_after_their_checkpoint": ran_again[:30],
            "3_runs_stuck": stuck[:30],
            "4_checkpoints_settled_twice": (settled_twice + unsettled)[:30],
            "steps_timed_out_while_their_worker_lived": alive_timeouts[:15],
            "queued_steps_left_open_on_ended_runs": orphans[:15],
        },
    }


HINTS = (  # (pattern in a problem, error or traceback, the engine behaviour it usually points at)
    ("heartbeat", "a database error in the engine's heartbeat write failed the step for good"),
    ("lock timeout", "a transient database error failed the run (or its step) for good"),
    ("terminating connection", "a transient database error failed the run (or its step) for good"),
    ("OperationalError", "a transient database error failed the run (or its step) for good"),
    ("InterfaceError", "a transient database error failed the run (or its step) for good"),
    ("the workflow now asks for step 'caught-", "a fail_fast fan's outcome was not recorded: a replay caught another "
                                                "failure than the first turn did"),
    ("checkpoints for", "a plain retry kept the settled part of a fan and dropped the rest"),
    ("which already ended", "retrying a run whose child had already ended left the run waiting for that child"),
    ("lost wake", "a wake was lost between a settle's commit and the wake"),
    ("not woken", "a wake was lost between a settle's commit and the wake"),
)


def _hint(entry: dict, traceback: str = "") -> str:
    text = f"{entry.get('problem')} {entry.get('error')} {traceback}"
    for pattern, hint in HINTS:
        if pattern in text:
            return hint
    if entry.get("kind") == "stale" and "output" in str(entry.get("problem")):
        return "a stale worker's result was saved into the retried attempt"
    return ""


def _short_error(error) -> str | None:
    if not isinstance(error, dict):
        return None
    return f"{error.get('type')}: {str(error.get('message'))[:300]}"


def _diagnose(run, checkpoints: list, runs: dict) -> str:
    """Why an active run is not moving, from its rows alone."""
    _id, _wf, status, _out, _err, _parent, _created, wake_pending, wake_at, locked_until, _rec, _turns, _end = run
    open_rows = [r for r in checkpoints if r[4] in ("pending", "running")]
    for r in open_rows:
        if r[3] == "child":
            child = runs.get(r[6])
            if child is None:
                return f"waits for child {r[6]}, which does not exist"
            if child[2] not in ("pending", "running", "suspended"):
                return f"waits for child {r[6]}, which already ended {child[2]}"
    if status == "running":
        return f"running, lease until {locked_until}"
    if wake_pending:
        return "a turn is asked for (wake_pending) but none ran"
    if wake_at is not None:
        return f"sleeps until {wake_at}"
    if not open_rows:
        return "suspended with nothing pending and no wake: a lost wake"
    kinds = Counter(f"{r[3]}:{r[4]}" for r in open_rows)
    groups = {r[7] for r in checkpoints if r[7] is not None}
    settled_fans = [g for g in groups if not any(r[7] == g and r[4] in ("pending", "running") for r in checkpoints)]
    if settled_fans and not any(r[7] is None for r in open_rows):
        return f"fan {settled_fans} settled but the run was not woken"
    return "waits for " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))


def summary_rows(report: dict) -> list[list]:
    """The report as (measure, value) rows for a table."""
    rows = [[name, value] for name, value in report["counts"].items()]
    rows += [[f"invariant {name}", value] for name, value in report["invariants"].items()]
    rows += [[name, value] for name, value in report["context"].items()]
    return rows
