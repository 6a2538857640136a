"""Planners: decide the next sub-aspect or stop (with a justification), and write the summary.

`OfflinePlanner` is deterministic over a fixed aspect list: relevant aspects first (keyword
overlap with the question), stopping when the target produces nothing, when two rounds agree
within `stability_eps`, when the relevant aspects are covered, or at the round budget.
`OpenAIPlanner` asks an OpenAI-compatible chat model for the same JSON decisions; whenever its
reply is unusable it falls back to the offline planner for that step, and records that it did.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from canvasagent.evaluation.agent.evidence import key_score, verdict
from canvasagent.evaluation.agent.types import Aspect, PlanStep, Round

log = logging.getLogger(__name__)

_WORD = re.compile(r"[a-z]+")


@dataclass
class PlannerConfig:
    max_rounds: int = 4
    min_rounds: int = 2
    stability_eps: float = 0.05


class Planner(Protocol):
    name: str

    def propose(self, question: str, target: str, history: list[Round]) -> PlanStep: ...

    def summarize(self, question: str, target: str, history: list[Round], stop: PlanStep) -> str: ...


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def compatible(aspect: Aspect, target_tool: str | None) -> bool:
    if not aspect.targets:
        return True
    return (target_tool or "policy") in aspect.targets


def rank_aspects(question: str, aspects: list[Aspect], target_tool: str | None) -> list[Aspect]:
    """The aspects the question is about (keyword overlap), most relevant first; every aspect
    that applies to the target, in file order, when the question names none of them."""
    words = set(_WORD.findall(question.lower()))
    usable = [a for a in aspects if compatible(a, target_tool)]
    scored = [(-len(words & {k.lower() for k in a.keywords}), i, a) for i, a in enumerate(usable)]
    relevant = [t for t in scored if t[0] < 0]
    return [a for _, _, a in sorted(relevant or scored, key=lambda t: (t[0], t[1]))]


def evidence_summary(question: str, target: str, history: list[Round], stop: PlanStep) -> str:
    """A summary that only states what the rounds measured, each claim citing its round."""
    n_samples = sum(len(r.samples) for r in history)
    lines = [f"Question: {question}", f"Target: {target}. Evidence: {len(history)} round(s), {n_samples} sample(s).", ""]
    scored = []
    for r in history:
        s = key_score(r.stats)
        scored.append((s, r))
        what = "alignment" if "align" in r.stats else "overall reward"
        lines.append(f"- Round {r.index + 1}, {r.plan.sub_aspect}: {what} {_fmt(s)} over {int(r.stats['n'])} sample(s), "
                     f"{int(r.stats['n_ok'])} with an output → {verdict(s)}.")
    valid = [(s, r) for s, r in scored if s is not None]
    if valid:
        best = max(valid, key=lambda t: t[0])
        worst = min(valid, key=lambda t: t[0])
        overall = sum(s for s, _ in valid) / len(valid)
        text = f"Verdict: {verdict(overall)} overall (mean {overall:.2f} across {len(valid)} round(s))."
        if len(valid) > 1:
            text += (f" Strongest: {best[1].plan.sub_aspect} ({best[0]:.2f}, round {best[1].index + 1}); "
                     f"weakest: {worst[1].plan.sub_aspect} ({worst[0]:.2f}, round {worst[1].index + 1}).")
        lines += ["", text]
    else:
        lines += ["", "Verdict: no evidence could be collected."]
    lines.append(f"Why the evaluation stopped: {stop.justification}")
    return "\n".join(lines)


class OfflinePlanner:
    name = "offline"

    def __init__(self, aspects: list[Aspect], config: PlannerConfig | None = None, target_tool: str | None = None):
        self.aspects = aspects
        self.config = config or PlannerConfig()
        self.target_tool = target_tool

    def propose(self, question: str, target: str, history: list[Round]) -> PlanStep:
        cfg = self.config
        ranked = rank_aspects(question, self.aspects, self.target_tool)
        done = {r.plan.sub_aspect for r in history}
        if history:
            last = history[-1]
            if last.stats.get("n_ok", 0) == 0:
                errs = "; ".join(sorted({s.error for s in last.samples if s.error}))[:300]
                return PlanStep(f"Round {last.index + 1} produced no output.", stop=True,
                                justification=f"the target produced no output for any of the {int(last.stats['n'])} probes of round {last.index + 1} ({errs or 'no error given'}); further probes cannot add evidence",
                                source=self.name)
            if len(history) >= cfg.max_rounds:
                return PlanStep("The round budget is spent.", stop=True,
                                justification=f"the budget of {cfg.max_rounds} rounds is reached; the {len(history)} rounds above are the evidence",
                                source=self.name)
            if len(history) >= cfg.min_rounds:
                a, b = key_score(history[-2].stats), key_score(last.stats)
                if a is not None and b is not None and abs(a - b) < cfg.stability_eps:
                    return PlanStep("The last two rounds agree.", stop=True,
                                    justification=f"rounds {last.index} and {last.index + 1} scored {a:.2f} and {b:.2f} (within {cfg.stability_eps:.2f}), so another sub-aspect is unlikely to change the verdict",
                                    source=self.name)
        todo = [a for a in ranked if a.name not in done]
        if not todo:
            return PlanStep("Every relevant sub-aspect has been probed.", stop=True,
                            justification=f"all {len(ranked)} sub-aspect(s) of the question that apply to {target} were probed",
                            source=self.name)
        nxt = todo[0]
        if history:
            last = history[-1]
            s = key_score(last.stats)
            thought = (f"Round {last.index + 1} ({last.plan.sub_aspect}) scored {_fmt(s)} ({verdict(s)}). "
                       f"Next, probe '{nxt.name}': {nxt.description}")
        else:
            thought = f"Start with the sub-aspect closest to the question: '{nxt.name}': {nxt.description}"
        return PlanStep(thought, sub_aspect=nxt.name, source=self.name)

    def summarize(self, question: str, target: str, history: list[Round], stop: PlanStep) -> str:
        return evidence_summary(question, target, history, stop)


PLANNER_SYSTEM = (
    "You are the Plan Agent of an evaluation agent for visual generative models and tools. "
    "Given a user's evaluation question and the evidence so far, choose ONE next sub-aspect to probe, "
    "or stop when the evidence is sufficient to answer. Answer with one JSON object only: "
    '{"thought": "...", "sub_aspect": "..."} to continue, or '
    '{"thought": "...", "stop": true, "justification": "why the evidence suffices, citing rounds"} to stop.'
)
SUMMARY_SYSTEM = (
    "You are the Plan Agent of an evaluation agent. Write the final answer to the user's question. "
    "Every claim must cite the round and the measured numbers it rests on; say what was not measured."
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


def history_text(history: list[Round]) -> str:
    return "\n\n".join(f"[sub-aspect] {r.plan.sub_aspect}\n[observation]\n{r.observation}" for r in history) or "(no rounds yet)"


class OpenAIPlanner:
    """An OpenAI-compatible chat model as the planner, with the offline planner as its fallback."""

    name = "openai"

    def __init__(self, client: Any, fallback: OfflinePlanner, config: PlannerConfig | None = None):
        self.client = client  # canvasagent.policies.openai_compat.OpenAICompatPolicy (its .complete)
        self.fallback = fallback
        self.config = config or fallback.config

    def _ask(self, system: str, user: str) -> str:
        return self.client.complete([{"role": "system", "content": system}, {"role": "user", "content": user}])

    def propose(self, question: str, target: str, history: list[Round]) -> PlanStep:
        if len(history) >= self.config.max_rounds:  # the budget binds whatever the model says
            return self.fallback.propose(question, target, history)
        menu = "\n".join(f"- {a.name}: {a.description}" for a in rank_aspects(question, self.fallback.aspects, self.fallback.target_tool))
        user = (f"Question: {question}\nTarget: {target}\nRounds left: {self.config.max_rounds - len(history)}\n"
                f"Suggested sub-aspects (you may propose others):\n{menu}\n\nEvidence so far:\n{history_text(history)}")
        try:
            obj = parse_json_object(self._ask(PLANNER_SYSTEM, user))
        except Exception as e:
            obj, why = None, f"planner endpoint failed: {e}"
        else:
            why = "planner reply was not the JSON decision"
        if obj is not None:
            thought = str(obj.get("thought", "")).strip()
            if obj.get("stop") is True and str(obj.get("justification", "")).strip() and history:
                return PlanStep(thought, stop=True, justification=str(obj["justification"]).strip(), source=self.name)
            aspect = str(obj.get("sub_aspect", "")).strip()
            if aspect and not obj.get("stop"):
                return PlanStep(thought, sub_aspect=aspect, source=self.name)
            why = "planner stopped without evidence or justification" if obj.get("stop") else "planner named no sub-aspect"
        log.warning("%s; using the offline planner for this step", why)
        step = self.fallback.propose(question, target, history)
        step.source = f"offline-fallback ({why[:120]})"
        return step

    def summarize(self, question: str, target: str, history: list[Round], stop: PlanStep) -> str:
        evidence = evidence_summary(question, target, history, stop)
        user = f"Question: {question}\nTarget: {target}\n\nEvidence:\n{history_text(history)}\n\nMeasured summary:\n{evidence}"
        try:
            text = self._ask(SUMMARY_SYSTEM, user).strip()
        except Exception as e:
            log.warning("summary from the planner endpoint failed (%s); using the evidence summary", e)
            return evidence
        # The model's prose, followed by the measured table it must agree with.
        return (text + "\n\n---\n" + evidence) if text else evidence
