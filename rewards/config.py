"""Reward configuration: typed dataclasses loaded from `configs/reward/<preset>.yaml`.

Every number of the reward lives here, so a reward ablation is a YAML file and nothing else.
The defaults are the paper's (section 3.3): R = 0.3·align + 0.1·aes + 0.2·traj + 0.4·rule,
R_rule = 0.4·R_format + 0.6·R_action − λ·P_eff and q_i = 0.25/0.25/0.20/0.20/0.10. The paper
gives no penalty scales; ours default to the public code's values (see reference.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolserver.config import find_config, from_dict, load_yaml


@dataclass
class FormatWeights:
    """Weights of the paper's five format checks (paper: equal; public code: 0.25/0.30/0.20/0.15/0.10)."""

    reason: float = 0.2
    json: float = 0.2
    one_call: float = 0.2
    terminate: float = 0.2
    clean: float = 0.2
    # Score of a trajectory with no reply text to format-check (calls via `Episode.call_tool`); the
    # reason is logged.
    unobserved_score: float = 0.0


@dataclass
class ActionWeights:
    """q_i = name·r_name + schema·r_schema + ref·r_ref + spec·r_spec + exec·r_exec (paper Eq. 4)."""

    name: float = 0.25
    schema: float = 0.25
    ref: float = 0.20
    spec: float = 0.20
    exec: float = 0.10
    no_calls_score: float = 0.0  # R_action with no parsed call (the mean over zero calls is undefined)


@dataclass
class PenaltyTerm:
    """One P_eff term: min(cap, scale · amount), where the amount is term specific."""

    scale: float = 0.1
    cap: float = 0.5

    def apply(self, amount: float) -> float:
        return min(self.cap, self.scale * amount) if amount > 0 else 0.0


@dataclass
class ErrorPenalty(PenaltyTerm):
    """Amount: the number of calls that failed (validation refused or the tool failed)."""


@dataclass
class RepeatPenalty(PenaltyTerm):
    """Amount: exact adjacent repeats + near_weight · near repeats (same tool, same inputs and
    text arguments, numeric arguments within `near_tolerance` on the 0-1000 scale)."""

    scale: float = 0.04
    cap: float = 0.12
    near_weight: float = 0.5
    near_tolerance: float = 50.0


@dataclass
class LengthPenalty(PenaltyTerm):
    """Amount: Σ over turns of max(0, reason_tokens − max_reason_tokens) / max_reason_tokens."""

    scale: float = 0.03
    cap: float = 0.10
    max_reason_tokens: int = 256


@dataclass
class CostPenalty(PenaltyTerm):
    """Amount: spending beyond the expected budget plus `grace`. With `weighted`, spending and
    budget are sums of the registry's per-tool `cost`; otherwise they are call counts. Tasks
    without an expected tool set use `default_budget` (None: no cost penalty)."""

    scale: float = 0.01
    cap: float = 0.05
    grace: float = 2.0
    weighted: bool = True
    default_budget: float | None = None


@dataclass
class MissPenalty(PenaltyTerm):
    """Amount: the fraction of distinct expected tools that never ran (successfully, with `require_success`)."""

    scale: float = 0.15
    cap: float = 0.15
    require_success: bool = True


@dataclass
class PenaltyConfig:
    lam: float = 1.0  # λ_eff in Eq. 2
    error: ErrorPenalty = field(default_factory=ErrorPenalty)
    repeat: RepeatPenalty = field(default_factory=RepeatPenalty)
    length: LengthPenalty = field(default_factory=LengthPenalty)
    cost: CostPenalty = field(default_factory=CostPenalty)
    miss: MissPenalty = field(default_factory=MissPenalty)


@dataclass
class RuleConfig:
    format_weight: float = 0.4
    action_weight: float = 0.6
    format: FormatWeights = field(default_factory=FormatWeights)
    action: ActionWeights = field(default_factory=ActionWeights)
    penalties: PenaltyConfig = field(default_factory=PenaltyConfig)
    clip: bool = True  # clip R_rule to [0, 1]; the unclipped value is reported as rule/raw


@dataclass
class HttpJudgeConfig:
    """An OpenAI-compatible chat-completions endpoint (vLLM, SGLang, DashScope, OpenAI, ...)."""

    # Its own port: 8000 is the toolserver's (configs/serve/*.yaml), so the two never collide.
    base_url: str = "http://127.0.0.1:8100/v1"
    model: str = "Qwen/Qwen3-VL-8B-Instruct"
    api_key: str | None = None
    api_key_env: str = "CANVASAGENT_JUDGE_API_KEY"
    base_url_env: str = "CANVASAGENT_JUDGE_BASE_URL"
    model_env: str = "CANVASAGENT_JUDGE_MODEL"
    timeout_s: float = 60.0
    max_retries: int = 2
    backoff_s: float = 1.0  # first retry waits this long, then doubles (with jitter)
    max_tokens: int = 128
    temperature: float = 0.0
    max_image_side: int = 768  # images are downscaled before upload
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class LocalJudgeConfig:
    """A Qwen-VL-family checkpoint run through transformers."""

    model: str = ""  # hub id or local directory
    dtype: str | None = None
    device: str = "cpu"
    # "logits": expected score from the next-token distribution over the digits 0-9 (always a
    # number, even for a weak model); "generate": decode a reply and parse it like the HTTP judge.
    mode: str = "logits"
    max_new_tokens: int = 32
    max_image_side: int = 448


