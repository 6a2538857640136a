"""Offline judges that measure something, with no model endpoint.

* **alignment** — the task's verifiable checks (`rewards.checks`), each calibrated against doing
  nothing; OCR and grounding checks go through a real toolbox. The score is their weighted mean
  (partial credit); `details["passed"]` is 1 only when every verifiable check met its threshold
  (strict success). Tasks without a verifiable check get the configured `no_checks_score`,
  flagged as a fallback, and never pass.
* **aesthetic** — the no-reference quality proxy of `rewards.judges.iq`.
* **trajectory** — a deterministic process score (`score_process`):
  - *choice*: the fraction of distinct expected tools that ran successfully;
  - *order*: the fraction of applicable dependency rules satisfied, read from the registry's
    `ToolSpec.requires`/`produces` (the rules the system prompt states): each need of a call that
    only an earlier call can meet (SAM's box, Extract's mask, an object overlay's RGBA unless
    the content is an RGBA input) is satisfied when an earlier successful call produced that
    kind; with no input image, the first call must be one that needs no image and makes one;
  - *relevance*: the fraction of calls whose tool is in the expected set;
  - *flow*: with the task's reference solution (`meta["reference_calls"]`), the fraction of its
    asset arguments that the matching successful call (same tool and occurrence) passed the same
    asset ID; it catches a step applied to the input instead of the previous step's output. A
    valid alternative flow scores lower, so its weight is 0 in `paper` (reported only).
  Terms that do not apply (no expected set, no dependency rule triggered) drop out of the
  weighted mean; with none left, the score is 1 if any call succeeded, else 0.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, Iterator

from rewards.checks import CheckContext, all_passed, run_checks
from rewards.config import OfflineJudgeConfig
from rewards.judges.base import JudgeResult, TrajectoryView
from rewards.judges.iq import image_quality
from toolserver.registry import INSTRUCTION_KINDS, REGISTRY, Need, OutputKind
from toolserver.results import close_if_closable

log = logging.getLogger(__name__)


def _task_supplies(need: Need, value: Any, assets: Any, inputs: set[str]) -> bool:
    """Whether the task meets `need` itself: a value the instruction states, or an input asset of the needed kind as `value`."""
    if need.kind in INSTRUCTION_KINDS:
        return True
    return isinstance(value, str) and value in inputs and assets.get(value).kind is need.kind


def is_asset_id(value: Any, inputs: set[str]) -> bool:
    """An input ID, or an output ID `{Tool}_{k}` of a registry tool."""
    if not isinstance(value, str):
        return False
    tool, _, k = value.rpartition("_")
    return value in inputs or (tool in REGISTRY and k.isdigit())


def reference_arguments(calls: list[Any], reference: list[dict[str, Any]]) -> Iterator[tuple[str, str, Any, bool, Any]]:
    """(tool, argument, reference value, ran, passed value) for every argument of every reference
    call: `ran` if `calls` has a successful call of the same tool and occurrence, `passed` what it
    gave the argument (else None). Reference calls without a name or argument object are skipped."""
    done: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        if c.status == "ok":
            done.setdefault(c.tool, []).append(c.arguments if isinstance(c.arguments, dict) else {})
    seen: dict[str, int] = {}
    for ref in reference:
        name, args = ref.get("name"), ref.get("arguments")
        if not isinstance(name, str) or not isinstance(args, dict):
            continue
        k = seen[name] = seen.get(name, -1) + 1
        ran = done.get(name, [])
        for key, value in args.items():
            yield name, key, value, k < len(ran), ran[k].get(key) if k < len(ran) else None


def data_flow(calls: list[Any], reference: list[dict[str, Any]], inputs: set[str]) -> tuple[int, int]:
    """(matched, compared): the asset arguments of every reference call, and how many of them
    the successful call of the same tool and occurrence in `calls` passed the same ID (a
    reference call that never ran matches none: stopping early reproduces less of the flow)."""
    matched = compared = 0
    for _, _, value, ran, passed in reference_arguments(calls, reference):
        if is_asset_id(value, inputs):
            compared += 1
            matched += ran and passed == value
    return matched, compared


def score_process(view: TrajectoryView, weights: Any) -> tuple[float, dict[str, float], str]:
    """The deterministic trajectory score: (score, sub-terms, reason)."""
    traj = view.trajectory
    calls = view.calls
    expected = {t for t in view.expected_tools if isinstance(t, str)}
    ok_tools = [c.tool for c in calls if c.status == "ok"]
    details: dict[str, float] = {}
    if not calls:
        if expected:
            return 0.0, {"choice": 0.0, "order": 0.0, "relevance": 0.0}, "no_tool_call"
        return 1.0, {}, "no_tool_call_and_none_expected"

    terms: dict[str, float] = {}
    if expected:
        terms["choice"] = len(expected & set(ok_tools)) / len(expected)
        terms["relevance"] = sum(1 for c in calls if c.tool in expected) / len(calls)

    applicable = satisfied = 0
    produced: set[OutputKind] = set()
    inputs = set(traj.assets.input_ids())
    if not inputs:
        applicable += 1
        first = REGISTRY.get(calls[0].tool)
        satisfied += first is not None and OutputKind.IMAGE in first.produces and not first.needs()
    for c in calls:
        spec = REGISTRY.get(c.tool)
        args = c.arguments if isinstance(c.arguments, dict) else {}
        for need in spec.needs(args) if spec is not None else ():
            if need.kind is OutputKind.IMAGE or (need.from_task and _task_supplies(need, args.get(need.arg), traj.assets, inputs)):
                continue
            applicable += 1
            satisfied += need.kind in produced
        if c.status == "ok" and spec is not None:
            produced.update(spec.produces)
    if applicable:  # a vacuous rule set earns nothing: the term drops out instead of scoring 1
        terms["order"] = satisfied / applicable
    reference = traj.task.meta.get("reference_calls")
    if isinstance(reference, list):
        matched, compared = data_flow(calls, reference, inputs)
        if compared:  # reported always; scored only where the preset weighs it
            details["flow"] = matched / compared
            if getattr(weights, "flow", 0.0) > 0:
                terms["flow"] = details["flow"]
    if not terms:
        return float(bool(ok_tools)), details, "no_applicable_terms"

    wsum = sum(getattr(weights, k) for k in terms)
    score = sum(getattr(weights, k) * v for k, v in terms.items()) / wsum if wsum > 0 else 0.0
    details.update(terms)
    return score, details, ""


class OfflineJudge:
    name = "offline"

    def __init__(self, cfg: OfflineJudgeConfig | None = None, toolbox: Any | None = None):
        self.cfg = cfg or OfflineJudgeConfig()
        self._toolbox = toolbox
        self._toolbox_failed = False
        self._fingerprint = f"offline:{asdict(self.cfg)}"

    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def toolbox(self) -> Any | None:
        if self._toolbox is None and not self._toolbox_failed:
            try:
                from toolserver.client import make_toolbox

                self._toolbox = make_toolbox(self.cfg.tools)
            except Exception as e:
                self._toolbox_failed = True
                log.warning("offline judge: no toolbox from tools config %r (%s); OCR/grounding checks are unverifiable", self.cfg.tools, e)
        return self._toolbox

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        if aspect == "alignment":
            return self._alignment(view)
        if aspect == "aesthetic":
            return self._aesthetic(view)
        if aspect == "trajectory":
            score, details, reason = score_process(view, self.cfg.trajectory)
            return JudgeResult(score=score, details=details, reason=reason, judge=self.name)
        return JudgeResult.failed(self.cfg.no_checks_score, f"unknown aspect {aspect!r}", self.name)

    def _alignment(self, view: TrajectoryView) -> JudgeResult:
        checks = view.trajectory.task.checks
        needs_tools = any(isinstance(c, dict) and c.get("type") in ("ocr_contains", "grounding_finds") for c in checks)
        ctx = CheckContext(view.trajectory, self.toolbox if needs_tools else None)
        score, results = run_checks(ctx, list(checks))
        n_ver = sum(r.verifiable and r.weight > 0 for r in results)
        details: dict[str, float] = {
            "checks": float(len(results)),
            "verifiable": float(n_ver),
            # Strict success (every verifiable check met its threshold) and partial credit.
            "passed": float(all_passed(results)),
            "pass_rate": sum(r.passed for r in results if r.verifiable and r.weight > 0) / n_ver if n_ver else 0.0,
        }
        counts: dict[str, int] = {}
        for r in results:
            if r.verifiable:
                k = counts[r.type] = counts.get(r.type, 0) + 1
                details[f"check/{r.type}" + (f"_{k}" if k > 1 else "")] = float(r.score or 0.0)
        reasons = "; ".join(f"{r.type}: {r.reason}" for r in results if r.reason)
        if score is None:
            why = "no_checks" if not checks else "no_verifiable_checks"
            return JudgeResult(
                score=self.cfg.no_checks_score, ok=False, fallback=True, reason=f"{why}; {reasons}".strip("; "),
                details=details, judge=self.name,
            )
        return JudgeResult(score=score, details=details, reason=reasons, judge=self.name)

    def _aesthetic(self, view: TrajectoryView) -> JudgeResult:
        if view.final is None:
            return JudgeResult(score=0.0, reason="no_final_image", judge=self.name)
        if view.final.width == 0 or view.final.height == 0:
            return JudgeResult(score=0.0, reason="empty_final_image", judge=self.name)
        final = view.trajectory.final_asset()
        if final is not None and CheckContext(view.trajectory).tainted(final):
            return JudgeResult(score=0.0, reason="plumbing_only", judge=self.name)
        q = image_quality(view.final, self.cfg.aesthetic, self.cfg.analysis_side)
        return JudgeResult(score=q.score, details=dict(q.terms), judge=self.name)

    def close(self) -> None:
        close_if_closable(self._toolbox)
