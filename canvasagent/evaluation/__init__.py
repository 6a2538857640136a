"""Evaluation: run policies over eval splits, the paper's metrics, reports and ablations."""

from canvasagent.evaluation.metrics import PAPER_METRICS, Summary, TaskResult, summarize
from canvasagent.evaluation.runner import EvalConfig, EvalRunner

__all__ = ["PAPER_METRICS", "EvalConfig", "EvalRunner", "Summary", "TaskResult", "summarize"]
