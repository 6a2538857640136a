"""Rewards: the paper's rule reward, judges, and the hybrid reward (see docs in each module).

    from rewards import HybridReward, score_rule
    flat = HybridReward("paper").score(trajectory)   # {"total": ..., "rule/format/json": ..., ...}
"""

from rewards.config import RewardConfig, RuleConfig, load_reward_config
from rewards.rule import RuleBreakdown, RuleReward, score_rule

__all__ = [
    "HybridReward",
    "RewardConfig",
    "RuleBreakdown",
    "RuleConfig",
    "RuleReward",
    "load_reward_config",
    "reward_functions",
    "score_rule",
    "trl_reward_setup",
]


def __getattr__(name: str):
    # The hybrid pulls in the judges (OpenCV, scikit-image, httpx); import it only when asked.
    if name in ("HybridReward", "reward_functions", "trl_reward_setup"):
        from rewards import hybrid

        return getattr(hybrid, name)
    raise AttributeError(name)
