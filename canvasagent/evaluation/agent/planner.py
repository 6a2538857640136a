"""Planners: read the question into a `Plan`, choose each round's probes, write the summary.

`OfflinePlanner` parses the question against the registry's vocabulary (`vocab.py`) and follows
the search (`search.py`): the ends of the asked range, then bisection at the boundary.

`LLMPlanner` asks an OpenAI-compatible chat model (`canvasagent.core.llm_client`) for the plan
and each round's axis values, as JSON. A reply that fails the same vocabulary and axis checks is
replaced by the offline planner's choice for that step, and the fallback is recorded (`source`).
A stop is honoured only when the measured evidence is settled. The answer and boundary always
come from the measurements; the model's summary prose is followed by the measured summary.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Protocol

from canvasagent.evaluation.agent.probes import SUITES
from canvasagent.evaluation.agent.search import Decision
from canvasagent.evaluation.agent.types import Plan, Round
from canvasagent.evaluation.agent.vocab import PROPERTY_TOOL, parse_question, vocabulary

log = logging.getLogger(__name__)


class Planner(Protocol):
    name: str

    def plan(self, question: str, target: str) -> Plan: ...

    def next(self, plan: Plan, history: list[Round], decision: Decision) -> tuple[str, list[dict[str, Any]], str]: ...

    def summarize(self, question: str, plan: Plan, history: list[Round], answer: str, boundary: str | None, stop: str, table: list[dict[str, Any]]) -> str: ...


def _fmt_setting(row: dict[str, Any]) -> str:
    name = f"{row['value']:g}" if "value" in row else row["setting"]
    return f"{name}: {row['passed']}/{row['n']} passed ({row['status']})"


def observation_text(rnd: Round) -> str:
    """The evidence of one round as the text a planner reads."""
    lines = []
    for e in rnd.evidence:
        where = f"{e.value:g}" if e.value is not None else ", ".join(f"{k}={v}" for k, v in e.conditions.items() if k in ("angle", "bg", "direction", "scale", "position", "scene"))
        metrics = ", ".join(f"{k} {v:g}" for k, v in e.metrics.items())
        read = f", read {e.truth['read']!r} for {e.truth['word']!r}" if "read" in e.truth else ""
        err = f" — error: {e.error}" if e.error else ""
        lines.append(f"{e.probe_id} [{where or '–'}]: {'PASS' if e.passed else 'FAIL'} ({metrics}{read}){err}")
    return "\n".join(lines)


def measured_summary(question: str, plan: Plan, history: list[Round], answer: str, boundary: str | None, stop: str, table: list[dict[str, Any]]) -> str:
    n = sum(len(r.evidence) for r in history)
    head = f"Answer: {answer.upper() if answer in ('yes', 'no', 'partly') else answer}"
    if boundary:
        head += f" — {plan.target} {boundary}."
    lines = [head, "", f"Question: {question}", f"Target: {plan.target} ({plan.target_kind}); property: {plan.property}"
             + (f"; conditions: {plan.conditions}" if plan.conditions else "")
             + (f"; searched along {plan.axis}" + (f" over {plan.asked}" if plan.asked else " (whole axis)") if plan.axis else ""),
             f"Evidence: {n} probe(s) in {len(history)} round(s), each measured against its ground truth.", ""]
    if table:
        lines.append("Per " + ("value of " + plan.axis if plan.axis else "setting") + ":")
        lines += [f"- {_fmt_setting(r)}" for r in table]
    lines += ["", f"Why the evaluation stopped: {stop}"]
    return "\n".join(lines)


class OfflinePlanner:
    name = "offline"

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg

    def plan(self, question: str, target: str) -> Plan:
        return parse_question(question, target, self.cfg)

    def next(self, plan: Plan, history: list[Round], decision: Decision) -> tuple[str, list[dict[str, Any]], str]:
        if plan.axis:
            vals = ", ".join(f"{p['value']:g}" for p in decision.next)
            thought = (f"{decision.why.capitalize()}: probe {plan.axis} = {vals}." if history else
                       f"Probe the ends of the asked range first ({plan.axis} = {vals}); together they decide yes / no / partly.")
        else:
            what = SUITES[plan.property].description if plan.property else "the property"
            settings = f"each of {len(plan.strata)} settings" if plan.strata else "the asked setting"
            thought = (f"{decision.why.capitalize()}; probe more varied inputs." if history else
                       f"Probe varied generated inputs for {settings}; pass means {what}.")
        return thought, decision.next, self.name

    summarize = staticmethod(measured_summary)


PLAN_SYSTEM = (
    "You are the Plan Agent of an evaluation agent for image tools and policies. Read the user's question "
    "and return the test plan as ONE JSON object: {\"thought\": \"...\", \"property\": P, \"conditions\": {...}, "
    "\"axis\": A or null, \"asked\": [lo, hi] or null}. Use only the vocabulary given (properties, condition "
    "names, axes). `asked` is the range of the axis the question is about; null means the whole axis."
)
NEXT_SYSTEM = (
    "You are the Plan Agent of an evaluation agent. Given the plan and the measured evidence, choose the next "
    "axis values to probe (at most two, near the boundary) as JSON {\"thought\": \"...\", \"values\": [v, ...]}, "
    "or {\"thought\": \"...\", \"stop\": true} when the evidence settles the question."
)
SUMMARY_SYSTEM = (
    "You are the Plan Agent of an evaluation agent. Write the answer to the user's question for a person. "
    "Every claim must cite the measured numbers given; do not change the answer or the boundary."
)


def parse_json_object(text: str) -> dict[str, Any] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _num(v: Any) -> float | None:
    """A finite number, else None (JSON from a model may hold NaN or Infinity)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _colour(v: Any) -> list[int] | None:
    if isinstance(v, list) and len(v) == 3 and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in v):
        return list(v)
    return None


