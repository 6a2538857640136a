"""Policies: anything that turns the conversation so far into the next assistant reply."""

from canvasagent.core.policies.base import Policy
from canvasagent.core.policies.human import HumanPolicy
from canvasagent.core.policies.replay import ReplayPolicy, ScriptedPolicy

__all__ = ["Policy", "HumanPolicy", "ReplayPolicy", "ScriptedPolicy"]
