"""The evaluation agent's loop: propose a sub-aspect, write probes, sample the target, judge, observe.

Every round is written to `rounds.json` as soon as it ends (an interrupted evaluation keeps its
evidence); at the end come `result.json` (all rounds, the justified stop, the summary),
`summary.md` and `ea_cot.json` (the rounds as step-level SFT records, see `export.py`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from canvasagent.config import find_config, load_yaml
from canvasagent.evaluation.agent.evidence import observation_text, round_stats
from canvasagent.evaluation.agent.export import ea_cot_records
from canvasagent.evaluation.agent.planner import OfflinePlanner, OpenAIPlanner, Planner, PlannerConfig
from canvasagent.evaluation.agent.prompts import OpenAIPromptWriter, TemplatePromptWriter
from canvasagent.evaluation.agent.target import Target
from canvasagent.evaluation.agent.types import AgentResult, Aspect, PlanStep, Round

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    max_rounds: int = 4
    min_rounds: int = 2
    samples_per_round: int = 3
    stability_eps: float = 0.05
    aspects: list[Aspect] = field(default_factory=list)

    @classmethod
    def load(cls, name_or_path: str = "default") -> "AgentConfig":
        data = load_yaml(find_config(name_or_path, "eval_agent"))
        aspects = [Aspect.from_dict(a) for a in data.pop("aspects", [])]
        unknown = set(data) - {"max_rounds", "min_rounds", "samples_per_round", "stability_eps"}
        if unknown:
            raise ValueError(f"eval_agent config: unknown keys {sorted(unknown)}")
        return cls(aspects=aspects, **data)

    @property
    def planner_config(self) -> PlannerConfig:
        return PlannerConfig(self.max_rounds, self.min_rounds, self.stability_eps)


class EvaluationAgent:
    def __init__(self, planner: Planner, writer: Any, target: Target, scorer: Callable, config: AgentConfig, out_dir: str | Path):
        self.planner = planner
        self.writer = writer
        self.target = target
        self.scorer = scorer
        self.config = config
        self.out = Path(out_dir)

    def _save_rounds(self, question: str, rounds: list[Round]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "rounds.json.tmp"
        tmp.write_text(json.dumps({"question": question, "target": self.target.spec, "rounds": [r.to_dict() for r in rounds]}, indent=2, default=float))
        tmp.replace(self.out / "rounds.json")

    def run(self, question: str) -> AgentResult:
        rounds: list[Round] = []
        while True:
            step = self.planner.propose(question, self.target.spec, rounds)
            if step.stop:
                break
            if len(rounds) >= self.config.max_rounds:  # a hard cap, whatever the planner says
                step = PlanStep("Round budget reached.", stop=True, justification=f"the budget of {self.config.max_rounds} rounds is reached", source="budget")
                break
            probes = self.writer.write(question, step.sub_aspect or "", len(rounds))[: self.config.samples_per_round]
            log.info("round %d: %s (%d probes)", len(rounds) + 1, step.sub_aspect, len(probes))
            rnd = Round(len(rounds), step, probes)
            for k, probe in enumerate(probes):
                rnd.samples.append(self.target.sample(probe, f"r{rnd.index + 1}_s{k + 1}", self.scorer, self.out / "samples"))
            rnd.stats = round_stats(rnd.samples)
            rnd.observation = observation_text(rnd)
            rounds.append(rnd)
            self._save_rounds(question, rounds)
        summary = self.planner.summarize(question, self.target.spec, rounds, step)
        result = AgentResult(question, self.target.spec, rounds, step, summary, self.planner.name)
        self._write(result)
        return result

    def _write(self, result: AgentResult) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=float))
        (self.out / "summary.md").write_text(f"# Evaluation: {result.question}\n\n{result.summary}\n")
        (self.out / "ea_cot.json").write_text(json.dumps(ea_cot_records(result), indent=1, ensure_ascii=False))


def build_agent(
    target: str,
    out_dir: str | Path,
    planner: str = "offline",
    config: str = "default",
    judge: str = "offline",
    preset: str = "paper",
    tools_config: str = "offline",
    scorer: Callable | None = None,
) -> EvaluationAgent:
    """`planner` is `offline` or `openai:MODEL@BASE_URL` (the same spec syntax as policies)."""
    cfg = AgentConfig.load(config)
    tgt = Target(target, tools_config)
    offline = OfflinePlanner(cfg.aspects, cfg.planner_config, tgt.tool)
    templates = TemplatePromptWriter(cfg.aspects, cfg.samples_per_round)
    if planner == "offline":
        plan: Planner = offline
        writer: Any = templates
    else:
        from canvasagent.policies.spec import PolicyFactory, PolicySpecError

        factory = PolicyFactory(planner)
        if factory.spec.kind != "openai":
            raise PolicySpecError(f"the planner must be 'offline' or openai:MODEL@BASE_URL, got {planner!r}")
        client = factory.for_task()
        plan = OpenAIPlanner(client, offline, cfg.planner_config)
        writer = OpenAIPromptWriter(client, templates)
    if scorer is None:
        from canvasagent.evaluation.scoring import make_scorer

        scorer = make_scorer(judge, preset)
    return EvaluationAgent(plan, writer, tgt, scorer, cfg, out_dir)
