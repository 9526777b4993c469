"""Retry policy of steps: the options a step's retries are recorded with, and when a failed try runs again.

A step's options are stored with its checkpoint (``step_options``), so every attempt, inline or on a
worker, follows the policy the workflow asked for when the step was first reached. A try that raised
``TryLater`` was put off, not failed: it spends none of the retries (``failed_tries``).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.utils.timezone import now

# the options of a step with no retries and no timeout: the hot path has nothing to validate or build
NO_RETRIES = {"retries": 0}


def step_options(retries, backoff, backoff_base, backoff_cap, jitter, timeout) -> dict:
    """The options recorded with a step; ValueError on a backoff that is neither fixed nor exponential."""
    if backoff not in ("fixed", "exponential"):
        raise ValueError(f"backoff must be 'fixed' or 'exponential', not {backoff!r}")
    options: dict = {"retries": int(retries)}
    if retries:
        options.update(backoff=backoff, backoff_base=backoff_base, backoff_cap=backoff_cap, jitter=jitter)
    if timeout is not None:
        options["timeout"] = float(timeout)
    return options


def backoff_delay(options: dict, attempt: int) -> float:
    """Seconds before retry number `attempt` (1-based): fixed or exponential with cap and full jitter."""
    base = float(options.get("backoff_base", 1.0))
    cap = float(options.get("backoff_cap", 60.0))
    fixed = options.get("backoff", "exponential") == "fixed"
    delay = base if fixed else min(cap, base * (2 ** (attempt - 1)))
    if options.get("jitter", True):
        delay = random.uniform(delay / 2, delay)
    return min(delay, cap)


def failed_tries(options: dict, attempt: int) -> int:
    """How many of a queued step's `attempt` claims failed: those put off by ``TryLater`` do not count."""
    return attempt - sum((options.get("deferrals") or {}).values())


def retry_at(options: dict, failures: int) -> datetime | None:
    """When a step that has now failed `failures` times runs again, or None once its retries are spent."""
    if failures > int(options.get("retries", 0)):
        return None
    return now() + timedelta(seconds=backoff_delay(options, failures))
