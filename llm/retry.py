"""The one retry policy of provider calls, chat and embeddings alike.

A call that hit a rate limit, a timeout, a lost connection or a 5xx answer is tried again at most
``LLM_MAX_RETRIES`` times (so ``1 + LLM_MAX_RETRIES`` attempts). Before retry ``n`` (1-based) it waits
what the server asked for (``retry-after-ms``, else ``Retry-After`` in seconds or as an HTTP date),
else ``LLM_RETRY_BACKOFF_SECONDS * 2**(n - 1)`` with jitter down to half; never more than
``LLM_RETRY_BACKOFF_CAP_SECONDS``.

``RetryPolicy.delay`` only answers "how long before this retry, or give up": the caller decides how
to wait (``wait`` sleeps in the calling thread today; a durable timer can take its place).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from django.conf import settings

_sleep = time.sleep  # replaced by tests


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    backoff_seconds: float
    cap_seconds: float

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        return cls(max_retries=int(settings.LLM_MAX_RETRIES),
                   backoff_seconds=float(settings.LLM_RETRY_BACKOFF_SECONDS),
                   cap_seconds=float(settings.LLM_RETRY_BACKOFF_CAP_SECONDS))

    def delay(self, retry: int, *, retry_after: float | None = None,
              jitter: Callable[[], float] = random.random) -> float | None:
        """Seconds to wait before retry number `retry` (1-based), or None when the retries are spent.
        `retry_after` is the wait the server asked for (`retry_after_seconds`), when it sent one."""
        if retry > self.max_retries:
            return None
        if retry_after is not None:
            return min(self.cap_seconds, max(0.0, retry_after))
        backoff = min(self.cap_seconds, self.backoff_seconds * 2 ** (retry - 1))
        return backoff * (0.5 + jitter() / 2)


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: datetime | None = None) -> float | None:
    """The wait a response's headers ask for: `retry-after-ms`, else `retry-after` in seconds or as an
    HTTP date; None when neither is there or readable."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def retry_after_of(exc: BaseException) -> float | None:
    """`retry_after_seconds` of the HTTP response an `openai` error carries, if any."""
    response = getattr(exc, "response", None)
    return retry_after_seconds(response.headers) if response is not None else None


def wait(seconds: float) -> None:
    """Wait before a retry, in the calling thread."""
    _sleep(seconds)