_CONDITION_CHECK = {
    "text_height": lambda v: _num(v) is not None and 1 <= v <= 256,
    "rotation": lambda v: _num(v) is not None and -360 <= v <= 360,
    "contrast": lambda v: _num(v) is not None and 0 <= v <= 255,
    "fg": lambda v: _colour(v) is not None,
    "bg": lambda v: _colour(v) is not None,
    "scale": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16,
    "direction": lambda v: v in ("horizontal", "vertical", "clockwise", "counter-clockwise"),
    "angle": lambda v: v in (45, 90, 180),
    "position": lambda v: isinstance(v, list) and len(v) == 2 and all(_num(c) is not None and 0 <= c <= 1000 for c in v),
}


def check_llm_plan(obj: dict[str, Any], offline: Plan) -> tuple[Plan | None, str]:
    """The model's plan if every field checks out against the vocabulary, else (None, why)."""
    prop = obj.get("property")
    if not isinstance(prop, str) or prop not in SUITES:
        return None, f"unknown property {str(prop)[:40]!r}"
    tool = PROPERTY_TOOL[prop]
    if offline.target_kind != "policy" and tool != offline.target and not (offline.target == "Rotate" and prop.startswith("rotation")):
        return None, f"property {prop!r} does not test {offline.target}"
    conds = obj.get("conditions") or {}
    if not isinstance(conds, dict):
        return None, "conditions is not an object"
    for k, v in conds.items():
        check = _CONDITION_CHECK.get(k)
        if check is None or not check(v):
            return None, f"condition {str(k)[:30]}={str(v)[:30]} is not in the vocabulary"
    axis = obj.get("axis")
    axes = SUITES[prop].axes
    if axis is not None and (not isinstance(axis, str) or axis not in axes):
        return None, f"axis {str(axis)[:30]!r} is not an axis of {prop}"
    asked = obj.get("asked")
    if asked is not None:
        if axis is None or not (isinstance(asked, list) and len(asked) == 2 and all(_num(a) is not None for a in asked)):
            return None, "asked must be [lo, hi] on the axis"
        asked = sorted(axes[axis].clip(a) for a in asked)
    if axes and axis is None:
        return None, f"{prop} is searched along an axis ({', '.join(axes)})"
    plan = Plan(offline.target, offline.target_kind, tool if offline.target_kind == "policy" else offline.tool, prop,
                dict(conds), axis, asked, [], dict(offline.settings), str(obj.get("thought", "")).strip() or offline.thought, "openai")
    if prop.startswith("rotation") and "angle" not in conds:
        plan.strata = [{"angle": a} for a in (45, 90, 180)]
    if prop == offline.property:
        plan.strata = plan.strata or list(offline.strata)
    return plan, ""


