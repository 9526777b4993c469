"""A local OpenAI-compatible server for the real `openai` client: embeddings and chat completions with scripted
answers, as a test or a fixture starts it (`with FakeOpenAIChat() as server:`)."""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from collections import deque

import numpy as np

from tests.local_server import LocalServer


class FakeOpenAI(LocalServer):
    """Answers POST /v1/embeddings like OpenAI: deterministic vectors of the requested width, usage,
    float or base64 encoding. `failures` is a list of (status, headers, body) answered first."""

    def __init__(self, *, dimensions: int = 384, native_dimensions: int | None = None):
        super().__init__("127.0.0.1", {"/v1/embeddings": self._embeddings})
        self.dimensions = dimensions
        self.native_dimensions = native_dimensions  # a model that ignores `dimensions`
        self.failures: list[tuple] = []
        self.payloads: list[dict] = []

    def _embeddings(self, handler, body: bytes):
        if self.failures:
            return self.failures.pop(0)
        payload = json.loads(body)
        self.payloads.append(payload)
        texts = payload["input"] if isinstance(payload["input"], list) else [payload["input"]]
        width = self.native_dimensions or payload.get("dimensions") or self.dimensions
        data = []
        for index, text in enumerate(texts):
            rng = np.random.default_rng(abs(hash(text)) % (2**32))
            vector = rng.standard_normal(width).astype(np.float32)
            vector /= np.linalg.norm(vector)
            if payload.get("encoding_format") == "base64":
                embedding = base64.b64encode(vector.tobytes()).decode()
            else:
                embedding = [float(x) for x in vector]
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(len(t.split()) for t in texts)
        answer = {"object": "list", "data": data, "model": payload["model"],
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer)


class FakeOpenAIChat(FakeOpenAI):
    """Also answers POST /v1/chat/completions. `chat_replies` is consumed in order: a (status, headers,
    body) tuple is sent as is (errors, rate limits); a dict describes the assistant's answer
    ({"content", "tool_calls": [(id, name, arguments)], "finish_reason", "usage", "model"}). With no
    reply left the server answers "ok". Every request body is kept in `chat_payloads`.

    Like a real provider it may be slow and limited: each answer takes `latency` seconds; with
    `requests_per_minute` a request past that many in the last minute is answered 429 with the
    Retry-After of the next free start (counted in `refused`). Answered calls are kept in `calls`
    ((start, end, request body), monotonic seconds); `peak_in_flight` is the most answered at once."""

    def __init__(self, *, latency: float = 0.0, requests_per_minute: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.routes["/v1/chat/completions"] = self._chat
        self.chat_replies: list = []
        self.chat_payloads: list[dict] = []
        self.latency = latency
        self.requests_per_minute = requests_per_minute
        self.calls: list[tuple[float, float, dict]] = []
        self.in_flight = self.peak_in_flight = self.refused = 0
        self._starts: deque[float] = deque()
        self._lock = threading.Lock()

    def _chat(self, handler, body: bytes):
        payload = json.loads(body)
        with self._lock:
            self.chat_payloads.append(payload)
            wait = self._over_the_limit()
            if wait is not None:
                self.refused += 1
                return 429, {"Content-Type": "application/json", "Retry-After": str(wait)}, json.dumps(
                    {"error": {"message": "Rate limit reached for requests", "type": "requests"}})
            reply = self.chat_replies.pop(0) if self.chat_replies else {"content": "ok"}
            if isinstance(reply, tuple):
                return reply
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        start = time.monotonic()
        try:
            if self.latency:
                time.sleep(self.latency)
            return self._answer(payload, reply, len(self.chat_payloads))
        finally:
            with self._lock:
                self.in_flight -= 1
                self.calls.append((start, time.monotonic(), payload))

    def _over_the_limit(self) -> int | None:
        if not self.requests_per_minute:
            return None
        now = time.monotonic()
        while self._starts and self._starts[0] <= now - 60:
            self._starts.popleft()
        if len(self._starts) >= self.requests_per_minute:
            return max(1, math.ceil(self._starts[0] + 60 - now))
        self._starts.append(now)
        return None

    @staticmethod
    def _answer(payload: dict, reply: dict, number: int):
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
        answer = {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": 0,
                  "model": reply.get("model", payload["model"]),
                  "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if usage is not None:
            answer["usage"] = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer)


def peak_overlap(intervals) -> int:
    """The most of `intervals` ((start, end) pairs) open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                   key=lambda edge: (edge[0], edge[1]))
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak
