"""Logging filters. The tick runs every second: Celery logs each run three times at INFO (beat's
"Sending due task", the worker's "received" and "succeeded"), which floods `make run`'s terminal.
These lines are demoted to DEBUG for the periodic tasks, except a tick's "succeeded" line when its
report counts some work or an error, which stays at INFO."""

from __future__ import annotations

import logging
import re

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
