"""A backend that exercises the serving path itself: dynamic batching, replica identity.

It runs no model and every result is `plumbing_only`; the serving tests attach it to a model
tool as `toolserver.serve_probe:batch_probe` to check that `@serve.batch` groups concurrent calls.
"""

from __future__ import annotations

import os
import time
from typing import Any

from toolserver.registry import REGISTRY
from toolserver.request import ToolRequest
from toolserver.results import ToolResult


SLEEP_PREFIX = "probe-sleep:"  # a text argument "probe-sleep:2.5" holds the call 2.5 s (timeout tests)


def _requested_sleep(req: ToolRequest) -> float:
    return next((float(v[len(SLEEP_PREFIX) :]) for v in req.args.values() if isinstance(v, str) and v.startswith(SLEEP_PREFIX)), 0.0)


class BatchProbe:
    plumbing_only = True

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s  # per call, so tests can hold a replica busy

    def _result(self, req: ToolRequest, batch_size: int) -> ToolResult:
        text = f"probe: {req.tool} served in a batch of {batch_size} by pid {os.getpid()}"
        data: dict[str, Any] = {"batch_size": batch_size, "pid": os.getpid(), "args": dict(req.args)}
        return ToolResult(True, text, REGISTRY[req.tool].output, data=data, plumbing_only=True, backend="probe")

    def __call__(self, req: ToolRequest) -> ToolResult:
        time.sleep(self.delay_s + _requested_sleep(req))
        return self._result(req, 1)

    def batch_call(self, reqs: list[ToolRequest]) -> list[ToolResult]:
        time.sleep(self.delay_s + max(_requested_sleep(r) for r in reqs))
        return [self._result(r, len(reqs)) for r in reqs]


def batch_probe(**params: Any) -> BatchProbe:
    return BatchProbe(**params)
