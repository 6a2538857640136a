"""Rewards: every score the system uses, with the paper's formulas (section 3.3) as the default.

* `rewards.rule` — R_rule = 0.4·R_format + 0.6·R_action − λ·P_eff, from the trajectory's parser
  findings and the validator replayed over the asset state (Eq. 6). ~thousands of trajectories/s.
* `rewards.judges` — one `Judge` interface; `offline` (verifiable checks, a no-reference
  quality proxy, a deterministic process score), `http` (any OpenAI-compatible endpoint) and
  `local` (a Qwen-VL-family checkpoint through transformers); content-hash cache + bounded pool.
* `rewards.checks` — the vocabulary of verifiable alignment checks tasks carry (`Task.checks`).
* `rewards.hybrid` — R = 0.3·align + 0.1·aes + 0.2·traj + 0.4·rule (weights from YAML), a flat
  dict of every term (GRPO's TRL reward functions are `canvasagent.training.rewarding`'s).
* `rewards.config` — the dataclasses behind `configs/reward/{paper,no-outcome,no-process,public-code}.yaml`.

    from rewards import HybridReward, score_rule
    flat = HybridReward("paper").score(trajectory)   # {"hybrid": ..., "rule/format/json": ..., ...}
    score_rule(trajectory).r_rule

CLI: `canvasagent reward TRAJ [--preset NAME] [--judge offline|http|local] [--json]`, and
`canvasagent reward --batch DIR` (CSV + bar chart). Benchmark: `benchmarks/reward_throughput.py`.
"""

from rewards.config import RewardConfig, RuleConfig, load_reward_config
from rewards.rule import RuleBreakdown, score_rule

__all__ = [
    "HybridReward",
    "RewardConfig",
    "RuleBreakdown",
    "RuleConfig",
    "load_reward_config",
    "score_rule",
]


def __getattr__(name: str):
    # The hybrid pulls in the judges (OpenCV, scikit-image, httpx); import it only when asked.
    if name == "HybridReward":
        from rewards import hybrid

        return getattr(hybrid, name)
    raise AttributeError(name)
