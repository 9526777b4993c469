"""Workflows whose turn stalls at a gate, for the history fence tests (tests/durable/test_engine_crash_windows.py).

`gate(key)` blocks the first call made with an armed key until the test releases it: it stands for a
turn that stalls (a long step, a paused process) while the run is cancelled, retried or recovered."""

import threading
import uuid

from durable import workflow

GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


def arm(key: str) -> tuple[threading.Event, threading.Event]:
    entered, release = threading.Event(), threading.Event()
    GATES[key] = (entered, release)
    return entered, release


def gate(key):
    pair = GATES.pop(key, None)
    if pair is not None:
        entered, release = pair
        entered.set()
        release.wait(30)
    return key


def ok(value):
    return value


def create_workspace(key, name):
    """A domain write made inside ctx.transaction (after the stall)."""
    from workspaces.models import Workspace

    gate(key)
    Workspace.objects.create(name=name, slug=uuid.uuid4().hex)
    return name


@workflow("tests.gate.signal_after_gate")
def signal_after_gate(ctx, input):
    ctx.step("gate", gate, input["gate"])
    return ctx.wait_for_signal("go")


@workflow("tests.gate.transaction_gate")
def transaction_gate(ctx, input):
    return ctx.transaction("tx", create_workspace, input["gate"], input["name"])


@workflow("tests.gate.attributes_by_input")
def attributes_by_input(ctx, input):
    if input["phase"] == "old":
        ctx.step("first", ok, 1)
        ctx.step("gate", gate, input["gate"])
    ctx.set_attributes({"phase": input["phase"]})
    return input["phase"]


@workflow("tests.gate.event_after_gate")
def event_after_gate(ctx, input):
    ctx.step("gate", gate, input["gate"])
    return ctx.wait_for_event(input["event"])


@workflow("tests.gate.event_waiter")
def event_waiter(ctx, input):
    return ctx.wait_for_event(input["event"])


FLAKY_CALLS: dict[str, int] = {}


def flaky(key):
    """Fail the first call for `key` (in-process steps), succeed afterwards."""
    FLAKY_CALLS[key] = FLAKY_CALLS.get(key, 0) + 1
    if FLAKY_CALLS[key] == 1:
        raise RuntimeError("transient failure")
    return key


def fan_items(input):
    from durable import Step

    return [Step("a", flaky, (input["key"],)), Step("b", ok, (2,))]


@workflow("tests.gate.fail_fast_fan")
def fail_fast_fan(ctx, input):
    return ctx.all(fan_items(input), mode="fail_fast")
