"""Sharded, resumable builds: local processes by default, Ray tasks with `--ray`.

A build is split into shards of consecutive row slots. Every slot draws from its own RNG, seeded
by (seed, slot, attempt), so a shard's content depends only on the config and its slot range,
never on which worker ran it or when. Each shard is written atomically (temp file, rename), then
recorded in `manifest.json`; a restarted build skips recorded shards and rebuilds the rest, so
it has no duplicate or lost row and the same rows as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolserver.config import find_config, from_dict, load_yaml

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


@dataclass
class BuildConfig:
    """Fields shared by SFT and RL builds (configs/canvascraft/{sft,rl}.yaml)."""

    n: int = 100  # row slots (SFT: kept trajectories unless every attempt of a slot is rejected)
    seed: int = 0
    shard_size: int = 50
    workers: int = 0  # 0: one per CPU
    # A shard whose worker process dies (OOM killer, SIGKILL) is rebuilt in a fresh pool up to
    # this many times; then the build stops with BuildWorkerDied (a rerun resumes it).
    worker_restarts: int = 3
    tools_config: str = "offline"
    images: str = "builtin"  # builtin | procedural | photos | a folder | a saved dataset | hf:NAME
    image_size: int = 256
    writer: str = "template"  # template | llm
    llm: dict[str, Any] = field(default_factory=dict)  # LLMWriter fields: base_url, model, ...
    chains: list[str] = field(default_factory=lambda: ["chains"])  # chain files (names or paths)
    mix: dict[str, float] = field(default_factory=dict)  # weight overrides by chain name or group
    tones: dict[str, float] = field(default_factory=lambda: {"explicit": 0.5, "implicit": 0.5})
    max_attempts: int = 4  # QC rejections tolerated per slot before the slot stays empty
    max_skips: int = 500  # redraws of chains that have no backend, per slot
    # Inputs of chains with SR are downscaled to this side: SR is for small images, and a CPU
    # Real-ESRGAN pass costs about 4 s per 100x100 input pixels squared (0: keep the size).
    sr_input_side: int = 96


@dataclass
class SftConfig(BuildConfig):
    allow_plumbing: bool = False  # keep trajectories whose outputs came from random-weight models
    max_turns: int = 12


@dataclass
class RlConfig(BuildConfig):
    eval_n: int = 0  # held-out eval tasks, built with eval_seed whatever --seed says
    eval_seed: int = 1234567
    # Target share of easy/medium/hard per axis (paper Table 3 by default).
    reasoning: dict[str, float] = field(default_factory=lambda: {"easy": 761, "medium": 1807, "hard": 7432})
    length: dict[str, float] = field(default_factory=lambda: {"easy": 476, "medium": 4687, "hard": 4837})
    diversity: dict[str, float] = field(default_factory=lambda: {"easy": 2317, "medium": 5631, "hard": 2052})
    max_steps: int = 12  # longest reference chain (the public rollouts allow 12 assistant turns)
    reference_images: bool = True  # run deterministic reference solutions for an expected final image


CONFIG_TYPES: dict[str, type[BuildConfig]] = {"sft": SftConfig, "rl": RlConfig}


def load_build_config(kind: str, name_or_path: str | None = None, **overrides: Any) -> BuildConfig:
    data = load_yaml(find_config(name_or_path or kind, "canvascraft"))
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(CONFIG_TYPES[kind], data)


_RUNTIME_FIELDS = ("workers", "worker_restarts")


def config_hash(kind: str, cfg: BuildConfig) -> str:
    # Workers, restarts and shard timing do not change the rows, so they do not invalidate a resume.
    d = {k: v for k, v in asdict(cfg).items() if k not in _RUNTIME_FIELDS}
    return hashlib.sha256(json.dumps([kind, d], sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShardJob:
    kind: str
    split: str
    index: int
    seed: int
    start: int
    stop: int

    @property
    def key(self) -> str:
        return f"{self.split}-{self.index:05d}"

    @property
    def file(self) -> str:
        return f"shards/{self.kind}-{self.key}.parquet"


def plan_jobs(kind: str, cfg: BuildConfig) -> list[ShardJob]:
    splits = [("train", cfg.seed, cfg.n)]
    if isinstance(cfg, RlConfig) and cfg.eval_n > 0:
        splits.append(("eval", cfg.eval_seed, cfg.eval_n))
    return [ShardJob(kind, split, i, seed, start, min(n, start + cfg.shard_size))
            for split, seed, n in splits for i, start in enumerate(range(0, n, cfg.shard_size))]


def run_shard(kind: str, cfg_dict: dict[str, Any], job: ShardJob, out: str) -> tuple[ShardJob, int, dict[str, Any]]:
    """Build one shard and write it atomically. Plain arguments, so Pool and Ray can ship it."""
    import datasets

    from canvascraft.formats import write_parquet_atomic

    datasets.disable_progress_bars()
    cfg = from_dict(CONFIG_TYPES[kind], cfg_dict)
    if kind == "sft":
        from canvascraft.sft import build_sft_shard as build_shard
    else:
        from canvascraft.rl import build_rl_shard as build_shard
    rows, stats = build_shard(cfg, job)
    write_parquet_atomic(rows, kind, Path(out) / job.file)
    return job, len(rows), stats


def _write_json_atomic(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def load_manifest(out: str | Path) -> dict[str, Any] | None:
    p = Path(out) / MANIFEST
    return json.loads(p.read_text()) if p.exists() else None


class BuildInterrupted(RuntimeError):
    """Raised by `stop_after` (tests simulate a killed build with it)."""


class BuildWorkerDied(RuntimeError):
    """A shard's worker process died more than `worker_restarts` times; recorded shards are kept."""


