"""Workflows for the adversarial review of the engine (tests/durable/test_engine_review.py)."""

from pathlib import Path

from durable import Child, ChildFailed, Step, StepFailed, workflow
from tests.durable.workflows import beating, slow_record


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


@workflow("review.fan_flaky")
def fan_flaky(ctx, input):
    return ctx.all([Step("a", ok, (1,)), Step("b", fail_once, (input["counter"],))], mode=input.get("mode", "wait_all"))


@workflow("review.flaky_child")
def flaky_child(ctx, input):
    return ctx.step("flaky", fail_once, input["counter"])


@workflow("review.quick_child")
def quick_child(ctx, input):
    return ctx.step("quick", ok, input)


@workflow("review.fail_fast_one_child")
def fail_fast_one_child(ctx, input):
    return ctx.all([Child("review.flaky_child", {"counter": input["counter"]})], mode="fail_fast")


@workflow("review.waits_forever")
def waits_forever(ctx, input):
    return ctx.wait_for_signal("never")


def record_and_fail(path):
    with open(path, "a") as handle:
        handle.write("ran\n")
    raise RuntimeError("grandchild failed")


@workflow("review.always_fails")
def always_fails(ctx, input):
    return ctx.step("boom", record_and_fail, input["path"])


@workflow("review.handles_its_children")
def handles_its_children(ctx, input):
    """fail_fast over two grandchildren: one fails at once, the other waits; the failure is handled."""
    try:
        ctx.all([Child("review.always_fails", input), Child("review.waits_forever")], mode="fail_fast")
    except ChildFailed:
        return "handled"
    return "unreachable"


@workflow("review.grandparent")
def grandparent(ctx, input):
    handled = ctx.child("review.handles_its_children", {"path": input["path"]})
    ctx.step("then-fail", fail_once, input["counter"])  # fails the first run, succeeds on the retry
    return handled


@workflow("review.loop_with_child")
def loop_with_child(ctx, input):
    if input["n"] == 0:
        ctx.continue_as_new({"n": 1})
    return ctx.child("review.quick_child", input["n"])


@workflow("review.fan_two_slow")
def fan_two_slow(ctx, input):
    return ctx.all([Step("first", slow_record, (input["path"], "first", input["first"]), timeout=input["timeout"]),
                    Step("second", slow_record, (input["path"], "second", input["second"]), timeout=input["timeout"])])


@workflow("review.nul_attribute")
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


@workflow("review.transaction_then_refused_one")
def transaction_then_refused_one(ctx, input):
    """A transaction, then one whose checkpoint Postgres cannot store (a NUL in its name), handled."""
    kept = ctx.transaction("kept", workspace_named, input["name"])
    try:
        ctx.transaction("refused\x00", ok, 1)
    except ValueError:
        return {"kept": kept, "refused": True}
    return {"kept": kept, "refused": False}


@workflow("review.fallback_then_fail")
def fallback_then_fail(ctx, input):
    """A handled failure takes a fallback branch; a later step fails the run."""
    try:
        value = ctx.step("flaky", fail_once, input["counter"])
    except StepFailed:
        value = ctx.step("fallback", ok, 0)
    ctx.step("final", fail_once, input["counter2"])
    return value


@workflow("review.fast_then_beating")
def fast_then_beating(ctx, input):
    return ctx.all([Step("fast", slow_record, (input["path"], "fast", 0.0), timeout=input["timeout"]),
                    Step("beating", beating, (input["seconds"],), timeout=input["timeout"])])
