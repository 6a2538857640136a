"""The evaluation agent (Open Evaluation Agent style): plan from the question, probe with ground truth, answer."""

from canvasagent.evaluation.agent.loop import AgentConfig, EvaluationAgent, build_agent
from canvasagent.evaluation.agent.types import AgentResult, Evidence, Plan, Round

__all__ = ["AgentConfig", "AgentResult", "EvaluationAgent", "Evidence", "Plan", "Round", "build_agent"]
