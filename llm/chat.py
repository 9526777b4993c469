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

import hashlib
import json
import logging
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from django.conf import settings

from llm.providers import OFFLINE_PROVIDER, configured_providers, one_per_process, structured_outputs
from llm.retry import RetryPolicy
from llm.retry import wait as _wait
from llm.usage import Usage, record_usage

logger = logging.getLogger("llm.chat")

OFFLINE_MODEL = "offline-directive-v1"
PROVIDER_SEPARATOR = "#"


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


# -------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters or {"type": "object",
                                                                                   "properties": {}}}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict  # {} when the model sent arguments that are not a JSON object
    raw: str = ""  # the arguments exactly as the model sent them

    def as_openai(self) -> dict:
        arguments = self.raw or json.dumps(self.arguments, ensure_ascii=False, sort_keys=True)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "raw": self.raw}

    @classmethod
    def from_dict(cls, data: dict) -> ToolCall:
        return cls(id=data["id"], name=data["name"], arguments=dict(data.get("arguments") or {}),
                   raw=data.get("raw", ""))


def parse_tool_arguments(raw: str | None) -> dict:
    """A tool call's arguments as a dict: {} when the model sent no JSON object."""
    try:
        value = json.loads(raw or "")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ChatRequest:
    model: str  # as written in a workflow DSL: "gpt-4.1-mini" or "openrouter#openai/gpt-4.1-mini"
    messages: list[dict]  # OpenAI chat format: system, user, assistant (with tool_calls), tool messages
    tools: tuple[ToolSpec, ...] = ()
    response_format: dict | None = None  # {"type": "json_object"} or {"type": "json_schema", "json_schema": ...}
    temperature: float = 0.0
    max_tokens: int | None = None

    def __post_init__(self):
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))

    def cache_key(self) -> str:
        """SHA-256 of everything that decides the answer: the provider and model the name resolves to
        on this install, the messages, tools, response format, temperature and token limit."""
        return _cache_key(self, resolve_model(self.model))

    def cacheable(self) -> bool:
        """Only temperature-0 calls are worth caching: at any other temperature the caller asked for variety."""
        return self.temperature == 0


def _cache_key(request: ChatRequest, resolved: ResolvedModel) -> str:
    payload = {
        "provider": resolved.provider, "model": resolved.model, "messages": request.messages,
        "tools": [tool.as_openai() for tool in request.tools], "response_format": request.response_format,
        "temperature": float(request.temperature), "max_tokens": request.max_tokens,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ChatResponse:
    content: str  # "" when the model only called tools
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)  # provider, the model that answered, tokens, USD
    latency_ms: float = 0.0
    finish_reason: str = "stop"

    def assistant_message(self) -> dict:
        """The OpenAI-format assistant message that records this answer in the history."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["content"] = self.content or None
            message["tool_calls"] = [call.as_openai() for call in self.tool_calls]
        return message

    def as_dict(self) -> dict:
        """A JSON-serialisable form (durable checkpoints, the Postgres cache)."""
        return {"content": self.content, "tool_calls": [call.as_dict() for call in self.tool_calls],
                "usage": self.usage.as_dict(), "latency_ms": self.latency_ms, "finish_reason": self.finish_reason}

    @classmethod
    def from_dict(cls, data: dict) -> ChatResponse:
        return cls(content=data.get("content") or "",
                   tool_calls=tuple(ToolCall.from_dict(call) for call in data.get("tool_calls") or ()),
                   usage=Usage.from_dict(data.get("usage") or {}), latency_ms=float(data.get("latency_ms", 0.0)),
                   finish_reason=data.get("finish_reason") or "stop")


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` as Postgres text and jsonb can store it: NUL characters removed, lone surrogates replaced
    with U+FFFD (a surrogate pair written as two code points becomes its character)."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if _SURROGATE.search(text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _clean_value(value):
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_clean_value(key): _clean_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean_value(item) for item in value]
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


@dataclass(frozen=True)
class ResolvedModel:
    provider: str  # "offline", "openai" or a name from LLM_PROVIDERS
    model: str  # the name the provider is asked for (the prefix removed)
    base_url: str | None
    api_key: str


def resolve_model(model_name: str) -> ResolvedModel:
    """Where a call to `model_name` goes on this install (see the module docstring for the rules)."""
    name = (model_name or "").strip()
    if not name:
        raise UnknownModel("The model name is empty.")
    prefix, separator, model = name.partition(PROVIDER_SEPARATOR)
    if not separator:
        prefix, model = "", name
    prefix = prefix.strip().lower()
    model = model.strip()
    if separator and not prefix:
        raise UnknownModel(f"Model {model_name!r} has an empty provider prefix before {PROVIDER_SEPARATOR!r}.")
    if not model:
        raise UnknownModel(f"Model {model_name!r} names no model after {PROVIDER_SEPARATOR!r}.")
    if prefix == OFFLINE_PROVIDER or (not prefix and model == OFFLINE_MODEL):
        return ResolvedModel(OFFLINE_PROVIDER, OFFLINE_MODEL, None, "")
    if settings.LLM_PROVIDER == OFFLINE_PROVIDER:
        # the demo and the tests: every model name, whatever provider it names, is the offline model
        # (its usage says so), so workflows written for real providers run unchanged
        return ResolvedModel(OFFLINE_PROVIDER, OFFLINE_MODEL, None, "")
    providers = configured_providers()
    provider = prefix or "openai"
    if provider not in providers:
        known = ", ".join(sorted(providers))
        raise UnknownModel(f'Model {model_name!r}: provider "{prefix}" is not configured (LLM_PROVIDERS; '
                           f"configured: {known}).")
    config = providers[provider]
    api_key = config.api_key()
    if api_key is None:
        raise UnknownModel(f'Model {model_name!r}: provider "{provider}" has no API key '
                           f"(set {config.api_key_env}).")
    return ResolvedModel(provider, model, config.url(), api_key)


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


class ChatProvider(ABC):
    name: str

    @abstractmethod
    def complete(self, request: ChatRequest, resolved: ResolvedModel) -> ChatResponse:
        """One attempt: the answer, or ChatError / TransientChatError. No retries, no usage recording."""


@one_per_process
def _openai_provider(name: str, base_url: str | None, api_key: str, timeout: int) -> ChatProvider:
    from llm.openai_chat import OpenAIChatProvider

    return OpenAIChatProvider(name=name, base_url=base_url, api_key=api_key, timeout=timeout)


def load_provider_libraries() -> None:
    """Import the provider client library and the price database now (a worker's start: before a prefork
    worker forks, so its processes share them) instead of in the first model calls, where a second of CPU
    would delay every call of a threads pool's cold start. Nothing to load when every call is offline."""
    if settings.LLM_PROVIDER == OFFLINE_PROVIDER and not settings.LLM_PROVIDERS:
        return
    import genai_prices  # noqa: F401

    import llm.openai_chat  # noqa: F401 (imports openai)