@dataclass
class AestheticWeights:
    """Weights of the no-reference quality proxy's terms (see rewards/judges/iq.py)."""

    sharpness: float = 0.30
    exposure: float = 0.25
    colourfulness: float = 0.15
    noise: float = 0.15
    artefacts: float = 0.15


@dataclass
class TrajectoryWeights:
    """Weights of the deterministic trajectory scorer (see rewards/judges/offline.py)."""

    choice: float = 0.5  # expected tools that ran successfully
    order: float = 0.3  # dependency rules satisfied (Grounding→SAM→Extract, generation first, ...)
    relevance: float = 0.2  # calls that belong to the expected set
    flow: float = 0.0  # asset arguments that match the reference solution's data flow


@dataclass
class OfflineJudgeConfig:
    tools: str = "offline"  # the tools config whose toolbox runs OCR/Grounding checks
    no_checks_score: float = 0.5  # alignment when a task carries no verifiable check (counted)
    aesthetic: AestheticWeights = field(default_factory=AestheticWeights)
    trajectory: TrajectoryWeights = field(default_factory=TrajectoryWeights)
    analysis_side: int = 256  # images are analysed at most this large (speed)


@dataclass
class JudgeConfig:
    kind: str = "offline"  # offline | http | local
    fallback_score: float = 0.3  # used, counted and logged whenever a judge cannot score
    checks_weight: float = 0.5  # a model judge's alignment = w · verifiable checks + (1 − w) · model
    model_pass_threshold: float = 0.7  # success by the model's score, for tasks without a check
    # Past this share of a GRPO step's rollouts with a judge fallback, `on_excess_fallbacks`
    # applies: "drop" gives those rollouts zero advantage, "abort" stops the run.
    max_fallback_share: float = 0.2
    on_excess_fallbacks: str = "drop"
    cache_size: int = 4096  # content-hash cache entries (0 disables)
    max_workers: int = 4  # concurrent judge calls of a batch (a GRPO step: rollouts x aspects); 1: serial
    http: HttpJudgeConfig = field(default_factory=HttpJudgeConfig)
    local: LocalJudgeConfig = field(default_factory=LocalJudgeConfig)
    offline: OfflineJudgeConfig = field(default_factory=OfflineJudgeConfig)


@dataclass
class HybridWeights:
    align: float = 0.3
    aes: float = 0.1
    traj: float = 0.2
    rule: float = 0.4


AES_GATES = ("alignment", "none")


@dataclass
class PublicCodeConfig:
    """The public code's reward shape (preset `public-code`); used when mode = public_code.

    outcome = min(1, align+aes weights) · clip((w_align·A + w_aes·E) / (w_align + w_aes))
    process = (1 − outcome budget) · clip((w_traj·T + w_format·F + w_action·Act + coverage + depth) / max)
    total   = clip(outcome + process − λ·P_eff) · gate, gate = 0 on a fatal error.
    """

    format_weight: float = 0.15
    action_weight: float = 0.15
    coverage_max: float = 0.10  # bonus ∝ fraction of expected tools called
    depth_max: float = 0.22  # bonus for multi-step interaction depth
    fatal_gate: bool = True  # zero when no executable call, or no final image for an image task


@dataclass
class RewardConfig:
    name: str = "paper"
    mode: str = "paper"  # paper | public_code
    weights: HybridWeights = field(default_factory=HybridWeights)
    # "alignment": with an input image, aesthetics = quality proxy × alignment, so a no-op or a
    # wrong edit of a good photo earns none. "none": the raw quality of the final image.
    aes_gate: str = "alignment"
    rule: RuleConfig = field(default_factory=RuleConfig)
    judges: JudgeConfig = field(default_factory=JudgeConfig)
    public_code: PublicCodeConfig = field(default_factory=PublicCodeConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "paper") -> "RewardConfig":
        path = find_config(name_or_path, "reward")
        cfg = from_dict(cls, load_yaml(path))
        if cfg.mode not in ("paper", "public_code"):
            raise ValueError(f"{path}: mode must be paper or public_code, not {cfg.mode!r}")
        if cfg.aes_gate not in AES_GATES:
            raise ValueError(f"{path}: aes_gate must be one of {', '.join(AES_GATES)}, not {cfg.aes_gate!r}")
        if cfg.judges.on_excess_fallbacks not in ("drop", "abort"):
            raise ValueError(f"{path}: judges.on_excess_fallbacks must be drop or abort, not {cfg.judges.on_excess_fallbacks!r}")
        return cfg


def load_reward_config(name_or_path: str | Path | RewardConfig | None = None) -> RewardConfig:
    if isinstance(name_or_path, RewardConfig):
        return name_or_path
    return RewardConfig.load(name_or_path or "paper")
