"""Small HTTP servers on loopback for the tests: a page server (for URL sources) and an
OpenAI-compatible embeddings server (for the real `openai` client)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many clients connecting at once (a worker with dozens of calls in flight)


class LocalServer:
    """Serves `routes` {path: (status, headers, body) or callable(handler) -> tuple} on host:0."""

    def __init__(self, host: str = "127.0.0.1", routes: dict | None = None):
        self.routes: dict[str, tuple | Callable] = dict(routes or {})
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append({"method": self.command, "path": self.path, "body": body,
                                        "headers": {k.lower(): v for k, v in self.headers.items()}})
                route = server.routes.get(self.path.split("?")[0])
                if route is None:
                    status, headers, payload = 404, {"Content-Type": "text/plain"}, b"not found"
                else:
                    status, headers, payload = route(self, body) if callable(route) else route
                if isinstance(payload, str):
                    payload = payload.encode()
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (size cap, deadline): that is what the test wanted

            do_GET = do_POST = _answer

        self.httpd = _Server((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.host = host
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


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
