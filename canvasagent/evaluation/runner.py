"""Run a policy over an evaluation split: concurrent, resumable, every trajectory saved.

Layout under `out_dir`:

    trajectories/<task_id>/trajectory.json + assets/   the episode, saved even when it failed
    trajectories/<task_id>/result.json                 scores; written last, it marks the task done
    trajectories/<task_id>/sample_<j>/                 with `samples` > 1: episode j of the task

On rerun a task with `result.json` is skipped; one with a finished trajectory but no result (the
scorer failed, or the run stopped while scoring) is rescored from disk without rerunning the
policy; an interrupted one is rerun. Ctrl-C stops workers at their next turn and saves what they
have (stop_reason "interrupted").
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.metrics import TaskResult, merge_samples, task_result
from canvasagent.core.policies.guards import GuardConfig, GuardedPolicy
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from toolserver.backends._base import seeded_torch
from toolserver.client import make_toolbox

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]
Progress = Callable[[int, int, TaskResult | None], None]  # done, total, latest result
RESULT_FILE = "result.json"
UNFINISHED = ("running", "interrupted")


@dataclass
class EvalConfig:
    workers: int = 2
    max_turns: int = 12
    tools: str = "offline"  # tools config name or path
    success_threshold: float = 0.5
    resume: bool = True
    guard: GuardConfig = field(default_factory=GuardConfig)
    samples: int = 1  # episodes per task (a sampling policy); the task's scores are their means
    # Seeds torch's RNG once for the run (a sampling HF policy draws from it) and runs tasks one
    # at a time in order, so the same seed gives the same episodes. None: unseeded, concurrent.
    seed: int | None = None
    tools_in_system_prompt: bool = True  # False: the tool block is in the chat template (training layout)
    end_without_call: bool = False  # training layout: a reply without a tool call ends the episode
    # The image-context budget (canvasagent.core.image_budget): the policy sees the last N tool images,
    # older ones as their asset-ID text; None: every image. Match the checkpoint's training setting.
    image_budget: int | None = None


def task_dir_name(task_id: str) -> str:
    """A filesystem-safe, stable folder name for a task id."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id).strip("._") or "task"
    return safe[:120]


class _CancellablePolicy(GuardedPolicy):
    """Raises KeyboardInterrupt between turns once the run is cancelled, which `run_episode`
    turns into a saved trajectory with stop_reason "interrupted"."""

    def __init__(self, policy: Any, config: GuardConfig, cancel: threading.Event):
        super().__init__(policy, config)
        self.cancel = cancel

    def act(self, messages, episode):
        if self.cancel.is_set():
            raise KeyboardInterrupt
        return super().act(messages, episode)


