"""The evaluation agent (Open Evaluation Agent style): plan, probe, sample, judge, observe, summarise."""

from canvasagent.evaluation.agent.loop import AgentConfig, EvaluationAgent, build_agent
from canvasagent.evaluation.agent.types import AgentResult, Aspect, PlanStep, Probe, Round, Sample

__all__ = ["AgentConfig", "AgentResult", "Aspect", "EvaluationAgent", "PlanStep", "Probe", "Round", "Sample", "build_agent"]
