"""Run independent EASEL jobs (one reference image each) in parallel.

Two backends, same results (every job is deterministic and self-contained):

* ``local`` (default): a ``spawn`` process pool -- fork after torch has
  started threads can deadlock;
* ``ray``: one Ray task per job (``num_cpus=1``). An already initialised Ray
  (e.g. ``ray.init(address=...)`` for a cluster) is used as is; otherwise a
  local Ray with ``workers`` CPUs is started for the call and shut down after.

Results are yielded as they complete, each with its job index, so callers can
write partial output and restore the job order themselves.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from typing import Any, Callable, Iterator, Sequence

log = logging.getLogger(__name__)

BACKENDS = ("local", "ray")


def _indexed(args: tuple[Callable[[Any], Any], int, Any]) -> tuple[int, Any]:
    fn, i, job = args
    return i, fn(job)


def imap_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int = 1,
              backend: str = "local") -> Iterator[tuple[int, Any]]:
    """Yield ``(index, fn(job))`` in completion order. ``fn`` must be picklable (module level)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    if backend == "ray":
        yield from _ray_imap(fn, jobs, workers)
        return
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned workers
    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        yield from pool.imap_unordered(_indexed, [(fn, i, j) for i, j in enumerate(jobs)], chunksize=1)


def _ray_imap(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int) -> Iterator[tuple[int, Any]]:
    import ray
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        started = True
    try:
        remote = ray.remote(num_cpus=1)(fn)
        pending = {remote.remote(job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()
