"""Local stubs of the OpenAI chat-completions protocol (real HTTP servers on 127.0.0.1 only).

One server core, two ways to script it:

* `StubOpenAI(responder)`: `responder(body) -> (status, payload)` decides each answer; every
  request body is kept in `requests`, with the request path under `_path` and the
  Authorization header under `_auth` (policy, planner and writer tests).
* `StubServer(replies, delay_s=0)`: answers each POST /v1/chat/completions with the next scripted
  reply: a string (assistant content), an int (an HTTP status with an error body) or a callable
  `(request_json) -> str`; other paths get 404. It records every request body and its headers and
  the peak number of concurrent requests (judge tests).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Responder = Callable[[dict[str, Any]], tuple[int, Any]]


def chat_payload(text: str) -> dict[str, Any]:
    return {"id": "stub", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


class _Server(ThreadingHTTPServer):
    # A real endpoint accepts many connections at once; the stdlib's backlog of 5 makes a burst
    # of 16 concurrent judge calls wait ~1 s for TCP to retry the refused connections.
    request_queue_size = 128


class _Stub:
    """The HTTP server; subclasses answer each POST in `_answer(path, headers, body) -> (status, payload)`."""

    def __init__(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                # The request stops counting as in flight before its answer goes out: once the
                # client has the answer it may send its next request, which must not overlap it.
                try:
                    status, payload = stub._answer(self.path, self.headers, body)
                finally:
                    stub._done()
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def _answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any]:
        raise NotImplementedError

    def _done(self) -> None:
        """Called once the answer is ready (or failed), before it is sent."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


class StubOpenAI(_Stub):
    def __init__(self, responder: Responder):
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        super().__init__()

    def _answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any]:
        body["_path"] = path
        body["_auth"] = headers.get("Authorization")
        self.requests.append(body)
        return self.responder(body)


class StubServer(_Stub):
    def __init__(self, replies: list[Any] | Callable[[dict], Any], delay_s: float = 0.0):
        self.replies = replies
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._i = 0
        super().__init__()

    def _answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(headers))
            self.active += 1
            self.peak = max(self.peak, self.active)
            if callable(self.replies):
                reply = self.replies(body)
            else:
                reply = self.replies[min(self._i, len(self.replies) - 1)]
                self._i += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if path.rstrip("/") != "/v1/chat/completions":
            return 404, {"error": {"message": "not found"}}
        if isinstance(reply, int):
            return reply, {"error": {"message": f"status {reply}"}}
        return 200, {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}],
        }

    def _done(self) -> None:
        with self._lock:
            self.active -= 1  # counted from the request's arrival until its answer is ready


def replies(*texts: str) -> Responder:
    """A `StubOpenAI` responder: answer with `texts` in order, then with the last one forever."""
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
