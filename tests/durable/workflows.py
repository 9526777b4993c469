"""Workflows the durable tests run (imported by test workers through DURABLE_WORKFLOW_MODULES)."""

import logging
import os
import time
from pathlib import Path

from durable import Child, ChildFailed, Step, StepFailed, heartbeat, workflow

CALLS: list = []


def add(a, b):
    CALLS.append(("add", a, b))
    return a + b


def record(path, value):
    """Append a line to a file: evidence of each execution that survives process death."""
    with open(path, "a") as handle:
        handle.write(f"{value}\n")
    return value


def slow_record(path, value, seconds):
    record(path, f"start:{value}")
    time.sleep(seconds)
    return record(path, value)


def flaky(path, failures):
    """Fail `failures` times (counted in a file), then succeed."""
    counter = Path(path)
    count = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(count + 1))
    if count < failures:
        raise RuntimeError(f"flaky failure {count + 1}")
    return count + 1


def boom(message):
    raise ValueError(message)


def square(x):
    return x * x


def beating(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heartbeat({"left": end - time.monotonic()})
        time.sleep(0.1)
    return "done"


@workflow("tests.sequence", api=True)
def sequence(ctx, input):
    total = 0
    for index in range(input.get("steps", 3)):
        total = ctx.step(f"add-{index}", add, total, index)
    return {"total": total}


def log_line(message):
    logging.getLogger("tests.workflows").warning("step says %s", message)
    return message


@workflow("tests.logging")
def logging_workflow(ctx, input):
    """A line from the turn and one from a queued step (a worker's logs name the run of each)."""
    logging.getLogger("tests.workflows").warning("turn says %s", input["message"])
    return ctx.step("log", log_line, input["message"], queue="steps")


@workflow("tests.queued")
def queued(ctx, input):
    first = ctx.step("first", add, 1, 2, queue="steps")
    second = ctx.step("second", add, first, 10, queue="steps")
    return second


@workflow("tests.fan", api=True)
def fan(ctx, input):
    results = ctx.all([Step(f"sq-{i}", square, (i,)) for i in range(input["n"])], mode=input.get("mode", "wait_all"))
    return sum(results)


@workflow("tests.fan_failing")
def fan_failing(ctx, input):
    items = [Step("ok", square, (3,)), Step("bad", boom, ("nope",))]
    results = ctx.all(items, mode=input.get("mode", "wait_all"),
                      return_exceptions=input.get("return_exceptions", False))
    return [f"{type(r).__name__}: {r.error['message']}" if isinstance(r, StepFailed) else r for r in results]


@workflow("tests.signal", api=True)
def signal_wait(ctx, input):
    before = ctx.step("before", add, 0, 1)
    payload = ctx.wait_for_signal("approve", timeout=input.get("timeout"), default="timed-out")
    return {"before": before, "payload": payload}


@workflow("tests.event")
def event_wait(ctx, input):
    return ctx.wait_for_event("order.paid", match={"order": input["order"]})


@workflow("tests.sleep")
def sleeper(ctx, input):
    ctx.sleep(input["seconds"])
    return ctx.step("after", add, 1, 1)


@workflow("tests.child")
def child(ctx, input):
    return {"child": input["x"] * 2}


@workflow("tests.nest")
def nest(ctx, input):
    """A chain of lone children, `depth` deep, each waiting on the next."""
    if input["depth"] == 0:
        return {"depth": 0}
    return {"depth": input["depth"], "below": ctx.child("tests.nest", {"depth": input["depth"] - 1})}


@workflow("tests.parent")
def parent(ctx, input):
    one = ctx.child("tests.child", {"x": 1})
    many = ctx.all([Child("tests.child", {"x": i}) for i in range(3)])
    return {"one": one, "many": many}


@workflow("tests.retrying")
def retrying(ctx, input):
    return ctx.step("flaky", flaky, input["counter"], input["failures"], retries=input.get("retries", 3),
                    backoff="fixed", backoff_base=0.01, jitter=False, queue=input.get("queue"))


@workflow("tests.values")
def values(ctx, input):
    ctx.set_attributes({"customer": input["customer"], "amount": input["amount"]})
    return {"now": ctx.now().isoformat(), "uuid": str(ctx.uuid()), "pick": ctx.random().randint(0, 10**9)}


@workflow("tests.durable_file")
def durable_file(ctx, input):
    """Each step appends to a file, so a test can count executions across worker crashes."""
    for index in range(input["steps"]):
        ctx.step(f"write-{index}", slow_record, input["path"], index, input.get("pause", 0.0))
    return {"pid": os.getpid()}


@workflow("tests.nondeterministic")
def nondeterministic(ctx, input):
    name = "a" if not Path(input["flag"]).exists() else "b"
    ctx.step(name, add, 1, 1)
    ctx.sleep(0.05)
    return "done"


@workflow("tests.heartbeat")
def heartbeat_wf(ctx, input):
    return ctx.step("beat", beating, input["seconds"], queue="steps", timeout=input["timeout"])


@workflow("tests.wait_alive")
def wait_alive_wf(ctx, input):
    from durable import wait_alive

    return ctx.step("wait", wait_alive, input["seconds"], queue="steps", timeout=input["timeout"])


@workflow("tests.queued_slow")
def queued_slow(ctx, input):
    return ctx.step("slow", slow_record, input["path"], "x", 1.5, queue="steps")


def checked(fail):
    if fail:
        raise ValueError("asked to fail")
    return True


@workflow("tests.maybe_fail", api=True)
def maybe_fail(ctx, input):
    """Fails while its input says so: retry with new input makes it pass (read-side and API tests)."""
    return {"ok": ctx.step("check", checked, input.get("fail", False))}


@workflow("tests.event_shipped")
def event_shipped(ctx, input):
    return ctx.wait_for_event("order.shipped", match={"order": input["order"]})


@workflow("tests.undo")
def undo(ctx, input):
    return {"undid": input["run_id"], "original_input": input["input"]}


@workflow("tests.compensated", compensation="tests.undo")
def compensated(ctx, input):
    return ctx.wait_for_signal("go")


@workflow("tests.not_json")
def not_json(ctx, input):
    return {"when": object()}


# ---------------------------------------------------------------- workflows of the engine's crash and race tests


def gated(flag, value):
    """Block until the file `flag` exists (a test releases it), then return `value`."""
    deadline = time.monotonic() + 20
    while not Path(flag).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{flag} never appeared")
        time.sleep(0.02)
    return value


def cancel_own_run(run_id):
    from durable.services import run_cancel

    return run_cancel(run_id=run_id, reason="cancelled from inside its own turn")


@workflow("tests.slow_chunk")
def slow_chunk(ctx, input):
    """Slow queued steps in one chunk, each allowed a short silence."""
    items = [Step(f"slow-{i}", slow_record, (input["path"], i, input["seconds"]), timeout=input["timeout"])
             for i in range(input["n"])]
    return ctx.all(items)


@workflow("tests.parent_of_flaky")
def parent_of_flaky(ctx, input):
    return ctx.child("tests.retrying", {"counter": input["counter"], "failures": 1, "retries": 0})


@workflow("tests.parent_of_waiting")
def parent_of_waiting(ctx, input):
    return ctx.child("tests.signal", {})


@workflow("tests.child_then_check")
def child_then_check(ctx, input):
    result = ctx.child("tests.child", {"x": input["x"]})
    ctx.step("check", checked, input.get("fail", False))
    return result


@workflow("tests.fail_fast_handler")
def fail_fast_handler(ctx, input):
    try:
        ctx.all([Step("a", boom, ("a broke",)), Step("b", boom, ("b broke",))], mode="fail_fast")
    except StepFailed as exc:
        handled = ctx.step(f"handle-{exc.name}", add, 0, 1)
        ctx.sleep(0.01)
        return {"handled": exc.name, "value": handled}
    return "no failure"


@workflow("tests.cancel_then_child")
def cancel_then_child(ctx, input):
    ctx.step("cancel-me", cancel_own_run, ctx.run_id)
    return ctx.child("tests.child", {"x": 1})


@workflow("tests.gated_queued")
def gated_queued(ctx, input):
    return ctx.step("calc", gated, input["flag"], input["a"], queue="steps")


@workflow("tests.gated_inline")
def gated_inline(ctx, input):
    value = ctx.step("calc", gated, input["flag"], input["a"])
    ctx.sleep(0.01)
    return value


@workflow("tests.swallows_errors")
def swallows_errors(ctx, input):
    try:
        ctx.step("explode", add, 1, 1)
    except Exception as exc:
        return f"swallowed {type(exc).__name__}"
    return "done"


@workflow("tests.wait_in_atomic")
def wait_in_atomic(ctx, input):
    from django.db import transaction

    with transaction.atomic():
        ctx.sleep(0.01)
    return "slept"


@workflow("tests.ctx_in_finally")
def ctx_in_finally(ctx, input):
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.step("cleanup", add, 1, 1)


@workflow("tests.loop")
def loop(ctx, input):
    n = input["n"]
    ctx.step("tick", add, n, 1)
    child_output = ctx.child("tests.child", {"x": n})
    if n < input["until"]:
        ctx.continue_as_new({"n": n + 1, "until": input["until"]})
    return {"n": n, "child": child_output}


def throttled(counter_path, times, after):
    """Put off `times` times (each TryLater of `after` seconds), then answer how often it was put off."""
    from pathlib import Path

    from durable import TryLater, deferrals

    path = Path(counter_path)
    count = int(path.read_text()) if path.exists() else 0
    path.write_text(str(count + 1))
    if count < times:
        raise TryLater(f"busy: try {count + 1}", after=after, kind="busy")
    return {"runs": count + 1, "deferrals": deferrals("busy")}


@workflow("tests.throttled")
def throttled_step(ctx, input):
    return ctx.step("call", throttled, input["counter"], input["times"], input["after"], queue="steps",
                    retries=input.get("retries", 0))


def database_session():
    """The Postgres session (backend pid) this step's query ran on."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@workflow("tests.sessions")
def sessions(ctx, input):
    """One queued step after another (each its own task, each followed by a turn): the sessions they used."""
    return [ctx.step(f"session-{index}", database_session, queue="steps") for index in range(input["steps"])]


WAITED_TO_THE_END: list[str] = []


def cancel_then_wait_alive(run_id: str, seconds: float) -> str:
    """Cancel this step's own run, then wait alive: its first persisted heartbeat finds the step no longer
    running, and the wait stops there (the line after it is never reached)."""
    from durable import wait_alive
    from durable.services import run_cancel

    run_cancel(run_id=run_id)
    wait_alive(seconds)
    WAITED_TO_THE_END.append(run_id)
    return "waited"


@workflow("tests.cancelled_while_waiting")
def cancelled_while_waiting(ctx, input):
    return ctx.step("wait", cancel_then_wait_alive, ctx.run_id, input["seconds"], queue="steps", timeout=30)


def beat_in_transaction(run_id: str) -> int:
    """A step doing its own database work in a transaction, heartbeating in the middle of it."""
    from django.db import transaction

    from durable import heartbeat
    from durable.models import StepCheckpoint

    with transaction.atomic():
        before = StepCheckpoint.objects.filter(run_id=run_id).count()
        heartbeat({"stage": "half way"})
        return before + StepCheckpoint.objects.filter(run_id=run_id).count()


@workflow("tests.heartbeat_in_transaction")
def heartbeat_in_transaction(ctx, input):
    return ctx.step("beat", beat_in_transaction, ctx.run_id, queue="steps", timeout=5)


# ------------------------------------------- workflows of the engine's retries over fans and handled failures,
# continue-as-new, chunked steps and hostile input


def fail_once(path):
    """Fail the first time (counted in a file), succeed afterwards."""
    counter = Path(path)
    count = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(count + 1))
    if count == 0:
        raise RuntimeError("transient failure")
    return count


def ok(value):
    return value


@workflow("tests.fan_flaky")
def fan_flaky(ctx, input):
    return ctx.all([Step("a", ok, (1,)), Step("b", fail_once, (input["counter"],))], mode=input.get("mode", "wait_all"))


@workflow("tests.flaky_child")
def flaky_child(ctx, input):
    return ctx.step("flaky", fail_once, input["counter"])


@workflow("tests.quick_child")
def quick_child(ctx, input):
    return ctx.step("quick", ok, input)


@workflow("tests.fail_fast_one_child")
def fail_fast_one_child(ctx, input):
    return ctx.all([Child("tests.flaky_child", {"counter": input["counter"]})], mode="fail_fast")


@workflow("tests.waits_forever")
def waits_forever(ctx, input):
    return ctx.wait_for_signal("never")


def record_and_fail(path):
    with open(path, "a") as handle:
        handle.write("ran\n")
    raise RuntimeError("grandchild failed")


@workflow("tests.always_fails")
def always_fails(ctx, input):
    return ctx.step("boom", record_and_fail, input["path"])


@workflow("tests.handles_its_children")
def handles_its_children(ctx, input):
    """fail_fast over two grandchildren: one fails at once, the other waits; the failure is handled."""
    try:
        ctx.all([Child("tests.always_fails", input), Child("tests.waits_forever")], mode="fail_fast")
    except ChildFailed:
        return "handled"
    return "unreachable"


@workflow("tests.grandparent")
def grandparent(ctx, input):
    handled = ctx.child("tests.handles_its_children", {"path": input["path"]})
    ctx.step("then-fail", fail_once, input["counter"])  # fails the first run, succeeds on the retry
    return handled


@workflow("tests.loop_with_child")
def loop_with_child(ctx, input):
    if input["n"] == 0:
        ctx.continue_as_new({"n": 1})
    return ctx.child("tests.quick_child", input["n"])


@workflow("tests.fan_two_slow")
def fan_two_slow(ctx, input):
    return ctx.all([Step("first", slow_record, (input["path"], "first", input["first"]), timeout=input["timeout"]),
                    Step("second", slow_record, (input["path"], "second", input["second"]), timeout=input["timeout"])])


@workflow("tests.nul_attribute")
def nul_attribute(ctx, input):
    try:
        ctx.set_attributes({"note": "a\x00b"})
    except ValueError:
        return "rejected"
    return "stored"


def workspace_named(name):
    """A domain write made inside ctx.transaction."""
    import uuid

    from workspaces.models import Workspace

    Workspace.objects.create(name=name, slug=uuid.uuid4().hex)
    return name


@workflow("tests.transaction_then_refused_one")
def transaction_then_refused_one(ctx, input):
    """A transaction, then one whose checkpoint Postgres cannot store (a NUL in its name), handled."""
    kept = ctx.transaction("kept", workspace_named, input["name"])
    try:
        ctx.transaction("refused\x00", ok, 1)
    except ValueError:
        return {"kept": kept, "refused": True}
    return {"kept": kept, "refused": False}


@workflow("tests.fallback_then_fail")
def fallback_then_fail(ctx, input):
    """A handled failure takes a fallback branch; a later step fails the run."""
    try:
        value = ctx.step("flaky", fail_once, input["counter"])
    except StepFailed:
        value = ctx.step("fallback", ok, 0)
    ctx.step("final", fail_once, input["counter2"])
    return value


@workflow("tests.fast_then_beating")
def fast_then_beating(ctx, input):
    return ctx.all([Step("fast", slow_record, (input["path"], "fast", 0.0), timeout=input["timeout"]),
                    Step("beating", beating, (input["seconds"],), timeout=input["timeout"])])
