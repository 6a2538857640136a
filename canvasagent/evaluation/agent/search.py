"""Where to probe next, when the evidence settles the question, and what the answer is.

Two shapes of question:

* **Along an axis** (text height, contrast), assumed monotone in the axis' `easier` direction.
  The ends of the asked range are probed first: the easy end failing means "no", the hard end
  passing means "yes", anything else "partly". Then the boundary is bisected (geometric
  midpoints) between the hardest value that passes and the easiest that fails, until the two
  are within `boundary_ratio` (or one `resolution` step). When the boundary lies outside the
  asked range, up to `boundary_probes` values beyond it bracket it for the record. A pass on
  the hard side of a fail is a monotonicity violation: the answer is then "partly".
* **Over a set of settings** (`strata`: Rotate's angles, backgrounds; or a single setting), each
  probed in batches of `set_batch` varied inputs until `set_min` agree or `set_max` are spent.
  A setting passes when its pass rate is at least `yes_rate`, fails at most `no_rate`.

Every answer is computed from the pass/fail of measured probes; nothing here sees a model's opinion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from canvasagent.evaluation.agent.probes import Axis
from canvasagent.evaluation.agent.types import Evidence


@dataclass
class SearchConfig:
    samples_per_value: int = 2
    boundary_ratio: float = 1.25
    boundary_probes: int = 3  # axis values spent bracketing a boundary outside the asked range
    step_factor: float = 2.0  # how far each of those steps beyond the probed values
    set_batch: int = 2
    set_min: int = 4
    set_max: int = 8
    yes_rate: float = 0.9
    no_rate: float = 0.1
    max_probes: int = 24
    max_rounds: int = 8


@dataclass
class Decision:
    """The search's reading of the evidence so far."""

    answer: str | None  # yes | no | partly (None before any evidence)
    boundary: str | None
    next: list[dict[str, Any]] = field(default_factory=list)  # probes to run next: {"value": v} or {"stratum": i, "n": k}
    settled: bool = False
    why: str = ""
    table: list[dict[str, Any]] = field(default_factory=list)  # per value / per setting: n, passed, status


def _status(passes: list[bool], cfg: SearchConfig) -> str:
    rate = sum(passes) / len(passes)
    return "pass" if rate >= cfg.yes_rate else "fail" if rate <= cfg.no_rate else "mixed"


def _fmt(v: float) -> str:
    return f"{v:g}"


def axis_decision(axis: Axis, asked: list[float] | None, evidence: list[Evidence], cfg: SearchConfig) -> Decision:
    sign = 1.0 if axis.easier == "higher" else -1.0
    lo, hi = (axis.clip(asked[0]), axis.clip(asked[1])) if asked else (axis.lo, axis.hi)
    hard, easy = (lo, hi) if sign > 0 else (hi, lo)
    by: dict[float, list[bool]] = {}
    for e in evidence:
        if e.value is not None:
            by.setdefault(float(e.value), []).append(e.passed)
    status = {v: _status(p, cfg) for v, p in by.items()}
    table = [{"value": v, "n": len(by[v]), "passed": sum(by[v]), "status": status[v]} for v in sorted(by)]
    missing = [v for v in dict.fromkeys((hard, easy)) if v not in by]
    if missing:
        return Decision(None, None, [{"value": v} for v in missing], False, "the ends of the asked range are not probed yet", table)

    key = lambda v: sign * v
    passes = sorted((v for v, s in status.items() if s == "pass"), key=key)
    fails = sorted((v for v, s in status.items() if s == "fail"), key=key)
    violated = [(f, p) for f in fails for p in passes if key(p) < key(f)]
    if hard == easy:
        answer = {"pass": "yes", "fail": "no", "mixed": "partly"}[status[hard]]
    elif violated:
        answer = "partly"
    elif status[hard] == "pass":
        answer = "yes"
    elif status[easy] == "fail":
        answer = "no"
    else:
        answer = "partly"
    # The bracket: the hardest pass with no fail easier than it, and the easiest value harder than
    # it that does not pass (fail or mixed): the boundary lies between the two.
    p_star = next((p for p in passes if not any(key(f) > key(p) for f in fails)), None)
    nonpass = sorted((v for v, s in status.items() if s != "pass" and (p_star is None or key(v) < key(p_star))), key=key)
    f_star = nonpass[-1] if nonpass else None
    unit = f" {axis.unit}" if axis.unit else ""
    cmp_pass, cmp_fail = ("≥", "≤") if sign > 0 else ("≤", "≥")

    def at(v: float) -> str:
        return f"fails at {cmp_fail} {_fmt(v)}{unit}" if status[v] == "fail" else f"{sum(by[v])}/{len(by[v])} probes pass at {_fmt(v)}{unit}"

    if p_star is not None and f_star is not None:
        boundary = f"{axis.label} {cmp_pass} {_fmt(p_star)}{unit}, {at(f_star)}"
    elif p_star is not None:
        boundary = f"{axis.label} at every probed {axis.name} down to {_fmt(min(by, key=key))}{unit}"
    else:
        easiest = max(by, key=key)
        boundary = (f"fails at every probed {axis.name} up to {_fmt(easiest)}{unit}" if all(s == "fail" for s in status.values())
                    else f"no probed {axis.name} passes reliably (easiest probed: {at(easiest)})")
    if violated:
        f, p = violated[0]
        boundary += f" (not monotone: passes at {_fmt(p)}{unit} but fails at {_fmt(f)}{unit})"
        return Decision(answer, boundary, [], True, "the results are not monotone along the axis; more probes would not make them so", table)

    def bracketed(a: float, b: float) -> bool:
        a, b = sorted((a, b))
        return b - a <= axis.resolution or (a > 0 and b / a <= cfg.boundary_ratio)

    def midpoint(a: float, b: float) -> float | None:
        m = axis.clip(math.sqrt(a * b) if a > 0 and b > 0 else (a + b) / 2)
        return None if m in by else m

    in_range = lambda v: min(lo, hi) <= v <= max(lo, hi)
    extra = sum(1 for v in by if not in_range(v))
    if p_star is not None and f_star is not None:
        if bracketed(p_star, f_star):
            return Decision(answer, boundary, [], True, f"the boundary is bracketed between {_fmt(f_star)} and {_fmt(p_star)}{unit}", table)
        inside = in_range(p_star) and in_range(f_star)
        if not inside and extra >= cfg.boundary_probes:
            return Decision(answer, boundary, [], True, f"the answer is settled and {extra} probe value(s) beyond the asked range bracket the boundary", table)
        m = midpoint(p_star, f_star)
        if m is None:
            return Decision(answer, boundary, [], True, "no untested value lies between the bracket's ends", table)
        return Decision(answer, boundary, [{"value": m}], False, f"bisect between {_fmt(f_star)} and {_fmt(p_star)}{unit}", table)
    # one side of the boundary is not found yet: look beyond the asked range, within the budget
    if extra >= cfg.boundary_probes:
        return Decision(answer, boundary, [], True, f"the answer is settled; {extra} probe value(s) beyond the asked range did not find the boundary", table)
    # Step away from the probed values by a factor of `step_factor` per probe (the boundary is
    # usually near the asked range; the axis end would leave a wide bracket to bisect).
    f = cfg.step_factor
    if p_star is not None:  # everything probed passes: look harder
        v0 = min(by, key=key)
        v = axis.clip(v0 / f if sign > 0 else v0 * f)
    else:  # nothing passes: look easier
        v0 = max(by, key=key)
        v = axis.clip(v0 * f if sign > 0 else v0 / f)
    if v in by:
        return Decision(answer, boundary, [], True, "the answer is settled; the axis has no untested value beyond the asked range", table)
    return Decision(answer, boundary, [{"value": v}], False, f"the answer is settled; probe {_fmt(v)}{unit} to bracket the boundary", table)


