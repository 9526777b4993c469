"""Chat completions: one request/response shape for every provider, model-name resolution, retries.

    request = ChatRequest(model="gpt-4.1-mini", messages=[{"role": "system", "content": "..."},
                                                           {"role": "user", "content": "What is Lineage?"}],
                          tools=(ToolSpec("knowledge_search", "Search the knowledge base", {...}),))
    response, cached = chat(request, cache=ChatCache(workspace_id))
    history.append(response.assistant_message())

A model name is written as in a workflow DSL: bare (``gpt-4.1-mini``) or with a provider prefix
(``openrouter#openai/gpt-4.1-mini``). Which provider answers:

- ``offline#<anything>`` and the bare name ``offline-directive-v1`` always go to the offline model;
- with ``LLM_PROVIDER = "offline"`` (no API key) every other model name, bare or with any provider
  prefix (``openrouter#...`` names of imported workflows included), is answered by the offline model,
  so a workflow written for real models runs unchanged, and its usage says so (provider ``offline``,
  model ``offline-directive-v1``);
- with ``LLM_PROVIDER = "openai"`` a bare name goes to ``openai`` (``OPENAI_BASE_URL``, which may point at
  any OpenAI-compatible server) and a prefixed one to that provider's base URL and key
  (``llm/providers.py``); a prefix that names no configured provider (``settings.LLM_PROVIDERS`` plus the
  built-in ``openai`` and ``offline``) is an ``UnknownModel``.

Every answer ``chat()`` returns is text Postgres can store (``clean_response``): models do emit U+0000
(echoing binary tool output) and unpaired surrogates (broken decoding, a JSON ``"\ud800"`` escape),
which text and jsonb columns refuse, failing the caller's write after the call was paid for. So in the
content, the finish reason, the answering model's name and every tool call's id, name, arguments
(keys and string values, at any depth) and raw arguments, NUL characters are removed and lone
surrogates replaced with U+FFFD (two code points forming a surrogate pair become their character).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar, cast

from django.conf import settings

from config import telemetry
from llm.errors import CallPutOff, TransientChatError, UnknownModel
from llm.names import ResolvedModel, resolve_model
from llm.providers import OFFLINE_PROVIDER, one_per_process, structured_outputs
from llm.retry import RetryPolicy
from llm.retry import wait as _wait
from llm.types import (
    ChatProvider,
    ChatRequest,
    ChatResponse,
    ResponseCache,
    ToolCall,
    ToolSpec,  # noqa: F401 (workflows/execution.py imports it from here)
)
from llm.types import request_cache_key as _cache_key
from llm.usage import record_usage

logger = logging.getLogger("llm.chat")

# the request and response types are in llm/types.py, model names and their resolution in llm/names.py,
# the errors in llm/errors.py: the providers import them without importing this module

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` as Postgres text and jsonb can store it: NUL characters removed, lone surrogates replaced
    with U+FFFD (a surrogate pair written as two code points becomes its character)."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if _SURROGATE.search(text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


_Value = TypeVar("_Value")


def _clean_value(value: _Value) -> _Value:
    # the same shape and types as `value`: the checker cannot tie the rebuilt parts back to _Value
    return cast(_Value, _cleaned(value))


def _cleaned(value):
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_cleaned(key): _cleaned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    return value


def clean_response(response: ChatResponse) -> ChatResponse:
    """`response` with every string in it cleaned by `clean_text` (see the module docstring)."""
    calls = tuple(ToolCall(id=_clean_value(call.id), name=_clean_value(call.name),
                           arguments=_clean_value(call.arguments), raw=_clean_value(call.raw))
                  for call in response.tool_calls)
    usage = replace(response.usage, provider=_clean_value(response.usage.provider),
                    model=_clean_value(response.usage.model))
    return replace(response, content=_clean_value(response.content), tool_calls=calls, usage=usage,
                   finish_reason=_clean_value(response.finish_reason))


# ------------------------------------------------------------------------------------ resolution


def _strict_compatible(schema) -> bool:
    """Whether OpenAI's strict mode accepts `schema`: every object closed (additionalProperties false)
    with all its properties required, all the way down."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "object":
        properties = schema.get("properties") or {}
        return (schema.get("additionalProperties") is False and set(schema.get("required") or ()) == set(properties)
                and all(_strict_compatible(value) for value in properties.values()))
    if schema.get("type") == "array":
        return _strict_compatible(schema.get("items"))
    return True


