"""A content-hash cache and a bounded concurrent pool around any judge.

GRPO's rollouts often show a judge identical content, so the cache key is the hash of what the
judge reads plus the judge's fingerprint, and a repeat call is free. HTTP judges mostly wait on
the network, so a batch's calls run in a thread pool of `judges.max_workers` threads, which also
bounds the load on the judge endpoint.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Iterable

from rewards.judges.base import FallbackCounter, Judge, JudgeResult, TrajectoryView
from toolserver.results import close_if_closable

log = logging.getLogger(__name__)


class CachedJudge:
    """Wraps a judge with an LRU keyed on content, fallback counting and a bounded pool."""

    def __init__(self, judge: Judge, fallback_score: float = 0.3, cache_size: int = 4096, max_workers: int = 4):
        self.inner = judge
        self.name = judge.name
        self.fallback_score = fallback_score
        self.cache_size = cache_size
        self.max_workers = max(1, max_workers)
        self.counter = FallbackCounter()
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[str, JudgeResult] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._pool: ThreadPoolExecutor | None = None

    def fingerprint(self) -> str:
        return self.inner.fingerprint()

    def _key(self, aspect: str, view: TrajectoryView) -> str | None:
        try:
            return f"{self.inner.fingerprint()}|{view.content_hash(aspect)}"
        except Exception as e:  # hashing an odd image must not stop scoring
            log.warning("cannot hash %s input (%s); judging without cache", aspect, e)
            return None

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        key = self._key(aspect, view)
        if key is not None and self.cache_size > 0:
            while True:
                with self._lock:
                    hit = self._cache.get(key)
                    if hit is not None:
                        self._cache.move_to_end(key)
                        self.hits += 1
                        return replace(hit, cached=True)
                    event = self._inflight.get(key)
                    if event is None:
                        # We compute it; concurrent callers for the same key wait for us.
                        self._inflight[key] = threading.Event()
                        break
                event.wait()
        result = self._call(aspect, view)
        if key is not None and self.cache_size > 0:
            with self._lock:
                self.misses += 1
                # Fallbacks are not cached: the endpoint may be back for the next call.
                if not result.fallback:
                    self._cache[key] = result
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
                self._inflight.pop(key).set()
        return result

    def _call(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        try:
            result = self.inner.judge(aspect, view)
        except Exception as e:  # a judge bug is a fallback, never a crash in the training loop
            log.exception("%s judge raised on %s", self.name, aspect)
            result = JudgeResult.failed(self.fallback_score, f"judge_exception: {type(e).__name__}: {e}", self.name)
        self.counter.record(aspect, result, self.name)
        return result

    def judge_many(self, jobs: Iterable[tuple[str, TrajectoryView]]) -> list[JudgeResult]:
        """`judge` of every job, in order, at most `max_workers` at a time (1: one after another).

        The results equal serial ones: a job that reads the same content as an earlier job of the
        batch runs after the first round, so it meets the cache exactly as it would serially
        (`cached` set, or judged again after a fallback) whatever the threads' timing."""
        jobs = list(jobs)
        if len(jobs) <= 1 or self.max_workers == 1:
            return [self.judge(a, v) for a, v in jobs]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix=f"judge-{self.name}")
        seen: set[str | None] = set()
        rounds: tuple[list[int], list[int]] = ([], [])
        for i, job in enumerate(jobs):
            key = self._key(*job) if self.cache_size > 0 else None
            rounds[key is not None and key in seen].append(i)
            seen.add(key)
        out: list[JudgeResult | None] = [None] * len(jobs)
        for idx in rounds:
            for i, r in zip(idx, self._pool.map(lambda i: self.judge(*jobs[i]), idx)):
                out[i] = r
        return out  # type: ignore[return-value]

    def stats(self) -> dict[str, float]:
        return {**self.counter.snapshot(), "judge/cache_hits": float(self.hits), "judge/cache_misses": float(self.misses)}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        close_if_closable(self.inner)
