"""What the runner's tests do with an invocation: read its node invocations, and drive it through a worker's
death simulated in-process.

A crash: a step function runs its real body (its side effects commit) and the worker then "dies" before the
checkpoint is written (`WorkerDied`, a BaseException, so neither the step wrapper nor the workflow's
`except Exception` sees it); the run's lease is then expired and the tick's recovery pass hands it to a new
turn, as it would after a SIGKILL."""

from datetime import timedelta

from django.utils import timezone

from durable import tick
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from workflows import execution
from workflows.models import NodeInvocation


def nodes_of(invocation):
    return list(NodeInvocation.objects.filter(workflow_invocation=invocation).order_by("seq"))


class WorkerDied(BaseException):
    """The worker process died right after a step's side effects and before its checkpoint."""


def die_after(monkeypatch, name: str, *, when=lambda args: True, times: int = 1) -> list:
    """Make `execution.<name>` run for real and then kill the worker (`times` times, when `when(args)`)."""
    real = getattr(execution, name)
    deaths: list = []

    def step(*args):
        result = real(*args)
        if len(deaths) < times and when(args):
            deaths.append(args)
            raise WorkerDied(name)
        return result

    # named as the function it replaces, so a queued step (a real provider's model call, an MCP tool
    # call) resolves its path to this replacement, as a worker of this process would
    step.__module__, step.__qualname__ = real.__module__, real.__qualname__
    monkeypatch.setattr(execution, name, step)
    return deaths


def drive_through_crashes(invocation, *, crashes: int = 1):
    """Drive the invocation's run; each time the worker dies, expire the lease (a turn's) or the step's
    clock (a queued step's) and let the tick's recovery or timeout pass hand the work to a fresh
    worker, as after a SIGKILL."""
    for _ in range(crashes + 1):
        try:
            run_until_settled(invocation.durable_run_id, max_wait=30)
        except WorkerDied:
            past = timezone.now() - timedelta(hours=1)
            DurableRun.objects.filter(status="running").update(locked_until=past)
            StepCheckpoint.objects.filter(status="running", queue__gt="").update(timeout_at=past)
            assert tick.recover_expired_leases() + tick.time_out_silent_steps() >= 1
            continue
        break
    invocation.refresh_from_db()
    return invocation
