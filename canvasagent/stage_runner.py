"""Staged runs: the stages of a run folder, each run once, in this process or in a fresh
subprocess, timed and with its peak memory.

    stages = StagedRun("runs/main", "pipeline")
    rec = stages.run("sft", train, sft_config, isolate=True)  # rec["final"], rec["seconds"], rec["peak_rss_mb"]

Stage `s` (a name may hold slashes: `cells/sft-rl/grpo`) is done once `<root>/<s>/done.json`
exists: the stage's return value (a dict) plus `seconds`, `peak_rss_mb` and `peak_anon_mb`,
written atomically when the stage returns. `run` returns a done stage's record without calling
the stage; a stage that raised or was killed left none and runs again (resuming from what it
kept in its folder is its own business: `train` resumes from the last checkpoint).

A stage may name its `inputs`: the settings its result depends on beyond its code (an
evaluation's reply limit, a grid cell's reward). They are kept in `<root>/<s>/inputs.json` from the
stage's first start, and a call with other inputs is refused (`StaleStage`, naming the keys that
differ) whether the stage is done or was interrupted, so a resumed run never pairs, or finishes,
work done under other settings. A folder without `inputs.json` (written before stages named their
inputs) is taken as it is.

`train(cfg)` is the training stage, run in this process or isolated; `train_command(...)` runs the
`canvasagent.train` command line under a launcher of choice (e.g. `accelerate launch` across GPUs).

With `isolate`, `run_stage` runs the stage in a fresh Python subprocess, so whatever it loaded
(tool backends, torch, TRL state) and whatever the allocator kept goes back to the system when it
exits and never adds to the next stage's peak. The stage, its arguments and its return value must
then be picklable (a module-level function, the main script's included, or a method of a
picklable object). The subprocess imports this checkout's packages first, inherits the
environment, working directory and stdout/stderr, and logs at this process's root log level. Its
exception is raised here as a `StageFailed` carrying its traceback; an interrupt here terminates it.

`PeakRSS` samples the resident memory of this process plus all its descendants, so the peak is
the job's whichever way the stage ran (Linux; elsewhere this process's lifetime peak only, and no
`peak_anon_mb`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import numbers
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[1]  # holds canvasagent/, toolserver/, rewards/, canvascraft/


class StaleStage(ValueError):
    """A stage's folder holds work done under other inputs than this call's."""


class StageFailed(RuntimeError):
    """A stage run in a subprocess raised (`remote_traceback` is its traceback) or died."""

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message + (f"\n--- in the stage subprocess ---\n{remote_traceback}" if remote_traceback else ""))
        self.remote_traceback = remote_traceback


def _status_mb(pid: int | str = "self") -> dict[str, float]:
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                out["rss" if key == "VmRSS" else "anon"] = int(val.split()[0]) / 1024
    return out


def _descendants(root: int) -> list[int]:
    """Live descendants of `root` (from each process's parent id in /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # exited while listing
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])  # after the command name, which may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def rss_mb(children: bool = False) -> dict[str, float]:
    """Resident memory now (MB): `rss` (all of it) and `anon` (its anonymous part), of this
    process, or with `children` of this process plus all its descendants."""
    try:
        out = _status_mb()
        if children:
            for pid in _descendants(os.getpid()):
                with suppress(OSError):  # exited meanwhile
                    for k, v in _status_mb(pid).items():
                        out[k] = out.get(k, 0.0) + v
        return out
    except OSError:  # not Linux: the lifetime peak of this process is all there is
        import resource

        return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class PeakRSS:
    """Samples the RSS of this process and its descendants in a thread while a block runs;
    `peaks()` is the block's peak: {"peak_rss_mb": ..., "peak_anon_mb": ...}."""

    def __init__(self, every_s: float = 0.25):
        self.every_s, self._peak = every_s, rss_mb(children=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def _update(self) -> None:
        for k, v in rss_mb(children=True).items():
            self._peak[k] = max(self._peak.get(k, 0.0), v)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self._update()

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._update()

    def peaks(self) -> dict[str, float]:
        return {f"peak_{k}_mb": round(v, 1) for k, v in self._peak.items()}


@dataclass
class StageRun:
    value: Any
    seconds: float
    peaks: dict[str, float] = field(default_factory=dict)  # peak_rss_mb, peak_anon_mb: this process + descendants
    isolated: bool = False


def run_stage(fn: Callable[..., Any], *args: Any, isolate: bool = False, sample_every_s: float = 0.25, **kwargs: Any) -> StageRun:
    """`fn(*args, **kwargs)` in this process, or with `isolate` in a fresh Python subprocess, timed
    and with its peak RSS (this process plus descendants) sampled while it runs."""
    t0 = time.perf_counter()
    with PeakRSS(sample_every_s) as rss:
        value = _run_isolated(fn, args, kwargs) if isolate else fn(*args, **kwargs)
    return StageRun(value, round(time.perf_counter() - t0, 1), rss.peaks(), isolate)


# The subprocess puts this checkout ahead of its whole path, the working directory included.
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from canvasagent.stage_runner import _child_main; "
          "sys.exit(_child_main(sys.argv[2], sys.argv[3], int(sys.argv[4])))")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # This checkout's packages first, as in this process (an editable install may point elsewhere).
    paths = [str(_REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _run_isolated(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    name = getattr(fn, "__qualname__", repr(fn))
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None) if getattr(fn, "__module__", None) == "__main__" else None
    try:
        # Two layers: the child loads the parent's main script before unpickling the stage.
        payload = pickle.dumps((main_file, pickle.dumps((fn, args, kwargs, logging.getLogger().getEffectiveLevel()))))
    except Exception as e:
        raise TypeError(f"run_stage(isolate=True) needs a picklable stage and arguments; {name}: {e}") from e
    with tempfile.TemporaryDirectory(prefix="stage_") as tmp:
        job, result = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        job.write_bytes(payload)
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(_REPO_ROOT), str(job), str(result), str(os.getpid())],
                                env=_child_env())
        try:
            rc = proc.wait()
        except BaseException:  # interrupted here: the stage must not outlive us
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        if not result.exists():
            raise StageFailed(f"stage {name} died in its subprocess (exit {rc}) without a result")
        status, value, tb = pickle.loads(result.read_bytes())
    if status == "ok":
        return value
    raise StageFailed(f"stage {name} failed in its subprocess: {value}", tb)