def structured_output_format(model_name: str, schema: dict | None) -> dict | None:
    """The response_format asking `model_name` for JSON following `schema` (a workflow's outputSchema),
    when the provider it resolves to honours structured outputs (its ``structured_outputs`` flag in
    LLM_PROVIDERS; the offline model reads the schema from the prompt's directives instead). None for
    an empty or non-object schema, an unknown model, or a provider without the flag."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    try:
        resolved = resolve_model(model_name)
    except UnknownModel:
        return None
    if not structured_outputs(resolved.provider):
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema,
                                                   "strict": _strict_compatible(schema)}}


def model_problem(model_name: str) -> str | None:
    """Why `model_name` cannot be called on this install, or None when it can (workflow validation)."""
    try:
        resolve_model(model_name)
    except UnknownModel as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------- providers


@one_per_process
def _openai_provider(name: str, base_url: str | None, api_key: str, timeout: int) -> ChatProvider:
    from llm.openai_chat import OpenAIChatProvider

    return OpenAIChatProvider(name=name, base_url=base_url, api_key=api_key, timeout=timeout)


def load_provider_libraries() -> None:
    """Import the provider client library and the price database now (a worker's start: before a prefork
    worker forks, so its processes share them) instead of in the first model calls, where a second of CPU
    would delay every call of a threads pool's cold start. Nothing to load when every call is offline.
    A warm-up only: a client that cannot be built in this environment (a SOCKS proxy without its package, a
    missing CA bundle) is logged and the process starts; the model calls it would make fail with the reason."""
    if settings.LLM_PROVIDER == OFFLINE_PROVIDER and not settings.LLM_PROVIDERS:
        return
    from genai_prices.data_snapshot import get_snapshot

    from llm.openai_chat import OpenAIChatProvider  # imports openai

    get_snapshot()  # the price database's bundled data, read once (the first price looked up reads it)
    # a client built and closed (no request made) imports the HTTP transport a client imports as it is first built;
    # the transport reads the proxy and CA settings of the environment as it is built
    try:
        OpenAIChatProvider(name="warm-up", api_key="warm-up").client.close()
    except Exception as exc:
        logger.warning("the provider client could not be built here, so model calls will fail: %s: %s",
                       type(exc).__name__, exc)


def get_chat_provider(resolved: ResolvedModel) -> ChatProvider:
    """The provider that answers `resolved` (one instance per configuration, shared by the process)."""
    if resolved.provider == OFFLINE_PROVIDER:
        from llm.offline_chat import OfflineChatProvider

        return OfflineChatProvider()
    return _openai_provider(resolved.provider, resolved.base_url, resolved.api_key, settings.LLM_TIMEOUT_SECONDS)


class _NotAdmitted(Exception):
    def __init__(self, admission):
        self.admission = admission


def _admit(resolved: ResolvedModel, caller: str):
    """The call's place inside the provider's limits (llm/limits.py), None when it has none; raises
    _NotAdmitted when the call must wait."""
    from llm import limits

    _scope, configured = limits.scope_of(resolved.provider, resolved.model)
    if not limits.limited(configured):
        return None
    admission = limits.admit(resolved.provider, resolved.model, caller=caller)
    if not admission.admitted:
        raise _NotAdmitted(admission)
    return admission


def _send(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel, admission) -> ChatResponse:
    """Ask the provider in the place `admission` holds (None: no limits), given back after."""
    from llm import limits

    if admission is None:
        return provider.complete(request, resolved)
    try:
        return provider.complete(request, resolved)
    except TransientChatError as exc:
        if exc.rate_limited:
            limits.give_back_start(admission)
        raise
    finally:
        limits.release(admission)


def _attempt(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel, caller: str) -> ChatResponse:
    """One attempt, inside the provider's limits when it has any."""
    return _send(provider, request, resolved, _admit(resolved, caller))


