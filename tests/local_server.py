"""A small HTTP server on loopback for the tests: pages for URL sources, and the base of the OpenAI-compatible
server (tests/openai_server.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
