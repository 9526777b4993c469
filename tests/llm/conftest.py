"""A local OpenAI-compatible server for the real `openai` client: embeddings (tests/knowledge/servers.py)
and chat completions with scripted answers."""

from __future__ import annotations

import json

import pytest

from tests.knowledge.servers import FakeOpenAI


class FakeOpenAIChat(FakeOpenAI):
    """Also answers POST /v1/chat/completions. `chat_replies` is consumed in order: a (status, headers,
    body) tuple is sent as is (errors, rate limits); a dict describes the assistant's answer
    ({"content", "tool_calls": [(id, name, arguments)], "finish_reason", "usage", "model"}). With no
    reply left the server answers "ok". Every request body is kept in `chat_payloads`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.routes["/v1/chat/completions"] = self._chat
        self.chat_replies: list = []
        self.chat_payloads: list[dict] = []

    def _chat(self, handler, body: bytes):
        self.chat_payloads.append(json.loads(body))
        reply = self.chat_replies.pop(0) if self.chat_replies else {"content": "ok"}
        if isinstance(reply, tuple):
            return reply
        payload = self.chat_payloads[-1]
        message: dict = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                              else json.dumps(arguments)}}
                for call_id, name, arguments in reply["tool_calls"]
            ]
        finish = reply.get("finish_reason") or ("tool_calls" if reply.get("tool_calls") else "stop")
        usage = reply.get("usage", {"prompt_tokens": 10, "completion_tokens": 5})
        answer = {"id": f"chatcmpl-{len(self.chat_payloads)}", "object": "chat.completion", "created": 0,
                  "model": reply.get("model", payload["model"]),
                  "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if usage is not None:
            answer["usage"] = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer)


@pytest.fixture
def openai_server():
    with FakeOpenAIChat(dimensions=384) as server:
        yield server
