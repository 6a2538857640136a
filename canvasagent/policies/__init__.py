"""Policies: anything that turns the conversation so far into the next assistant reply."""

from canvasagent.policies.base import Policy
from canvasagent.policies.human import HumanPolicy
from canvasagent.policies.replay import ReplayPolicy, ScriptedPolicy

__all__ = ["Policy", "HumanPolicy", "ReplayPolicy", "ScriptedPolicy"]