def _complete_with_retries(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel,
                           wait: Callable[[float], None] = _wait) -> ChatResponse:
    """Outside durable steps: wait in this thread (with `wait`) for a provider limit, and between retries."""
    policy = RetryPolicy.from_settings()
    caller = uuid.uuid4().hex
    attempt = 0
    while True:
        try:
            return _attempt(provider, request, resolved, caller)
        except _NotAdmitted as refused:
            telemetry.llm_throttled(provider=resolved.provider, model=resolved.model, kind="limit")
            wait(refused.admission.wait)
        except TransientChatError as exc:
            attempt += 1
            delay = policy.delay(attempt, retry_after=exc.retry_after)
            if delay is None:
                raise TransientChatError(f"{resolved.provider} model {resolved.model!r} failed after {attempt} "
                                         f"attempts: {exc}", retry_after=exc.retry_after) from exc
            logger.warning("chat call to %s %r failed (%s), retry %d/%d in %.1fs",
                           resolved.provider, resolved.model, exc, attempt, policy.max_retries, delay)
            if exc.rate_limited:
                telemetry.llm_throttled(provider=resolved.provider, model=resolved.model, kind="provider")
            wait(delay)


def _complete_or_put_off(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel,
                         put_off: PutOff) -> ChatResponse:
    """In a durable step: one attempt; anything to wait for raises CallPutOff instead of sleeping. A call a
    limit of this install puts off was never sent, so it has no ``chat`` span (telemetry.llm_put_off); one
    the provider refused has, with its error."""
    try:
        admission = _admit(resolved, put_off.caller)
    except _NotAdmitted as refused:
        reason = f"{refused.admission.reason}: retry in {_seconds(refused.admission.wait)}"
        telemetry.llm_put_off(provider=resolved.provider, model=resolved.model, reason=reason)
        raise CallPutOff(reason, retry_in=refused.admission.wait, kind="limit") from None
    with telemetry.chat_span(request, provider=resolved.provider, model=resolved.model) as traced:
        try:
            response = clean_response(_send(provider, request, resolved, admission))
        except TransientChatError as exc:
            retry = put_off.retries_done + 1
            delay = RetryPolicy.from_settings().delay(retry, retry_after=exc.retry_after)
            if delay is None:
                raise TransientChatError(f"{resolved.provider} model {resolved.model!r} failed after {retry} "
                                         f"attempts: {exc}", retry_after=exc.retry_after) from exc
            what = f"rate limited by {resolved.provider}" if exc.rate_limited else f"{resolved.provider}: {exc}"
            reason = f"{what}: retry in {_seconds(delay)}"
            traced.throttled("provider", reason, error_type=type(exc).__name__)
            raise CallPutOff(reason, retry_in=delay, kind="provider") from exc
        traced.answered(response)
    return response


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 1.5 else f"{value:.1f} s"


@dataclass(frozen=True)
class PutOff:
    """How a durable step asks ``chat()`` not to wait: `caller` names the call across its tries (its
    reserved start under a rate limit), `retries_done` is how many provider failures it has had."""

    caller: str
    retries_done: int = 0


def chat(request: ChatRequest, *, cache: ResponseCache | None = None, put_off: PutOff | None = None,
         wait: Callable[[float], None] | None = None) -> tuple[ChatResponse, bool]:
    """Answer `request`: returns (response, True) from `cache` or (response, False) from the provider.

    `cache` (optional) has get(key) -> dict | None and put(key, request, response); it is asked only for
    a cacheable (temperature-0) request, and a hit is answered without calling the provider and without
    recording usage (the response keeps its original usage, so callers see what it cost). A provider
    call retries transient errors (LLM_MAX_RETRIES, Retry-After or capped exponential backoff) and
    records its usage with `llm.usage.record_usage`. The response, cached or not, is cleaned by
    `clean_response` (no NUL, no lone surrogate). A provider's limits (``max_concurrency``,
    ``requests_per_minute``) are waited for. With `put_off` (a durable step) nothing is waited for in this
    thread: a limit, or a failure the retry policy would retry, raises CallPutOff with how long to wait.
    Without it, `wait(seconds)` does the waiting (a queued step passes `durable.wait_alive`, which
    heartbeats). Raises UnknownModel, ChatError, TransientChatError (and CallPutOff)."""
    resolved = resolve_model(request.model)
    key = _cache_key(request, resolved) if cache is not None and request.cacheable() else None
    if cache is not None and key is not None:
        hit = cache.get(key)
        if hit is not None:
            return clean_response(ChatResponse.from_dict(hit)), True
    provider = get_chat_provider(resolved)
    if put_off is not None:
        response = _complete_or_put_off(provider, request, resolved, put_off)
    else:
        with telemetry.chat_span(request, provider=resolved.provider, model=resolved.model) as traced:
            response = clean_response(_complete_with_retries(provider, request, resolved, wait or _wait))
            traced.answered(response)
    record_usage(response.usage)
    if cache is not None and key is not None:
        cache.put(key, request, response)
    return response, False
