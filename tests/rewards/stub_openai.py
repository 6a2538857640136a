"""A minimal OpenAI chat-completions server on 127.0.0.1 for judge tests (a real HTTP server).

`StubServer(replies)` answers each POST /v1/chat/completions with the next scripted reply:
a string (assistant content), an int (an HTTP status with an error body) or a callable
`(request_json) -> str`. It records every request and the peak number of concurrent requests.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class StubServer:
    def __init__(self, replies: list[Any] | Callable[[dict], Any], delay_s: float = 0.0):
        self.replies = replies
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._i = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append(body)
                    stub.headers.append(dict(self.headers))
                    stub.active += 1
                    stub.peak = max(stub.peak, stub.active)
                    if callable(stub.replies):
                        reply = stub.replies(body)
                    else:
                        reply = stub.replies[min(stub._i, len(stub.replies) - 1)]
                        stub._i += 1
                try:
                    if stub.delay_s:
                        time.sleep(stub.delay_s)
                    if self.path.rstrip("/") != "/v1/chat/completions":
                        self._send(404, {"error": {"message": "not found"}})
                    elif isinstance(reply, int):
                        self._send(reply, {"error": {"message": f"status {reply}"}})
                    else:
                        self._send(200, {
                            "id": "chatcmpl-stub",
                            "object": "chat.completion",
                            "model": body.get("model"),
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": reply}}],
                        })
                finally:
                    with stub._lock:
                        stub.active -= 1

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "StubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