def _load_main(path: str) -> None:
    """Import the parent's main script (a stage defined there) under another name, so its
    `if __name__ == "__main__"` block does not run, and let pickle find it as `__main__`."""
    spec = importlib.util.spec_from_file_location("__stage_main__", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(path).resolve().parent))  # as Python does for a script
    sys.modules["__stage_main__"] = module
    spec.loader.exec_module(module)
    sys.modules["__main__"] = module


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """End this stage process once `parent` is gone. The parent ends the stage itself when it is
    interrupted; a parent killed by a signal (SIGTERM, SIGKILL) cannot, and an orphaned stage
    would keep training for nobody, holding its memory and a core."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        logging.getLogger(__name__).warning("the job that started this stage (pid %d) is gone; ending the stage", parent)
        os._exit(1)

    threading.Thread(target=watch, name="stage-parent-watch", daemon=True).start()


def _child_main(job: str, result: str, parent: int) -> int:
    _exit_with_parent(parent)
    main_file, inner = pickle.loads(Path(job).read_bytes())
    if main_file:
        _load_main(main_file)
    fn, args, kwargs, level = pickle.loads(inner)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        out: tuple = ("ok", fn(*args, **kwargs), "")
    except BaseException as e:  # reported to the parent, which raises it
        out = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
    tmp = Path(result + ".tmp")
    tmp.write_bytes(pickle.dumps(out))
    tmp.replace(result)
    return 0 if out[0] == "ok" else 1


def _jsonable(o: Any) -> Any:
    """Numbers (numpy's included) as numbers, anything else (paths) as text."""
    return int(o) if isinstance(o, numbers.Integral) else float(o) if isinstance(o, numbers.Real) else str(o)


def train(cfg: Any) -> dict[str, Any]:
    """The training stage: `canvasagent.training.run(cfg)` resumed from the last checkpoint in
    `cfg.run.output_dir` (if any); its summary without the log history."""
    from canvasagent.training import run  # deferred: imports torch and TRL

    cfg.run.resume = True
    return {k: v for k, v in run(cfg).items() if k != "log_history"}


def _set_args(overrides: dict[str, Any]) -> list[str]:
    """`--set key=value` pairs for `canvasagent.train`: None as null, non-text values as JSON."""
    return [arg for k, v in overrides.items()
            for arg in ("--set", f"{k}={'null' if v is None else json.dumps(v) if not isinstance(v, str) else v}")]


def train_command(kind: str, config: str, out: Path, overrides: dict[str, Any], log_path: Path,
                  launcher: list[str] | None = None) -> Path:
    """The training stage as a command: `LAUNCHER -m canvasagent.train KIND --config CONFIG
    --output-dir OUT --set k=v ...`, LAUNCHER this Python or one that spans devices (`accelerate
    launch ...`). Its output is appended to `log_path`; it resumes when OUT holds a checkpoint.
    Returns OUT/final; a nonzero exit or a run that left no OUT/final raises `StageFailed` with
    the log's tail."""
    cmd = list(launcher or [sys.executable]) + ["-m", "canvasagent.train", kind, "--config", config, "--output-dir", str(out)]
    cmd += _set_args(overrides)
    if any(out.glob("checkpoint-*")):
        cmd.append("--resume")  # an interrupted run continues from its last save
    out.mkdir(parents=True, exist_ok=True)
    log.info("training %s: %s", kind, " ".join(cmd))
    with open(log_path, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_child_env())
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise StageFailed(f"{kind} training failed (exit {proc.returncode}); see {log_path}:\n{tail}")
    final = out / "final"
    if not final.exists():
        raise StageFailed(f"{kind} training finished without {final}; see {log_path}")
    return final


class StagedRun:
    """The stages of the run folder `root` (see the module docstring); `label` prefixes the log."""

    def __init__(self, root: str | Path, label: str = "stages"):
        self.root, self.label = Path(root), label

    def done(self, stage: str) -> dict[str, Any] | None:
        """The record of a finished stage; None while it has none (or an unreadable one)."""
        path = self.root / stage / "done.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # none, or not JSON: not done
            return None
        return record if isinstance(record, dict) else None

    def run(self, stage: str, fn: Callable[..., dict[str, Any]], *args: Any, isolate: bool = False,
            rerun: bool = False, inputs: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """The stage's record: the recorded one if it is done (unless `rerun`), else
        `fn(*args, **kwargs)` run through `run_stage`, its record written. `inputs` (JSON-able
        settings; see the module docstring) must match the ones the stage first started with, else
        `StaleStage`; `rerun` replaces them."""
        if inputs is not None:
            self._hold_inputs(stage, inputs, replace=rerun)
        if not rerun and (prev := self.done(stage)) is not None:
            log.info("[%s] %s: done already, skipping", self.label, stage)
            return prev
        log.info("[%s] %s: starting%s", self.label, stage, " (subprocess)" if isolate else "")
        r = run_stage(fn, *args, isolate=isolate, **kwargs)
        record, folder = {**r.value, "seconds": r.seconds, **r.peaks}, self.root / stage
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "done.json.tmp").write_text(json.dumps(record, indent=2, default=_jsonable))
        (folder / "done.json.tmp").replace(folder / "done.json")
        log.info("[%s] %s: finished in %.1fs, peak RSS %s MB", self.label, stage, r.seconds, record.get("peak_rss_mb"))
        return record

    def stale(self, stage: str, inputs: dict[str, Any]) -> str | None:
        """Why the stage's folder holds work under other inputs than `inputs` (the keys that
        differ, both ways); None when it holds none, or theirs are the same or unknown."""
        kept, wanted = self._kept_inputs(stage), json.loads(json.dumps(inputs, default=_jsonable))  # as read back from disk
        if kept is None or kept == wanted:
            return None
        diff = "; ".join(f"{k}: {kept.get(k)!r} there, {wanted.get(k)!r} now"
                         for k in sorted(kept.keys() | wanted.keys()) if kept.get(k) != wanted.get(k))
        return (f"{self.root / stage} holds work done under other inputs than this run's ({diff}). "
                f"Use another output folder, or delete {self.root / stage} to redo that stage.")

    def _kept_inputs(self, stage: str) -> dict[str, Any] | None:
        try:
            kept = json.loads((self.root / stage / "inputs.json").read_text())
        except (OSError, ValueError):  # none, or torn by a kill while written: never started under it
            return None
        return kept if isinstance(kept, dict) else None

    def _hold_inputs(self, stage: str, inputs: dict[str, Any], replace: bool) -> None:
        if not replace:
            if reason := self.stale(stage, inputs):
                raise StaleStage(reason)
            if self._kept_inputs(stage) is not None or self.done(stage) is not None:
                return  # held already, or done before stages named their inputs (unknown, taken as it is)
        folder = self.root / stage
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "inputs.json.tmp").write_text(json.dumps(inputs, indent=2, sort_keys=True, default=_jsonable))
        (folder / "inputs.json.tmp").replace(folder / "inputs.json")