def get_chat_provider(resolved: ResolvedModel) -> ChatProvider:
    """The provider that answers `resolved` (one instance per configuration, shared by the process)."""
    if resolved.provider == OFFLINE_PROVIDER:
        from llm.offline_chat import OfflineChatProvider

        return OfflineChatProvider()
    return _openai_provider(resolved.provider, resolved.base_url, resolved.api_key, settings.LLM_TIMEOUT_SECONDS)


class _NotAdmitted(Exception):
    def __init__(self, admission):
        self.admission = admission


def _attempt(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel, caller: str) -> ChatResponse:
    """One attempt, inside the provider's limits (llm/limits.py) when it has any."""
    from llm import limits

    _scope, configured = limits.scope_of(resolved.provider, resolved.model)
    if not limits.limited(configured):
        return provider.complete(request, resolved)
    admission = limits.admit(resolved.provider, resolved.model, caller=caller)
    if not admission.admitted:
        raise _NotAdmitted(admission)
    try:
        return provider.complete(request, resolved)
    except TransientChatError as exc:
        if exc.rate_limited:
            limits.give_back_start(admission)
        raise
    finally:
        limits.release(admission)


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
            wait(refused.admission.wait)
        except TransientChatError as exc:
            attempt += 1
            delay = policy.delay(attempt, retry_after=exc.retry_after)
            if delay is None:
                raise TransientChatError(f"{resolved.provider} model {resolved.model!r} failed after {attempt} "
                                         f"attempts: {exc}", retry_after=exc.retry_after) from exc
            logger.warning("chat call to %s %r failed (%s), retry %d/%d in %.1fs",
                           resolved.provider, resolved.model, exc, attempt, policy.max_retries, delay)
            wait(delay)


def _complete_or_put_off(provider: ChatProvider, request: ChatRequest, resolved: ResolvedModel,
                         put_off: PutOff) -> ChatResponse:
    """In a durable step: one attempt; anything to wait for raises CallPutOff instead of sleeping."""
    try:
        return _attempt(provider, request, resolved, put_off.caller)
    except _NotAdmitted as refused:
        admission = refused.admission
        raise CallPutOff(f"{admission.reason}: retry in {_seconds(admission.wait)}", retry_in=admission.wait,
                         kind="limit") from None
    except TransientChatError as exc:
        retry = put_off.retries_done + 1
        delay = RetryPolicy.from_settings().delay(retry, retry_after=exc.retry_after)
        if delay is None:
            raise TransientChatError(f"{resolved.provider} model {resolved.model!r} failed after {retry} "
                                     f"attempts: {exc}", retry_after=exc.retry_after) from exc
        what = f"rate limited by {resolved.provider}" if exc.rate_limited else f"{resolved.provider}: {exc}"
        raise CallPutOff(f"{what}: retry in {_seconds(delay)}", retry_in=delay, kind="provider") from exc


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 1.5 else f"{value:.1f} s"


@dataclass(frozen=True)
class PutOff:
    """How a durable step asks ``chat()`` not to wait: `caller` names the call across its tries (its
    reserved start under a rate limit), `retries_done` is how many provider failures it has had."""

    caller: str
    retries_done: int = 0


def chat(request: ChatRequest, *, cache=None, put_off: PutOff | None = None,
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
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            return clean_response(ChatResponse.from_dict(hit)), True
    provider = get_chat_provider(resolved)
    if put_off is not None:
        response = clean_response(_complete_or_put_off(provider, request, resolved, put_off))
    else:
        response = clean_response(_complete_with_retries(provider, request, resolved, wait or _wait))
    record_usage(response.usage)
    if key is not None:
        cache.put(key, request, response)
    return response, False
