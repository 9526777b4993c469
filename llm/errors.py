"""The errors of a chat call, for every module of llm/ and their callers (`llm.chat.chat` raises them)."""

from __future__ import annotations


class ChatError(Exception):
    """The call cannot succeed as asked: bad request, bad key, unknown model or provider."""


class TransientChatError(ChatError):
    """Rate limits, timeouts, lost connections or 5xx answers (still failing after the retries when
    `chat()` raises it). `retry_after` is the server's Retry-After in seconds, when it sent one."""

    def __init__(self, message: str, *, retry_after: float | None = None, rate_limited: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.rate_limited = rate_limited  # a 429


class CallPutOff(Exception):
    """A call asked not to wait (``chat(..., put_off=...)``) that cannot be made now: a provider limit
    (`kind` "limit": the call was not made) or a rate limit / transient failure the retry policy says to
    try again after (`kind` "provider"). `retry_in` seconds; `reason` says why, for the operator."""

    def __init__(self, reason: str, *, retry_in: float, kind: str):
        super().__init__(reason)
        self.reason = reason
        self.retry_in = retry_in
        self.kind = kind


class UnknownModel(ChatError):
    """The model name cannot be called on this install; the message names the model and says why."""
