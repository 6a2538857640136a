"""A model-tool stand-in that only takes time: for benchmarks and tests of tool concurrency.

`latency` holds every call for `latency_s` plus a uniform jitter in `[-jitter_s, +jitter_s]`
(never below zero), then answers with a plumbing-only result of the tool's declared kind: a
copy of the first input image (or a flat `size`-square image), an empty mask, or a short note.
`batch_call` holds a whole batch for one latency, as a GPU would; each request counts as in
flight. Never a default: only a tools config that names `backend: latency` uses it.

Thread-safe; it counts the calls it holds at once, in a registry keyed by `stats_key`, not on the
instance, so every instance with that key in one process (racing first callers may build a
backend twice) adds to the same `LatencyStats`. A Ray Serve replica is its own process: read its
counts from the results (`data["in_flight"]`, `data["batch_size"]`).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from toolserver.backends._base import parse_params
from toolserver.registry import REGISTRY, OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult


@dataclass
class LatencyParams:
    latency_s: float = 0.5
    jitter_s: float = 0.0
    seed: int = 0
    size: int = 64  # side of the flat image an image tool returns when it got no input image
    stats_key: str = "default"

    def __post_init__(self) -> None:
        if not (0 <= self.latency_s <= 600 and 0 <= self.jitter_s <= 600):
            raise ValueError(f"latency: latency_s and jitter_s must lie in [0, 600], got {self.latency_s}, {self.jitter_s}")
        if not 1 <= self.size <= 4096:
            raise ValueError(f"latency: size must lie in [1, 4096], got {self.size}")


@dataclass
class LatencyStats:
    """What one stats key saw: calls, the most calls held at once, batch sizes and time held."""

    calls: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    batches: list[int] = field(default_factory=list)
    held_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def enter(self, n: int = 1) -> int:
        with self._lock:
            self.calls += n
            self.in_flight += n
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.batches.append(n)
            return self.in_flight

    def leave(self, n: int, held_s: float) -> None:
        with self._lock:
            self.in_flight -= n
            self.held_s += held_s

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": self.calls, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                    "batches": list(self.batches), "held_s": self.held_s}


_STATS: dict[str, LatencyStats] = {}
_STATS_LOCK = threading.Lock()


def latency_stats(key: str = "default") -> LatencyStats:
    """The shared counters of `key` in this process (created empty on first use)."""
    with _STATS_LOCK:
        return _STATS.setdefault(key, LatencyStats())


def reset_latency_stats(key: str = "default") -> LatencyStats:
    """Start `key`'s counters afresh; returns the new, empty counters."""
    with _STATS_LOCK:
        _STATS[key] = LatencyStats()
        return _STATS[key]


class LatencyBackend:
    plumbing_only = True

    def __init__(self, params: LatencyParams):
        self.params = params
        self._rng = random.Random(params.seed)
        self._rng_lock = threading.Lock()

    @property
    def stats(self) -> LatencyStats:
        return latency_stats(self.params.stats_key)

    def _delay(self) -> float:
        p = self.params
        if not p.jitter_s:
            return p.latency_s
        with self._rng_lock:
            return max(0.0, p.latency_s + self._rng.uniform(-p.jitter_s, p.jitter_s))

    def _hold(self, n: int) -> int:
        stats = self.stats
        seen = stats.enter(n)
        delay = self._delay()
        t0 = time.perf_counter()
        try:
            time.sleep(delay)
        finally:
            stats.leave(n, time.perf_counter() - t0)
        return seen

    def _result(self, req: ToolRequest, in_flight: int, batch_size: int) -> ToolResult:
        spec = REGISTRY.get(req.tool)
        kind = spec.output if spec is not None else OutputKind.TEXT
        image = None
        first = next(iter(req.images.values()), None)
        if kind in (OutputKind.IMAGE, OutputKind.RGBA):
            image = first.convert("RGB").copy() if first is not None else Image.new("RGB", (self.params.size,) * 2, (128, 128, 128))
            kind = OutputKind.IMAGE
        elif kind is OutputKind.MASK:
            image = Image.new("L", first.size if first is not None else (self.params.size,) * 2, 0)
        text = f"latency stand-in: {req.tool} held {self.params.latency_s:g} s (plumbing only, not a real result)"
        data = {"in_flight": in_flight, "batch_size": batch_size}
        return ToolResult(True, text, kind, image, data=data, plumbing_only=True, backend="latency")

    def __call__(self, req: ToolRequest) -> ToolResult:
        return self._result(req, self._hold(1), 1)

    def batch_call(self, reqs: list[ToolRequest]) -> list[ToolResult]:
        seen = self._hold(len(reqs))
        return [self._result(r, seen, len(reqs)) for r in reqs]


def latency(**params: Any) -> LatencyBackend:
    """Backend factory (`backend: latency`); params: latency_s, jitter_s, seed, size, stats_key."""
    return LatencyBackend(parse_params(LatencyParams, params, "latency"))
