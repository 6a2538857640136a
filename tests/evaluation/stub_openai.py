"""A local stub of the OpenAI chat-completions protocol, for policy and planner tests.

It answers on 127.0.0.1 only. `responder(body) -> (status, payload)` decides each answer; every
request body is kept in `requests` for assertions.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Responder = Callable[[dict[str, Any]], tuple[int, Any]]


def chat_payload(text: str) -> dict[str, Any]:
    return {"id": "stub", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


class StubOpenAI:
    def __init__(self, responder: Responder):
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                body["_path"] = self.path
                body["_auth"] = self.headers.get("Authorization")
                stub.requests.append(body)
                status, payload = stub.responder(body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "StubOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def replies(*texts: str) -> Responder:
    """Answer with `texts` in order, then with the last one forever."""
    queue = list(texts)

    def respond(body: dict[str, Any]) -> tuple[int, Any]:
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        return 200, chat_payload(text)

    return respond


def free_port() -> int:
    """A loopback port with nothing listening (for 'endpoint down' tests)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
