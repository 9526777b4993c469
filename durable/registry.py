"""Registered durable workflows, by name.

    from durable import workflow

    @workflow("billing.charge")
    def charge(ctx, input):
        ...

Every process (web, worker, beat) imports the modules that define workflows: each
installed app's ``durable_workflows`` module, plus the modules named in the
DURABLE_WORKFLOW_MODULES setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.utils.module_loading import autodiscover_modules

from durable.errors import UnknownWorkflow


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    fn: Callable
    description: str = ""
    compensation: str | None = None
    api: bool = False


_registry: dict[str, WorkflowDefinition] = {}


def workflow(name: str | None = None, *, compensation: str | None = None, api: bool = False):
    """Register `fn(ctx, input)` as a durable workflow under `name` (default: module.qualname).

    `compensation` names another registered workflow started when a run is cancelled with
    compensation; it receives {"run_id": ..., "input": ...}.

    `api=True` lets any member of a workspace start (and schedule) it through the API, with any
    input they like. Leave it off for the platform's own workflows (ingestion, evaluations...),
    which the platform starts itself with inputs it has checked. Either way, a workflow whose input
    names a row (an id) must check that the row belongs to the run's workspace (`ctx.namespace`)."""

    def register(fn: Callable) -> Callable:
        key = name or f"{fn.__module__}.{fn.__qualname__}"
        existing = _registry.get(key)
        if existing is not None and (existing.fn.__module__, existing.fn.__qualname__) != (
            fn.__module__, fn.__qualname__,
        ):
            raise ValueError(f"durable workflow {key!r} is already registered by {existing.fn.__module__}")
        _registry[key] = WorkflowDefinition(name=key, fn=fn, description=(fn.__doc__ or "").strip(),
                                            compensation=compensation, api=api)
        fn.durable_name = key
        return fn

    return register


def get_workflow(name: str) -> WorkflowDefinition:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownWorkflow(f"No durable workflow is registered as {name!r}.") from None


def workflow_names() -> list[str]:
    return sorted(_registry)


def resolve_callable(path: str) -> Callable:
    """Import `module:qualname` (a queued step's function)."""
    module_name, _, qualname = path.partition(":")
    target: Any = import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def callable_path(fn: Callable) -> str:
    """The importable path of a module-level function; queued steps need one to run on another worker."""
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not module or "<" in qualname:
        raise ValueError(
            f"{fn!r} cannot run on another worker: queued steps need a module-level function, not a lambda or closure."
        )
    return f"{module}:{qualname}"


def autodiscover() -> None:
    autodiscover_modules("durable_workflows")
    for module in getattr(settings, "DURABLE_WORKFLOW_MODULES", []):
        import_module(module)
