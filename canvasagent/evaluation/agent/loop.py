"""The evaluation agent's loop: plan from the question, probe, measure, decide, answer.

1. The planner reads the question into a `Plan` (target, property, conditions, axis).
2. A target that cannot be evaluated here (no backend, nothing measurable) answers
   "cannot evaluate: …" at once, without a verdict.
3. Each round the planner picks probes (the search suggests them), the suite generates each
   probe with its ground truth, the target runs it, and the suite measures the output.
4. The search reads the measurements: the loop stops when they settle the question, or when
   the probe or round budget is spent (the answer then says it is not settled).

`out_dir` receives `rounds.json` after every round (an interrupted run keeps its evidence),
then `result.json` (top-level `answer`, `boundary`, per-probe `evidence`, `rounds`), `summary.md`
and `ea_cot.json` (the run as planner SFT records, see `export.py`); each probe's trajectory,
input, output and expected output are under `probes/`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canvasagent.core.trajectory import write_json_atomic
from canvasagent.evaluation.agent.export import ea_cot_records
from canvasagent.evaluation.agent.planner import (
    LLMPlanner,
    OfflinePlanner,
    Planner,
    observation_text,
)
from canvasagent.evaluation.agent.probes import SUITES
from canvasagent.evaluation.agent.search import (
    Decision,
    SearchConfig,
    axis_decision,
    grid_decision,
    grid_size,
    set_decision,
)
from canvasagent.evaluation.agent.target import NOT_CONFIGURED, Target
from canvasagent.evaluation.agent.types import AgentResult, Evidence, Plan, Round
from toolserver.config import find_config, from_dict, load_yaml

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    search: SearchConfig = field(default_factory=SearchConfig)
    terms: dict[str, Any] = field(default_factory=dict)  # qualitative words -> ranges / values
    dark_backgrounds: list[list[int]] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # per property (suite)
    seed: int = 0

    @classmethod
    def load(cls, name_or_path: str = "default") -> AgentConfig:
        """configs/eval_agent/<name>.yaml (or a path); unknown keys, top-level or under `search`,
        and `settings` for properties no suite tests are refused (ValueError)."""
        data = load_yaml(find_config(name_or_path, "eval_agent"))
        data["search"] = data.get("search") or {}
        cfg = from_dict(cls, data)
        unknown = set(cfg.settings or {}) - set(SUITES)
        if unknown:
            raise ValueError(f"eval_agent config: settings for unknown properties {sorted(unknown)}")
        return cfg

    def planner_view(self) -> dict[str, Any]:
        return {"terms": self.terms, "dark_backgrounds": self.dark_backgrounds}


class EvaluationAgent:
    def __init__(self, planner: Planner, target: Target, config: AgentConfig, out_dir: str | Path | None):
        self.planner = planner
        self.target = target
        self.config = config
        self.out = Path(out_dir) if out_dir is not None else None

    def run(self, question: str, fixed_grid: bool = False) -> AgentResult:
        """Answer `question`. `fixed_grid` replaces the adaptive search by the fixed grid (every
        grid value of the axis, or `set_max` probes per setting) in one round: the baseline the
        benchmark compares probe counts with."""
        plan = self.planner.plan(question, self.target.spec)
        reason = plan.unsupported or self.target.unavailable(plan)
        if reason:
            return self._finish(question, plan, [], f"cannot evaluate: {reason}", None, "nothing can be probed", [])
        assert plan.property is not None
        suite = SUITES[plan.property]
        settings = {"seed": self.config.seed, "words": self.config.words, **self.config.settings.get(plan.property, {}), **plan.settings}
        if suite.needs_ocr:
            settings["_ocr"] = self.target.ocr
        cfg = self.config.search
        axis = suite.axes.get(plan.axis) if plan.axis else None
        evidence: list[Evidence] = []
        stratum_of: list[int] = []
        rounds: list[Round] = []

        def decide() -> Decision:
            if axis is not None:
                return (grid_decision if fixed_grid and evidence else axis_decision)(axis, plan.asked, evidence, cfg)
            return set_decision(plan.strata, evidence, cfg, stratum_of)

        decision = decide()
        if fixed_grid:
            grid = ([{"value": v} for v in axis.grid] if axis is not None else
                    [{"stratum": i, "n": cfg.set_max} for i in range(max(1, len(plan.strata)))])
            decision = Decision(None, None, grid, False, "the fixed grid")
            cfg = SearchConfig(**{**cfg.__dict__, "max_probes": 10**6, "max_rounds": 1})
        stop = ""
        while True:
            if decision.settled:
                stop = decision.why
                break
            if len(evidence) >= cfg.max_probes or len(rounds) >= cfg.max_rounds:
                which = f"probe budget of {cfg.max_probes}" if len(evidence) >= cfg.max_probes else f"round budget of {cfg.max_rounds}"
                stop = f"the {which} is spent before the evidence settled ({decision.why}); the answer rests on what was measured"
                break
            if fixed_grid:
                thought, nxt, source = "Probe the whole fixed grid.", decision.next, "grid"
            else:
                thought, nxt, source = self.planner.next(plan, rounds, decision)
            rnd = Round(len(rounds), thought, {"axis": plan.axis, "probe": nxt}, source=source)
            for item in nxt:
                if axis is not None:
                    jobs = [({**plan.conditions, plan.axis: item["value"]}, k, item["value"], 0) for k in range(cfg.samples_per_value)]
                else:
                    i = int(item["stratum"])
                    done = sum(1 for s in stratum_of if s == i)
                    stratum = plan.strata[i] if plan.strata else {}
                    jobs = [({**plan.conditions, **stratum}, done + k, None, i) for k in range(int(item["n"]))]
                for cond, index, value, stratum_i in jobs:
                    if len(evidence) >= cfg.max_probes:
                        break
                    ev, fatal = self._probe(suite, cond, index, value, settings, f"r{rnd.index + 1}_p{len(evidence) + 1}")
                    if fatal:
                        rnd.evidence.append(ev)
                        rnd.observation = observation_text(rnd)
                        rounds.append(rnd)
                        return self._finish(question, plan, rounds, f"cannot evaluate: {fatal}", None, "the target cannot produce evidence", [])
                    evidence.append(ev)
                    stratum_of.append(stratum_i)
                    rnd.evidence.append(ev)
            rnd.observation = observation_text(rnd)
            rounds.append(rnd)
            self._save_rounds(question, plan, rounds)
            decision = decide()
            if fixed_grid:
                decision.settled = True
            log.info("round %d: %d probe(s); answer so far %s (%s)", rnd.index + 1, len(rnd.evidence), decision.answer, decision.why)
        answer = decision.answer or "cannot evaluate: no probe produced evidence"
        details = {"table": decision.table, "settled": decision.settled, "grid_probes": grid_size(axis, plan.strata, cfg)}
        return self._finish(question, plan, rounds, answer, decision.boundary, stop, decision.table, details)

    def _probe(self, suite: Any, cond: dict[str, Any], index: int, value: float | None, settings: dict[str, Any], pid: str) -> tuple[Evidence, str | None]:
        case = suite.make(cond, index, settings)
        pdir = self.out / "probes" if self.out is not None else None
        out = self.target.run(case, pid, pdir)
        fatal = None
        if out.error_code == NOT_CONFIGURED and self.target.tool is not None:
            fatal = out.error
        elif out.plumbing_only:
            fatal = f"{self.target.spec} answered with a random-weight (plumbing-only) backend; its outputs are no evidence"
        try:
            metrics, passed = suite.measure(case, out, settings)
        except Exception as e:  # a measurement failure is recorded as a failed probe, with its reason
            log.warning("measuring %s failed: %s", pid, e)
            metrics, passed, out.error = {}, False, out.error or f"measurement failed: {e}"
        saved_out = None
        inputs: list[str] = []
        if pdir is not None:
            d = pdir / pid
            d.mkdir(parents=True, exist_ok=True)
            for k, img in enumerate(case.images):
                img.save(d / f"input_{k + 1}.png")
                inputs.append(f"probes/{pid}/input_{k + 1}.png")
            if out.image is not None:
                out.image.save(d / "output.png")
                saved_out = f"probes/{pid}/output.png"
            if case.expected is not None:
                case.expected.save(d / "expected.png")
        return Evidence(pid, dict(cond), value, dict(case.truth), metrics, bool(passed), saved_out, inputs, out.error), fatal

    def _save_rounds(self, question: str, plan: Plan, rounds: list[Round]) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"question": question, "target": self.target.spec, "plan": plan.to_dict(),
                  "rounds": [r.to_dict() for r in rounds]}
        write_json_atomic(self.out / "rounds.json", record)

    def _finish(self, question: str, plan: Plan, rounds: list[Round], answer: str, boundary: str | None, stop: str,
                table: list[dict[str, Any]], details: dict[str, Any] | None = None) -> AgentResult:
        summary = self.planner.summarize(question, plan, rounds, answer, boundary, stop, table)
        n = sum(len(r.evidence) for r in rounds)
        result = AgentResult(question, self.target.spec, plan, rounds, answer, boundary, summary, stop, self.planner.name, n, details or {})
        if self.out is not None:
            self._write(result)
        return result

    def _write(self, result: AgentResult) -> None:
        assert self.out is not None
        self.out.mkdir(parents=True, exist_ok=True)
        self._save_rounds(result.question, result.plan, result.rounds)
        (self.out / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
        (self.out / "summary.md").write_text(summary_markdown(result))
        (self.out / "ea_cot.json").write_text(json.dumps(ea_cot_records(result), indent=1, ensure_ascii=False))

    def close(self) -> None:
        self.target.close()


def summary_markdown(result: AgentResult) -> str:
    lines = [f"# Evaluation: {result.question}", ""]
    if not result.summary.startswith("Answer:"):  # a model's prose comes first: put the measured answer on top
        lines += [f"**Answer: {result.answer}**" + (f" — {result.boundary}" if result.boundary else ""), ""]
    lines += [result.summary, ""]
    if result.evidence:
        lines += ["## Probes", "", "| probe | value / setting | ground truth | measured | pass |", "|---|---|---|---|---|"]
        for e in result.evidence:
            where = f"{e.value:g}" if e.value is not None else ", ".join(f"{k} {v}" for k, v in e.conditions.items())
            truth = ", ".join(f"{k} {v}" for k, v in e.truth.items() if k in ("word", "read", "cap_height_px", "rotation_deg", "contrast_ratio", "scene", "size", "angle", "bbox", "position"))
            metrics = ", ".join(f"{k} {v:g}" for k, v in e.metrics.items())
            lines.append(f"| {e.probe_id} | {where} | {truth} | {metrics}{' — ' + e.error if e.error else ''} | {'yes' if e.passed else 'no'} |")
    return "\n".join(lines) + "\n"


def build_agent(target: str, out_dir: str | Path | None, planner: str = "offline", config: str = "default", tools_config: str = "offline") -> EvaluationAgent:
    """`planner` is `offline` or `openai:MODEL@BASE_URL[?timeout_s=…&max_retries=…]`."""
    cfg = AgentConfig.load(config)
    tgt = Target(target, tools_config)
    offline = OfflinePlanner(cfg.planner_view())
    if planner == "offline":
        return EvaluationAgent(offline, tgt, cfg, out_dir)
    from canvasagent.core.llm_client import ChatClient, ChatEndpoint
    from canvasagent.policy_spec import PolicySpecError, parse_policy_spec

    spec = parse_policy_spec(planner)
    if spec.kind != "openai":
        raise PolicySpecError(f"the planner must be 'offline' or openai:MODEL@BASE_URL, got {planner!r}")
    allowed = {"timeout_s", "max_retries", "backoff_s", "api_key_env"}
    bad = set(spec.options) - allowed
    if bad:
        raise PolicySpecError(f"planner options {sorted(bad)} are unknown (known: {sorted(allowed)})")
    client = ChatClient(ChatEndpoint(spec.base_url or "", spec.target, **spec.options))
    return EvaluationAgent(LLMPlanner(client, offline), tgt, cfg, out_dir)


__all__ = ["AgentConfig", "EvaluationAgent", "build_agent", "summary_markdown"]
