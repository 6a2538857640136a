"""The hybrid reward: judges + rule reward, combined as a YAML preset says.

    paper mode:        R = w_align·A + w_aes·E + w_traj·T + w_rule·R_rule      (paper Eq. 1)
                       E = quality(final) · A where the task has an input image (`aes_gate`)
    public_code mode:  see `PublicCodeConfig` (weights, coverage/depth bonuses, fatal gate)

`HybridReward.score(traj)` returns one flat `dict[str, float]` in the reward vocabulary: `hybrid`
(the total, `HYBRID`), the four components (`COMPONENTS`) and every sub-term (`rule/format/json`,
`rule/p_eff/repeat`, `aes/sharpness`, `align/fallback`, ...), ready for a logger. `score_many`
scores a batch with the judges running concurrently.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

from canvasagent.core.trajectory import Trajectory
from rewards.config import RewardConfig, load_reward_config
from rewards.judges import COMPONENT_OF, CachedJudge, JudgeResult, TrajectoryView, make_judge
from rewards.rule import RuleBreakdown, score_rule
from toolserver.registry import REGISTRY, OutputKind

log = logging.getLogger(__name__)

# The reward vocabulary: `hybrid` is the total (paper Eq. 1, or the public-code formula), the
# components are the paper's R_align, R_aes, R_traj and R_rule; sub-terms are `<component>/<term>`.
HYBRID = "hybrid"
COMPONENTS = ("align", "aes", "traj", "rule")
LEGACY_TOTALS = ("total", "overall")  # the total's names in older result files


def canonical_scores(scores: dict[str, Any]) -> dict[str, Any]:
    """A saved score dict in the reward vocabulary: a legacy total name (`LEGACY_TOTALS`) becomes
    `hybrid` when `hybrid` is absent, and the legacy names are dropped; other keys are kept as they are."""
    out = {k: v for k, v in scores.items() if k not in LEGACY_TOTALS}
    if HYBRID not in out:
        legacy = next((scores[k] for k in LEGACY_TOTALS if k in scores), None)
        if legacy is not None:
            out[HYBRID] = legacy
    return out


def _finite(x: float, default: float = 0.0) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else default


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, _finite(x)))


class HybridReward:
    """R(τ) with every term; never raises on a trajectory (bad input gets a defined score)."""

    def __init__(
        self,
        config: RewardConfig | str | Path | None = None,
        judge: CachedJudge | None = None,
        toolbox: Any | None = None,
        judge_unweighted: bool = True,
        memo_size: int = 1024,
    ):
        self.cfg = load_reward_config(config)
        self.judge = judge or make_judge(self.cfg.judges, toolbox=toolbox)
        # Evaluation wants every component even when a preset gives it weight 0; training can skip.
        self.judge_unweighted = judge_unweighted
        self._memo: OrderedDict[int, tuple[Trajectory, tuple, dict[str, float]]] = OrderedDict()
        self._memo_size = memo_size
        self._lock = threading.Lock()

    @classmethod
    def from_preset(cls, preset: str | Path = "paper", judge: str | None = None, toolbox: Any | None = None, **kw: Any) -> "HybridReward":
        """A preset by name or path, optionally with another judge kind (offline | http | local)."""
        cfg = load_reward_config(preset)
        if judge:
            cfg.judges.kind = judge
        return cls(cfg, toolbox=toolbox, **kw)

    @property
    def weights(self) -> dict[str, float]:
        """Component -> weight such that Σ weight·component = `hybrid`. Public-code mode is not a
        weighted sum of the components, so there `hybrid` itself carries weight 1."""
        if self.cfg.mode == "public_code":
            return {HYBRID: 1.0}
        return {c: self.weight(c) for c in COMPONENTS}

    def components(self, traj: Trajectory) -> dict[str, float]:
        """Alias of `score` (the flat dict holds the components, `hybrid` and every sub-term)."""
        return self.score(traj)

    def weight(self, component: str) -> float:
        if self.cfg.mode == "public_code":
            return {"align": self.cfg.weights.align, "aes": self.cfg.weights.aes, "traj": self.cfg.weights.traj}.get(component, 0.0)
        return float(getattr(self.cfg.weights, component))

    def _aspects(self) -> list[str]:
        return [a for a, c in COMPONENT_OF.items() if self.judge_unweighted or self.weight(c) != 0.0]

    def score(self, traj: Trajectory) -> dict[str, float]:
        return self.score_many([traj])[0]

    def score_many(self, trajs: Sequence[Trajectory]) -> list[dict[str, float]]:
        out = [self._memo_get(t) for t in trajs]
        todo = [i for i, o in enumerate(out) if o is None]
        if todo:
            views: dict[int, TrajectoryView | None] = {}
            for i in todo:
                try:
                    views[i] = TrajectoryView.of(trajs[i])
                except Exception as e:  # not a trajectory we can read: defined zero score below
                    log.warning("cannot read trajectory %d: %s", i, e)
                    views[i] = None
            aspects = self._aspects()
            jobs = [(a, views[i]) for i in todo if views[i] is not None for a in aspects]
            results = iter(self.judge.judge_many(jobs))
            for i in todo:
                view = views[i]
                if view is None:
                    out[i] = self._invalid("unreadable_trajectory")
                    continue
                judged = {COMPONENT_OF[a]: next(results) for a in aspects}
                out[i] = self._combine(trajs[i], judged)
                self._memo_put(trajs[i], out[i])
        return [o if o is not None else self._invalid("unscored") for o in out]

    def _invalid(self, reason: str) -> dict[str, float]:
        log.warning("hybrid reward: %s -> 0", reason)
        return {HYBRID: 0.0, **{c: 0.0 for c in COMPONENTS}, "invalid": 1.0}

    def _combine(self, traj: Trajectory, judged: dict[str, JudgeResult]) -> dict[str, float]:
        rule = score_rule(traj, self.cfg.rule)
        flat: dict[str, float] = {}
        comp: dict[str, float] = {}
        fallbacks = 0
        for c in ("align", "aes", "traj"):
            r = judged.get(c)
            if r is None:
                comp[c] = 0.0
                flat[f"{c}/skipped"] = 1.0
                continue
            comp[c] = _clip01(r.score)
            fallbacks += int(r.fallback)
            flat[f"{c}/fallback"] = float(r.fallback)
            flat[f"{c}/cached"] = float(r.cached)
            for k, v in r.details.items():
                flat[f"{c}/{k}"] = _finite(float(v)) if isinstance(v, (int, float)) else 0.0
        if self.cfg.aes_gate == "alignment" and traj.task.images and judged.get("aes") is not None and judged.get("align") is not None:
            # A good photo left alone (or mirrored by mistake) keeps its quality; only a correct edit earns it.
            flat["aes/raw"] = comp["aes"]
            comp["aes"] *= comp["align"]
        comp["rule"] = _finite(rule.r_rule)
        flat.update(rule.to_flat("rule"))
        flat.update(comp)
        if self.cfg.mode == "public_code":
            flat.update(self._public_code(traj, comp, rule))
        else:
            flat[HYBRID] = sum(self.weight(c) * comp[c] for c in COMPONENTS)
        flat["fallbacks"] = float(fallbacks)
        for k, v in list(flat.items()):  # a logger must never receive NaN or inf from us
            if not math.isfinite(v):
                log.warning("non-finite reward term %s=%r replaced by 0", k, v)
                flat[k] = 0.0
        return flat

    def _public_code(self, traj: Trajectory, comp: dict[str, float], rule: RuleBreakdown) -> dict[str, float]:
        pc, w = self.cfg.public_code, self.cfg.weights
        path = [t for t in traj.task.expected_tools if isinstance(t, str)]
        expected = set(path)
        called = {c.tool for c in rule.calls if c.name}
        coverage = pc.coverage_max * (len(expected & called) / len(expected)) if expected else 0.0
        n_exec = rule.n_executable
        e = len(path)
        if e > 1:
            depth_ratio = 0.15 * (n_exec >= 1) + 0.35 * (n_exec >= min(e, 2)) + 0.5 * min(n_exec, e) / e
            depth = pc.depth_max * depth_ratio
        else:
            depth = 0.0
        out_w = w.align + w.aes
        outcome_budget = min(1.0, out_w)
        outcome = outcome_budget * _clip01((w.align * comp["align"] + w.aes * comp["aes"]) / out_w) if out_w > 0 else 0.0
        proc_max = w.traj + pc.format_weight + pc.action_weight + pc.coverage_max + pc.depth_max
        proc_pos = w.traj * comp["traj"] + pc.format_weight * rule.r_format + pc.action_weight * rule.r_action + coverage + depth
        process = max(0.0, 1.0 - outcome_budget) * _clip01(proc_pos / proc_max) if proc_max > 0 else 0.0
        raw = outcome + process - self.cfg.rule.penalties.lam * rule.p_eff
        gate, reasons = 1.0, []
        if pc.fatal_gate:
            if expected and n_exec == 0:
                gate, reasons = 0.0, reasons + ["no_executable_tool_call"]
            # Image tasks: an expected tool that produces an image or a cut-out (not a mask, as SAM).
            image_tools = {t for t in expected if t in REGISTRY and REGISTRY[t].output in (OutputKind.IMAGE, OutputKind.RGBA)}
            if image_tools and traj.final_asset() is None:
                gate, reasons = 0.0, reasons + ["missing_final_image"]
        if reasons:
            log.info("public-code fatal gate on %s: %s", traj.task.id, ", ".join(reasons))
        return {
            HYBRID: gate * _clip01(raw),
            "public/outcome": outcome,
            "public/process": process,
            "public/coverage": coverage,
            "public/depth": depth,
            "public/raw": raw,
            "public/gate": gate,
        }

    # Memo: TRL calls every component function on the same batch.
    @staticmethod
    def _fingerprint(t: Trajectory) -> tuple:
        return (len(t.turns), t.stop_reason, len(t.assets))

    def _memo_get(self, t: Trajectory) -> dict[str, float] | None:
        with self._lock:
            hit = self._memo.get(id(t))
            if hit is not None and hit[0] is t and hit[1] == self._fingerprint(t):
                self._memo.move_to_end(id(t))
                return hit[2]
        return None

    def _memo_put(self, t: Trajectory, flat: dict[str, float]) -> None:
        with self._lock:
            self._memo[id(t)] = (t, self._fingerprint(t), flat)  # holding t keeps its id unique
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)

    def stats(self) -> dict[str, float]:
        return self.judge.stats()

    def close(self) -> None:
        self.judge.close()