def run_build(
    kind: str,
    cfg: BuildConfig,
    out: str | Path,
    use_ray: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Build (or resume) `out`; returns the manifest. `stop_after=K` stops after K new shards."""
    out = Path(out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    h = config_hash(kind, cfg)
    manifest = load_manifest(out)
    if manifest is None:
        manifest = {"kind": kind, "config": asdict(cfg), "config_hash": h, "shards": {}, "complete": False}
    elif manifest.get("config_hash") != h or manifest.get("kind") != kind:
        raise ValueError(f"{out} holds a {manifest.get('kind')} build with another config; use a new --out to start over")
    for k in _RUNTIME_FIELDS:
        manifest["config"][k] = getattr(cfg, k)
    jobs = plan_jobs(kind, cfg)
    done = manifest["shards"]
    pending = [j for j in jobs if j.key not in done or not (out / done[j.key]["file"]).exists()]
    if len(pending) < len(jobs):
        log.info("resuming %s: %d of %d shards already done", out, len(jobs) - len(pending), len(jobs))
    cfg_dict = asdict(cfg)
    total = sum(j.stop - j.start for j in jobs)
    from tqdm.auto import tqdm

    done_slots = sum(j.stop - j.start for j in jobs if j not in pending)
    bar = tqdm(total=total, initial=done_slots, desc=f"canvascraft {kind}", unit="slot", disable=not progress)
    finished = 0
    try:
        for job, n_rows, stats in _execute(kind, cfg_dict, pending, str(out), cfg.workers, use_ray, cfg.worker_restarts):
            done[job.key] = {"file": job.file, "split": job.split, "rows": n_rows, "slots": [job.start, job.stop], "stats": stats}
            _write_json_atomic(out / MANIFEST, manifest)
            bar.update(job.stop - job.start)
            bar.set_postfix(kept=sum(s["rows"] for s in done.values()))
            finished += 1
            if stop_after is not None and finished >= stop_after and len(done) < len(jobs):
                raise BuildInterrupted(f"stopped after {finished} shards (stop_after)")
    finally:
        bar.close()
    manifest["complete"] = len(done) == len(jobs)
    _write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _execute(kind: str, cfg_dict: dict[str, Any], jobs: list[ShardJob], out: str, workers: int, use_ray: bool, restarts: int = 3):
    if not jobs:
        return
    if use_ray:
        yield from _execute_ray(kind, cfg_dict, jobs, out, workers)
        return
    n = workers or os.cpu_count() or 1
    if n <= 1 or len(jobs) == 1:
        from canvascraft.context import release_contexts

        try:
            for job in jobs:
                yield run_shard(kind, cfg_dict, job, out)
        finally:  # the build's models are not needed past it
            release_contexts()
        return
    yield from _execute_pool(kind, cfg_dict, jobs, out, n, restarts)


def _execute_pool(kind: str, cfg_dict: dict[str, Any], jobs: list[ShardJob], out: str, n: int, restarts: int):
    """Run shards in a process pool; yields `run_shard` results as they finish.

    At most `n` shards are in flight, so when a worker dies (the OS killed it: the pool then
    fails every unfinished future) exactly those shards are suspects. Each is charged one
    death and rebuilt in a fresh pool; a shard charged more than `restarts` times raises
    `BuildWorkerDied`. Shards are deterministic and written atomically, and the driver records
    only returned shards, so a rebuild neither loses nor duplicates a row.
    """
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn" if os.environ.get("CANVASCRAFT_SPAWN") else None)
    queue = list(jobs)
    deaths: dict[str, int] = {}
    idle_breaks = 0  # pools that broke with no shard in flight (a worker killed between shards)
    while queue:
        pool = ProcessPoolExecutor(min(n, len(queue)), mp_context=ctx)
        running: dict[Any, ShardJob] = {}
        broken = False
        died: list[str] = []  # shards in flight when this pool broke
        try:
            while queue or running:
                while queue and len(running) < n and not broken:
                    job = queue.pop(0)
                    try:
                        running[pool.submit(run_shard, kind, cfg_dict, job, out)] = job
                    except BrokenProcessPool:
                        queue.insert(0, job)
                        broken = True
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    exc = fut.exception()
                    if isinstance(exc, BrokenProcessPool):
                        broken = True
                        queue.insert(0, job)
                        deaths[job.key] = deaths.get(job.key, 0) + 1
                        died.append(job.key)
                    elif exc is not None:
                        raise exc
                    else:
                        yield fut.result()
                if broken and not running:
                    break
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if broken:
            suspects = sorted(died)
            worst = max((deaths[k] for k in suspects), default=0)
            if not suspects:
                idle_breaks += 1
                worst = idle_breaks
            if worst > restarts:
                raise BuildWorkerDied(
                    f"a build worker process died {worst} times while building shard(s) "
                    f"{', '.join(k for k in suspects if deaths[k] == worst)} (killed by the OS, e.g. out of memory?); "
                    f"finished shards are recorded in {MANIFEST}: rerun to resume, with fewer --workers if memory is short"
                )
            log.warning(
                "a build worker process died (killed by the OS, e.g. out of memory?); restarting the pool and "
                "rebuilding shard(s) %s (rebuild %d of at most %d)", ", ".join(suspects), worst, restarts,
            )


def _execute_ray(kind: str, cfg_dict: dict[str, Any], jobs: list[ShardJob], out: str, workers: int = 0):
    """The same shard tasks as Ray tasks; workers build their own toolbox from `tools_config` (with
    `client: ray`, the Ray Serve toolbox). On a cluster, `out` must be shared storage every node can write."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        local = {} if address else {"num_cpus": workers or None, "include_dashboard": False}
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, **local)
    task = ray.remote(num_cpus=1)(run_shard)
    refs = [task.remote(kind, cfg_dict, j, out) for j in jobs]
    while refs:
        ready, refs = ray.wait(refs, num_returns=1)
        yield ray.get(ready[0])


def shard_files(out: str | Path, kind: str | None = None, split: str | None = None) -> list[Path]:
    """Recorded shard files of a build (only `split`, if given); `kind` guards against reading
    an RL build as SFT data or the other way round."""
    m = load_manifest(out)
    if m is None:
        raise FileNotFoundError(f"no {MANIFEST} in {out}")
    if kind is not None and m["kind"] != kind:
        raise ValueError(f"{out} is a {m['kind']} build, not {kind}")
    return sorted(Path(out) / s["file"] for s in m["shards"].values() if split is None or s["split"] == split)


def read_tasks(out: str | Path, split: str) -> list:
    """The runnable `Task`s of the RL build at `out`, its `split` (train | eval) shards in order:
    the one reader of a build's tasks. Raises FileNotFoundError when `out` holds no manifest,
    ValueError for an SFT build or a build without `split` shards."""
    from canvascraft.formats import read_rows  # both load `datasets` (about 2 s)
    from canvascraft.rl import tasks_of

    files = shard_files(out, "rl", split)
    if not files:
        raise ValueError(f"{out} is a CanvasCraft RL build without {split!r} shards" + (" (build with eval_n > 0)" if split == "eval" else ""))
    return tasks_of(read_rows(files), split)