def _stratum_name(s: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in s.items()) or "all probes"


def set_decision(strata: list[dict[str, Any]], evidence: list[Evidence], cfg: SearchConfig, stratum_of: list[int]) -> Decision:
    """`stratum_of[i]` is the stratum index of `evidence[i]`."""
    strata = strata or [{}]
    per: list[list[bool]] = [[] for _ in strata]
    for e, s in zip(evidence, stratum_of):
        per[s].append(e.passed)
    nxt, table = [], []
    for i, p in enumerate(per):
        agree = bool(p) and (all(p) or not any(p))
        done = (len(p) >= cfg.set_min and agree) or len(p) >= cfg.set_max
        if not done:
            nxt.append({"stratum": i, "n": min(cfg.set_batch, cfg.set_max - len(p))})
        table.append({"setting": _stratum_name(strata[i]), "n": len(p), "passed": sum(p),
                      "status": _status(p, cfg) if p else "unprobed", "settled": done})
    probed = [t for t in table if t["n"]]
    if not probed:
        return Decision(None, None, nxt, False, "nothing probed yet", table)
    statuses = {t["status"] for t in probed}
    answer = "yes" if statuses == {"pass"} else "no" if statuses == {"fail"} else "partly"
    boundary = None
    if len(strata) > 1 and answer == "partly":
        ok = [t["setting"] for t in probed if t["status"] == "pass"]
        bad = [t["setting"] for t in probed if t["status"] == "fail"]
        mixed = [t["setting"] for t in probed if t["status"] == "mixed"]
        parts = ([f"passes at {' and '.join(ok)}"] if ok else []) + ([f"fails at {' and '.join(bad)}"] if bad else []) + ([f"mixed at {' and '.join(mixed)}"] if mixed else [])
        boundary = "; ".join(parts)
    if nxt:
        return Decision(answer, boundary, nxt, False, f"{len(nxt)} setting(s) not settled (fewer than {cfg.set_min} agreeing probes)", table)
    n = sum(t["n"] for t in table)
    return Decision(answer, boundary, [], True, f"every setting is settled ({n} probes: each has {cfg.set_min} agreeing results or {cfg.set_max} probes)", table)


def grid_decision(axis: Axis, asked: list[float] | None, evidence: list[Evidence], cfg: SearchConfig) -> Decision:
    """The fixed grid's answer: every grid value inside the asked range passes (yes), fails (no),
    or neither (partly); the boundary text is the adaptive search's reading of the same evidence."""
    lo, hi = (axis.clip(asked[0]), axis.clip(asked[1])) if asked else (axis.lo, axis.hi)
    d = axis_decision(axis, asked, evidence, cfg)
    inside = [r for r in d.table if min(lo, hi) <= r["value"] <= max(lo, hi)]
    if not inside:  # the asked range falls between grid values: the nearest grid value stands in
        mid = (lo + hi) / 2
        inside = [min(d.table, key=lambda r: abs(r["value"] - mid))] if d.table else []
    statuses = {r["status"] for r in inside}
    answer = None if not inside else "yes" if statuses == {"pass"} else "no" if statuses == {"fail"} else "partly"
    return Decision(answer, d.boundary, [], True, f"the fixed grid of {len(d.table)} values is probed", d.table)


def grid_size(axis: Axis | None, strata: list[dict[str, Any]], cfg: SearchConfig) -> int:
    """Probes a fixed grid spends on the same question: every grid value, or `set_max` per setting."""
    if axis is not None:
        return len(axis.grid) * cfg.samples_per_value
    return max(1, len(strata)) * cfg.set_max
