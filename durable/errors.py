"""The engine's exceptions.

Errors a workflow may catch (a failed step, a failed child, a failed fan) are ``Exception``
subclasses. Control flow that stops a turn (a suspension, a lost lease, an engine write that
failed, a non-deterministic replay, a misused ``ctx``) derives from ``BaseException``, so
workflow code's ``except Exception`` cannot swallow it; the context also remembers it, so a
turn whose code swallowed one anyway (``except BaseException``, a ``finally`` that returns)
still ends the way the engine decided.

The errors of the engine's services, selectors and registries (a run not found, a status that refuses
an operation, an unknown workflow, a filter that cannot apply, a payload that cannot be read) are
here too: the API answers those that subclass ``config.errors``' root once.
"""

from __future__ import annotations

import traceback
from datetime import datetime

from config.errors import Conflict, Invalid, NotFound


class DurableError(Exception):
    pass


class StepFailed(DurableError):
    """A step (or child) failed for good; raised into the workflow, which may catch it."""

    def __init__(self, name: str, error: dict | None):
        self.name = name
        self.error = error or {}
        super().__init__(f"step {name!r} failed: {self.error.get('type', 'Error')}: {self.error.get('message', '')}")


class ChildFailed(StepFailed):
    pass


class FanFailed(DurableError):
    """One or more items of ``ctx.all`` failed (wait_all, return_exceptions=False)."""

    def __init__(self, failures: dict[int, StepFailed], results: list):
        self.failures = failures
        self.results = results
        first = next(iter(failures.values()))
        super().__init__(f"{len(failures)} of {len(results)} fan items failed; first: {first}")


class TryLater(DurableError):
    """Raised by a queued step that cannot do its work now (a provider's rate limit, a concurrency cap):
    the step goes back to pending and is dispatched again in `after` seconds, on a durable timer, with
    no worker held meanwhile. Not a failure: it spends none of the step's retries. `reason` is shown on
    the step while it waits; `kind` names what put it off (``deferrals(kind)`` counts them inside the
    step). A step put off for longer than DURABLE_STEP_MAX_DEFER_SECONDS in a row fails with the reason."""

    def __init__(self, reason: str, *, after: float, kind: str = "later"):
        super().__init__(reason)
        self.reason = reason
        self.after = max(0.0, float(after))
        self.kind = kind


class TurnInterrupted(DurableError):
    """A turn stopped because the engine's own database write failed (raised to the Celery task,
    which retries it; the run itself is released for a later turn, never failed)."""


class _ControlFlow(BaseException):
    """Raised through user code to stop a turn; BaseException so `except Exception` cannot swallow it."""


class Suspend(_ControlFlow):
    def __init__(self, wake_at: datetime | None = None):
        super().__init__(wake_at)
        self.wake_at = wake_at


class LeaseLost(_ControlFlow):
    pass


class StepAbandoned(_ControlFlow):
    """Raised by ``heartbeat()`` (and so ``wait_alive``) in a queued step that is no longer this worker's
    attempt: its run ended (cancelled) or its clock ran out and another worker has it. The step stops
    there and nothing of it is saved (its checkpoint belongs to whoever holds it now)."""


class NonDeterminismError(_ControlFlow):
    pass


class WorkflowMisuse(_ControlFlow):
    """The workflow used ``ctx`` in a way that cannot be made durable (a wait inside the workflow's
    own ``transaction.atomic()``, a ``ctx`` call after the turn suspended): the run fails with this."""


class EngineWriteFailed(_ControlFlow):
    """An engine statement failed (database down, connection lost, serialization failure)."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class ContinueAsNew(_ControlFlow):
    def __init__(self, input):
        super().__init__("continue as new")
        self.input = input


def error_payload(exc: BaseException) -> dict:
    """An exception as a checkpoint or a run records it: its type, message and (the end of) its traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
    }


# ------------------------------------------------------------------------ services, selectors, registries


class RunNotFound(NotFound):
    """No run with this id (the id is the message)."""


class InvalidRunState(Conflict, ValueError):
    """The run's status does not allow the operation (a signal to a run that has ended)."""


class RunIdConflict(Exception):
    """A run id is already taken by a run of another namespace."""


class UnknownWorkflow(LookupError):
    """No durable workflow is registered under this name."""


class RunRefused(Exception):
    """A run was given a row it does not own (another workspace's, or one another run drives)."""


class InvalidFilter(Invalid):
    """A filter value the selectors cannot apply; `param` names the offending filter."""

    def __init__(self, param: str, message: str):
        super().__init__(message, field=param)
        self.param = param


class Undecodable(ValueError):
    """A stored payload that cannot be read (a wrong key, a row edited by hand)."""