class EvalRunner:
    def __init__(self, policy_factory: Any, scorer: Scorer, out_dir: str | Path, config: EvalConfig | None = None,
                 toolbox: Any = None):
        """`toolbox`: one the caller owns and closes, used by every worker instead of `config.tools`."""
        self.factory = policy_factory
        self.shared_toolbox = toolbox
        self.scorer = scorer
        self.out = Path(out_dir)
        self.config = config or EvalConfig()
        self.cancel = threading.Event()
        # One toolbox per worker thread: model backends load once per worker, not once per task.
        self._local = threading.local()
        self._toolboxes: list[Any] = []
        self._tb_lock = threading.Lock()

    def _toolbox(self) -> Any:
        if self.shared_toolbox is not None:
            return self.shared_toolbox
        tb = getattr(self._local, "toolbox", None)
        if tb is None:
            tb = self._local.toolbox = make_toolbox(self.config.tools)
            with self._tb_lock:
                self._toolboxes.append(tb)
        return tb

    def _dir(self, task: Task) -> Path:
        return self.out / "trajectories" / task_dir_name(task.id)

    def load_done(self, task: Task) -> TaskResult | None:
        path = self._dir(task) / RESULT_FILE
        if not path.exists():
            return None
        try:
            return TaskResult.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError) as e:
            log.warning("unreadable %s (%s); rerunning task %s", path, e, task.id)
            return None

    def _episode(self, task: Task, d: Path) -> Trajectory:
        if self.config.resume and (d / "trajectory.json").exists():
            try:
                old = Trajectory.load(d)
                if old.stop_reason not in UNFINISHED:
                    log.info("task %s: rescoring the saved trajectory", task.id)
                    return old
            except Exception as e:  # a corrupt save is rerun, not fatal
                log.warning("task %s: saved trajectory unreadable (%s); rerunning", task.id, e)
        if d.exists():  # a rerun replaces an unfinished attempt; no stale asset files may remain
            shutil.rmtree(d)
        policy = _CancellablePolicy(self.factory.for_task(task), self.config.guard, self.cancel)
        ecfg = EpisodeConfig(max_turns=self.config.max_turns, family=task.family, tools_in_system_prompt=self.config.tools_in_system_prompt,
                             end_without_call=self.config.end_without_call, image_budget=self.config.image_budget)
        traj = run_episode(policy, task, self._toolbox(), ecfg)
        traj.meta["policy"] = self.factory.name
        traj.save(d)  # before scoring: a scorer crash must not lose the episode
        return traj

    def _episode_dirs(self, task: Task) -> list[Path]:
        d = self._dir(task)
        k = max(1, self.config.samples)
        return [d] if k == 1 else [d / f"sample_{j}" for j in range(k)]

    def run_task(self, task: Task) -> TaskResult | None:
        t0 = time.perf_counter()
        results = []
        for d in self._episode_dirs(task):
            try:
                traj = self._episode(task, d)
            except Exception as e:  # e.g. an oversized input image: record and move on
                log.error("task %s could not run: %s", task.id, e)
                res = TaskResult(task.id, stop_reason="task_error", error=f"{type(e).__name__}: {e}", labels=dict(task.labels))
                self._write(task, res)
                return res
            if traj.stop_reason in UNFINISHED:
                return None  # cancelled: saved, not done
            try:
                scores = self.scorer(traj)
            except Exception as e:
                log.error("task %s: scoring failed (%s); the trajectory is saved and will be rescored on rerun", task.id, e)
                return None
            results.append(task_result(traj, scores, self.config.success_threshold, time.perf_counter() - t0))
        res = results[0] if len(results) == 1 else merge_samples(results)
        res.seconds = time.perf_counter() - t0
        self._write(task, res)
        return res

    def _write(self, task: Task, res: TaskResult) -> None:
        d = self._dir(task)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / (RESULT_FILE + ".tmp")
        tmp.write_text(json.dumps(res.to_dict(), indent=2, default=float))
        tmp.replace(d / RESULT_FILE)

    def run(self, tasks: list[Task], progress: Progress | None = None) -> list[TaskResult]:
        ids = [t.id for t in tasks]
        if len(set(map(task_dir_name, ids))) != len(ids):
            raise ValueError("task ids collide after sanitising; give tasks unique ids")
        results: dict[str, TaskResult] = {}
        todo: list[Task] = []
        for t in tasks:
            done = self.load_done(t) if self.config.resume else None
            if done is not None:
                results[t.id] = done
            else:
                todo.append(t)
        if results:
            log.info("resuming: %d of %d tasks already done", len(results), len(tasks))
        total = len(tasks)
        if progress:
            progress(len(results), total, None)
        seeded = self.config.seed is not None
        # One worker takes the queue in order, so the seeded RNG stream meets the tasks in order.
        pool = ThreadPoolExecutor(max_workers=1 if seeded else max(1, self.config.workers), thread_name_prefix="eval")
        with contextlib.ExitStack() as stack:
            if seeded:
                stack.enter_context(seeded_torch(self.config.seed))
            try:
                futures = {pool.submit(self.run_task, t): t for t in todo}
                for fut in as_completed(futures):
                    res = fut.result()
                    if res is not None:
                        results[futures[fut].id] = res
                    if progress:
                        progress(len(results), total, res)
            except KeyboardInterrupt:
                log.warning("interrupted: finishing the current turn of each running task and saving it")
                self.cancel.set()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
                for tb in self._toolboxes:
                    tb.close()
                self._toolboxes.clear()
        return [results[i] for i in ids if i in results]
