"""Logging: the context of each line (which run, invocation, workspace, Celery task), the JSON format
``LOG_FORMAT=json`` selects, and the filter that keeps the 1 s tick quiet.

Context lives in one context variable, so it follows a turn or a step in its own thread (a threads pool
runs many at once) and never leaks into the next task: ``log_context(...)`` binds fields for a block and
restores the previous ones on exit; ``log_context_update(...)`` adds fields until the enclosing block
ends. ``LogContextFilter`` (on the console handler, so it sees every record) copies the fields onto each
record, where the plain format ignores them and ``JsonFormatter`` writes them.

The tick runs every second: Celery logs each run three times at INFO (beat's "Sending due task", the
worker's "received" and "succeeded"), which floods `make run`'s terminal. ``QuietPeriodicTasks`` demotes
these lines to DEBUG for the periodic tasks, except a tick's "succeeded" line when its report counts some
work or an error, which stays at INFO."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime

from opentelemetry import trace

# what a line may say about where it comes from; trace_id is the current OpenTelemetry span's (config/telemetry.py)
CONTEXT_FIELDS = ("run_id", "invocation_id", "workspace", "namespace", "task_id", "task", "trace_id")

_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lineage_log_context", default=None)


@contextlib.contextmanager
def log_context(**fields) -> Iterator[None]:
    """Bind `fields` (names of CONTEXT_FIELDS) to every log line of the block, over the enclosing ones."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def log_context_update(**fields) -> None:
    """Add `fields` to the current context until the enclosing ``log_context`` block (a turn, a task) ends."""
    _context.set({**(_context.get() or {}), **fields})


def log_context_fields() -> dict:
    return dict(_context.get() or {})


def _workspace_of(namespace: str) -> int | None:
    from workspaces.models import Workspace  # at log time: the logging configuration precedes the apps

    return Workspace.id_of_namespace(namespace)


def _trace_id() -> str | None:
    """The trace of the current span (a turn's, a step's, a request's), None with tracing off."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


class LogContextFilter(logging.Filter):
    """Copies the bound context onto each record (the workspace read from a workspace's run namespace, the
    trace id from the current span), so a line of a turn leads to its run's trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _context.get()
        if fields:
            for name, value in fields.items():
                setattr(record, name, value)
            if "workspace" not in fields and fields.get("namespace"):
                record.workspace = _workspace_of(fields["namespace"])
        if not getattr(record, "trace_id", None):
            record.trace_id = _trace_id()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the context fields known,
    and the formatted exception when there is one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Python's warnings (Celery's, Django's deprecations) go through logging too, so a JSON stream
        # holds nothing but JSON lines
        logging.captureWarnings(True)

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


# ------------------------------------------------------------------------------ Celery tasks' context

_task_tokens: dict[str, contextvars.Token] = {}


def bind_task(task_id=None, task=None, **kwargs) -> None:
    """task_prerun: every line of the task carries its id and name."""
    if task_id:
        _task_tokens[task_id] = _context.set({**(_context.get() or {}), "task_id": task_id,
                                              "task": getattr(task, "name", None)})


def unbind_task(task_id=None, **kwargs) -> None:
    """task_postrun: the worker's next task starts with no context."""
    token = _task_tokens.pop(task_id, None) if task_id else None
    if token is not None:
        try:
            _context.reset(token)
        except ValueError:  # set in another context (a pool that moved the task): forget it there instead
            _context.set(None)


# ------------------------------------------------------------------------------------- the quiet tick

QUIET_TASKS = frozenset({"durable.tick", "durable.retention"})
QUIET_ENTRIES = frozenset({"durable-tick", "durable-retention"})  # beat schedule names (config/celery.py)
_DID_SOMETHING = re.compile(r"""['"]?\w+['"]?:\s*(?:[1-9]|['"]error)""")


def _demote(record: logging.LogRecord) -> bool:
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class QuietPeriodicTasks(logging.Filter):
    """On celery.app.trace, celery.worker.strategy and celery.beat (see LOGGING)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        args = record.args
        if isinstance(args, dict) and args.get("name") in QUIET_TASKS:  # received / succeeded
            if "return_value" in args and _DID_SOMETHING.search(str(args["return_value"])):
                return True
            return _demote(record)
        if isinstance(args, tuple) and len(args) == 2 and (args[0] in QUIET_ENTRIES or args[1] in QUIET_TASKS) \
                and str(record.msg).startswith("Scheduler: Sending due task"):
            return _demote(record)
        return True