class LLMPlanner:
    """An OpenAI-compatible chat model as the planner, checked by and falling back to `fallback`."""

    name = "openai"

    def __init__(self, client: Any, fallback: OfflinePlanner):
        self.client = client  # canvasagent.core.llm_client.ChatClient
        self.fallback = fallback

    def _ask(self, system: str, user: str) -> tuple[dict[str, Any] | None, str, str]:
        try:
            text = self.client.complete([{"role": "system", "content": system}, {"role": "user", "content": user}])
        except Exception as e:
            return None, "", f"planner endpoint failed: {str(e)[:160]}"
        obj = parse_json_object(text)
        return obj, text, "" if obj is not None else "planner reply was not a JSON object"

    def plan(self, question: str, target: str) -> Plan:
        offline = self.fallback.plan(question, target)
        if offline.unsupported and offline.property is None and offline.target_kind != "policy":
            return offline
        user = f"Question: {question}\nTarget: {target}\nVocabulary: {json.dumps(vocabulary())}"
        obj, _, why = self._ask(PLAN_SYSTEM, user)
        if obj is not None:
            plan, why = check_llm_plan(obj, offline)
            if plan is not None:
                return plan
        log.warning("%s; using the offline plan", why)
        offline.source = f"offline-fallback ({why[:120]})"
        return offline

    def next(self, plan: Plan, history: list[Round], decision: Decision) -> tuple[str, list[dict[str, Any]], str]:
        thought, nxt, _ = self.fallback.next(plan, history, decision)
        if not plan.axis:  # set questions: the probes are fixed by the settings; the model is not asked
            return thought, nxt, self.fallback.name
        table = json.dumps(decision.table)
        user = (f"Plan: {json.dumps(plan.to_dict())}\nMeasured so far (per {plan.axis} value): {table}\n"
                f"Answer so far: {decision.answer}; the search suggests {nxt}.")
        obj, _, why = self._ask(NEXT_SYSTEM, user)
        if obj is not None:
            mthought = str(obj.get("thought", "")).strip()
            if obj.get("stop") is True:
                why = "planner stopped before the evidence was settled"
            else:
                axis = SUITES[plan.property or ""].axes[plan.axis]
                probed = {r["value"] for r in decision.table}
                vals = obj.get("values")
                ok = isinstance(vals, list) and 0 < len(vals) <= 2 and all(_num(v) is not None for v in vals)
                if ok:
                    chosen = [axis.clip(v) for v in vals]
                    if all(c not in probed for c in chosen) and len(set(chosen)) == len(chosen):
                        return mthought or thought, [{"value": c} for c in chosen], self.name
                    why = "planner chose values already probed"
                else:
                    why = "planner gave no usable values"
        log.warning("%s; using the search's choice for this round", why)
        return thought, nxt, f"offline-fallback ({why[:120]})"

    def summarize(self, question, plan, history, answer, boundary, stop, table) -> str:
        measured = measured_summary(question, plan, history, answer, boundary, stop, table)
        try:
            text = self.client.complete([{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": measured}]).strip()
        except Exception as e:
            log.warning("summary from the planner endpoint failed (%s); using the measured summary", e)
            return measured
        return (text + "\n\n---\n" + measured) if text else measured
