"""Chat completions from OpenAI or any OpenAI-compatible server (vLLM, Ollama, LM Studio, OpenRouter),
through the official `openai` client. One attempt per call: `llm.chat.chat` owns the retries."""

from __future__ import annotations

import json
import time

import openai
from openai.types.chat import ChatCompletion

from llm.errors import ChatError, TransientChatError
from llm.model_options import model_options
from llm.names import ResolvedModel
from llm.providers import structured_outputs
from llm.retry import retry_after_of
from llm.types import ChatProvider, ChatRequest, ChatResponse, ToolCall, parse_tool_arguments
from llm.usage import Usage, estimate_tokens

# statuses the openai client itself would retry besides 429 and 5xx: a request timeout and a lock conflict
_TRANSIENT_STATUSES = {408, 409}


class OpenAIChatProvider(ChatProvider):
    """POST /chat/completions with the request's messages, tools (tool_choice "auto"), response format,
    temperature and token limit, shaped for the model (llm/model_options.py: reasoning models get
    max_completion_tokens and no temperature). Rate limits, timeouts, lost connections and 5xx answers raise
    TransientChatError (with the server's Retry-After), any other refusal ChatError with its message."""

    def __init__(self, *, name: str = "openai", base_url: str | None = None, api_key: str = "",
                 timeout: float = 60.0, client=None):
        self.name = name
        # the client's own retries are off: chat() retries, honouring Retry-After, and counts every attempt
        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key or "no-key", timeout=timeout,
                                              max_retries=0)

    def complete(self, request: ChatRequest, resolved: ResolvedModel) -> ChatResponse:
        options = model_options(resolved.provider, resolved.model)
        kwargs: dict = {"model": resolved.model, "messages": request.messages}
        if options.temperature:
            kwargs["temperature"] = request.temperature
        if request.tools:
            kwargs["tools"] = [tool.as_openai() for tool in request.tools]
            kwargs["tool_choice"] = "auto"
        if request.response_format and (request.response_format.get("type") != "json_schema"
                                        or structured_outputs(resolved.provider)):
            kwargs["response_format"] = request.response_format
        if request.max_tokens is not None:
            kwargs[options.token_limit_param] = request.max_tokens
        body = {**kwargs, **options.extra_body} if options.extra_body else kwargs
        started = time.perf_counter()
        try:
            # the client's documented request method with the body as it goes on the wire: the typed create()
            # walks every request through the SDK's TypedDict transformer (about 1 ms of CPU for two short
            # messages, more with tools and a long history), which renames nothing of the chat API's
            completion = self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        except (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError,
                openai.InternalServerError) as exc:
            raise TransientChatError(f"{type(exc).__name__}: {_server_message(exc)}",
                                     retry_after=retry_after_of(exc),
                                     rate_limited=isinstance(exc, openai.RateLimitError)) from exc
        except openai.APIStatusError as exc:
            message = f"{self.name} refused the chat request ({exc.status_code}): {_server_message(exc)}"
            if exc.status_code in _TRANSIENT_STATUSES:
                raise TransientChatError(message, retry_after=retry_after_of(exc)) from exc
            raise ChatError(message) from exc
        except (openai.OpenAIError, ValueError) as exc:  # an answer the client could not read (bad JSON)
            raise ChatError(f"{self.name} answered the chat request with something unreadable: {exc}") from exc
        latency_ms = (time.perf_counter() - started) * 1000
        try:
            return self._response(completion, kwargs["messages"], resolved, latency_ms)
        except (AttributeError, TypeError, IndexError, KeyError, ValueError) as exc:
            # a 200 that is not a chat completion (a proxy's page, another endpoint's JSON): the client hands
            # back the text, or a model built without validation whose fields are missing or of another type
            raise ChatError(f"{self.name} answered the chat request with something unreadable: "
                            f"not a chat completion ({type(exc).__name__}: {exc})") from exc

    def _response(self, completion, messages, resolved: ResolvedModel, latency_ms: float) -> ChatResponse:
        if not isinstance(completion, ChatCompletion) or "choices" not in completion.model_fields_set:
            raise TypeError(f"a body without choices ({type(completion).__name__})")
        if not completion.choices:
            raise ChatError(f"{self.name} model {resolved.model!r} returned no choices.")
        choice = completion.choices[0]
        message = choice.message
        if not isinstance(message.tool_calls or [], list):
            raise TypeError(f"tool_calls is {type(message.tool_calls).__name__}, not a list")
        tool_calls = tuple(
            ToolCall(id=_text(call.id, "tool call id"), name=_text(function.name, "tool call name"),
                     arguments=parse_tool_arguments(function.arguments), raw=function.arguments or "")
            for call in (message.tool_calls or ()) if (function := getattr(call, "function", None)) is not None
        )
        content = _text(message.content or "", "content")
        usage = completion.usage
        input_tokens = _token_count(getattr(usage, "prompt_tokens", None), "prompt_tokens")
        output_tokens = _token_count(getattr(usage, "completion_tokens", None), "completion_tokens")
        if input_tokens is None:  # a server that does not count: estimate, so the cost is not silently zero
            input_tokens = estimate_tokens(json.dumps(messages, ensure_ascii=False, default=str))
        if output_tokens is None:
            output_tokens = estimate_tokens(content + "".join(call.raw for call in tool_calls))
        return ChatResponse(
            content=content, tool_calls=tool_calls,
            usage=Usage.priced(provider=self.name, model=completion.model or resolved.model,
                               input_tokens=input_tokens, output_tokens=output_tokens,
                               cached_input_tokens=_cached_tokens(usage), requested=resolved.model),
            latency_ms=latency_ms, finish_reason=choice.finish_reason or ("tool_calls" if tool_calls else "stop"),
        )


def _cached_tokens(usage) -> int:
    """Input tokens the provider read from its prompt cache (billed lower), when it says."""
    details = getattr(usage, "prompt_tokens_details", None)
    return _token_count(getattr(details, "cached_tokens", None), "cached_tokens") or 0


# no model reads or writes a billion tokens in one call: a larger count is not one (and would overflow the
# cost and token columns it is added to)
_MAX_TOKENS = 10 ** 9


def _token_count(value, field: str) -> int | None:
    """A usage count as the server sent it (a lenient one may send a float or a numeric string); None when
    absent. ValueError for anything that is not a count."""
    if value is None:
        return None
    try:
        count = int(value)
    except OverflowError as exc:  # an infinity
        raise ValueError(f"usage {field} is {value!r}") from exc
    if not 0 <= count < _MAX_TOKENS:
        raise ValueError(f"usage {field} is {value!r}")
    return count


def _text(value, field: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} is {type(value).__name__}, not a string")
    return value


def _server_message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return str(getattr(exc, "message", None) or exc)
