"""A scorer -> TRL reward functions, one per weighted component.

GRPO's reward is Σ weight_k · component_k, which is exactly the scorer's `hybrid` when the
weights are the scorer's; one function per component makes TRL log each (`rewards/<name>/mean`).
The scorer comes from the config's task source (`training.sources.Source.scorer`). Each trajectory
is finished with the reply texts only the completion holds (`env.trajectory_of`) and scored once
per rollout (cached on its env); a step's rollouts are scored as one batch (`HybridScorer.many`:
judge calls concurrent, `judges.max_workers` at a time, the same scores as one by one).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from canvasagent.evaluation.scoring import HYBRID, HybridScorer, make_scorer  # noqa: F401 (make_scorer: the pipeline's entry)
from canvasagent.training.env import CanvasEnv, trajectory_of
from canvasagent.training.sources import task_source

log = logging.getLogger(__name__)


def rollout_diagnostics(traj: Trajectory) -> dict[str, float]:
    """Per rollout: `format_validity` (share of turns without a format finding; 0 with no turn),
    `tool_calls` (calls recorded in the trajectory) and `no_tool` (1.0 when there were none)."""
    turns = traj.turns
    calls = sum(t.call is not None for t in turns)
    return {
        "format_validity": sum(not t.findings for t in turns) / len(turns) if turns else 0.0,
        "tool_calls": float(calls),
        "no_tool": float(calls == 0),
    }


class JudgeOutage(RuntimeError):
    """Too many rollouts of a GRPO step were scored by a judge fallback (on_excess_fallbacks: abort)."""


class TRLRewards:
    """Per-component TRL reward functions over env trajectories, plus a per-rollout hook.

    `functions()` gives one function per weighted component, then the logged-only ones (weight 0:
    TRL logs `rewards/<name>/mean` and `/std` without them entering the reward): `judge_fallbacks`
    (1 for a rollout some judge could not score), the `rollout_diagnostics`, and for each name in
    `sources` one `<value>/<source>` per value in `PER_SOURCE`: the value for rollouts of that
    source (`sources.task_source`), None for the others (TRL's NaN, left out of the mean).

    Every fallback is warned about with its count. Past `scorer.max_fallback_share` of a batch,
    `abort` raises `JudgeOutage`, and `drop` gives each such rollout the mean of its group's judged
    rollouts (groups are `group_size` consecutive completions, as TRL orders them), so its
    advantage is 0 and the fallback's constant score cannot flatten the others'.
    """

    LOGGED = ("judge_fallbacks", "format_validity", "tool_calls", "no_tool")
    PER_SOURCE = (HYBRID, "format_validity", "no_tool")

    def __init__(self, scorer: HybridScorer, on_scored: Callable[[int, list[Trajectory], list[dict]], None] | None = None,
                 group_size: int = 1, sources: Iterable[str] = ()):
        self.scorer = scorer
        self.on_scored = on_scored
        self.names = [k for k in scorer.weights]
        self.group_size = max(1, int(group_size))
        self.sources = tuple(dict.fromkeys(sources))

    @staticmethod
    def sources_in(task_json: Iterable[str | dict]) -> tuple[str, ...]:
        """The sorted distinct `task_source` of a GRPO data set's `task` column (JSON or dicts)."""
        found = set()
        for d in task_json:
            d = json.loads(d) if isinstance(d, str) else d
            found.add(task_source(Task.from_dict(d)))
        return tuple(sorted(found))

    def _scores(self, completions: list, environments: list[CanvasEnv], trainer_state: Any = None) -> list[dict]:
        fresh = [(env, trajectory_of(env, comp)) for comp, env in zip(completions, environments) if env.scores is None]
        for (env, traj), s in zip(fresh, self._score_batch([t for _, t in fresh])):
            s = {k: (float(v) if v is not None and math.isfinite(float(v)) else 0.0) for k, v in s.items()}
            s[HYBRID] = self.scorer.total(s)
            s.update(rollout_diagnostics(traj))
            env.scores = s
        out = [env.scores for env in environments]
        step = getattr(trainer_state, "global_step", 0) if trainer_state is not None else 0
        if fresh:
            self._guard_fallbacks(out, step)
        if fresh and self.on_scored is not None:
            self.on_scored(step, [trajectory_of(e, c) for c, e in zip(completions, environments)], out)
        return out

    def _score_batch(self, trajs: list[Trajectory]) -> list[dict]:
        """The step's rollouts scored together (`HybridScorer.many`: judge calls concurrent)."""
        try:
            return self.scorer.many(trajs) if trajs else []
        except Exception:  # a scorer bug must not kill training: one by one, 0 for a rollout that fails
            log.exception("reward scoring of %d rollouts failed; scoring them one by one", len(trajs))
        out = []
        for traj in trajs:
            try:
                out.append(self.scorer(traj))
            except Exception:
                log.exception("reward scoring failed for %s", traj.task.id)
                out.append({k: 0.0 for k in self.names})
        return out

    def _guard_fallbacks(self, scores: list[dict], step: int) -> None:
        bad = [i for i, s in enumerate(scores) if s.get("fallbacks", 0.0) > 0 and not s.get("dropped")]
        for i, s in enumerate(scores):
            s.setdefault("judge_fallbacks", float(i in bad))
        if not bad:
            return
        share = len(bad) / len(scores)
        log.warning("GRPO step %d: %d of %d rollouts were scored by a judge fallback (%.0f%%; limit %.0f%%)",
                    step, len(bad), len(scores), 100 * share, 100 * self.scorer.max_fallback_share)
        if share <= self.scorer.max_fallback_share:
            return
        if self.scorer.on_excess_fallbacks == "abort":
            raise JudgeOutage(f"{len(bad)} of {len(scores)} rollouts at step {step} were scored by a judge fallback "
                              f"(more than judges.max_fallback_share = {self.scorer.max_fallback_share}); is the judge up?")
        gs = self.group_size
        for g0 in range(0, len(scores), gs):
            group = range(g0, min(len(scores), g0 + gs))
            judged = [j for j in group if j not in bad]
            for i in (i for i in group if i in bad):
                for k in dict.fromkeys((*self.names, HYBRID)):
                    if k in scores[i]:
                        scores[i][k] = sum(scores[j].get(k, 0.0) for j in judged) / len(judged) if judged else 0.0
                scores[i]["dropped"] = 1.0
        log.warning("GRPO step %d: dropped %d fallback rollouts from the advantage", step, len(bad))

    def functions(self) -> list[Callable]:
        def reward(name: str, value: Callable[[dict, Any, CanvasEnv], float | None]) -> Callable:
            def fn(completions, environments, trainer_state=None, **kwargs):
                scores = self._scores(completions, environments, trainer_state)
                return [value(s, c, e) for s, c, e in zip(scores, completions, environments)]

            fn.__name__ = name  # TRL logs rewards/<__name__>/mean
            return fn

        fns = [reward(n, lambda s, c, e, n=n: s[n]) for n in self.names]
        fns += [reward(n, lambda s, c, e, n=n: s.get(n, 0.0)) for n in self.LOGGED]
        # Per source: None for the other sources' rollouts (TRL's NaN, left out of the mean).
        fns += [reward(f"{n}/{src}", lambda s, c, e, n=n, src=src:
                       s[n] if task_source(trajectory_of(e, c).task) == src else None)
                for src in self.sources for n in self.PER_SOURCE]
        return fns

    def weights(self) -> list[float]:
        n_logged = len(self.LOGGED) + len(self.PER_SOURCE) * len(self.sources)
        return [self.scorer.weights[n] for n in self.names] + [0.0] * n_logged
