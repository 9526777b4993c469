"""What a chat call is made of, shared by `llm.chat` and the providers that answer it (llm/openai_chat.py,
llm/offline_chat.py): the request, the response, tools and tool calls, and the provider interface.

    request = ChatRequest(model="gpt-4.1-mini", messages=[{"role": "user", "content": "What is Lineage?"}],
                          tools=(ToolSpec("knowledge_search", "Search the knowledge base", {...}),))
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from llm.names import ResolvedModel, resolve_model
from llm.usage import Usage


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
        return request_cache_key(self, resolve_model(self.model))

    def cacheable(self) -> bool:
        """Only temperature-0 calls are worth caching: at any other temperature the caller asked for variety."""
        return self.temperature == 0


def request_cache_key(request: ChatRequest, resolved: ResolvedModel) -> str:
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


class ChatProvider(ABC):
    name: str

    @abstractmethod
    def complete(self, request: ChatRequest, resolved: ResolvedModel) -> ChatResponse:
        """One attempt: the answer, or ChatError / TransientChatError. No retries, no usage recording."""


class ResponseCache(Protocol):
    """What `llm.chat.chat` asks before calling a provider (workflows/llm_cache.py's ChatCache)."""

    def get(self, key: str) -> dict | None: ...

    def put(self, key: str, request: ChatRequest, response: ChatResponse) -> None: ...
