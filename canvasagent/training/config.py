"""Training configs: one YAML file -> typed dataclasses for SFT and GRPO.

Only the knobs we set on purpose are typed here; anything else TRL accepts goes through
`trl_args`, so the YAML can reach every `SFTConfig`/`GRPOConfig` field without this file growing
a mirror of TRL's.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canvasagent.core.image_budget import check_budget
from canvasagent.training.sources import source_of
from toolserver.config import REPO_ROOT, find_config, from_dict, load_yaml

TINY = "tiny"  # model.name_or_path value meaning "build the tiny offline Qwen3-VL under the run dir"


@dataclass
class ModelSection:
    name_or_path: str = TINY  # hub id, local dir, or "tiny"
    dtype: str = "float32"  # bf16 on GPUs; float32 on CPU
    tiny_seed: int = 0  # weight seed when name_or_path == "tiny"
    tiny_size: str = "xs"  # a size in canvasagent.core.models.tiny.TINY_SIZES when name_or_path == "tiny"
    # SFT of the tiny model only: first this many text-only steps on the SFT rows' first exchange,
    # without the system turn (canvasagent.training.tiny_warmup); 0: none.
    tiny_warmup_steps: int = 0
    # The share of warmup examples drawn from SFT rows that state a box, each with a fresh box
    # (canvasagent.training.tiny_warmup.fresh_box); 0: rows drawn uniformly, as written.
    tiny_warmup_box_share: float = 0.0
    # The share drawn from SFT rows whose first call turns their picture upright by an angle the
    # instruction leaves unstated, each with a scene drawn afresh (tiny_warmup.fresh_scene); the
    # two shares add up to at most 1.
    tiny_warmup_angle_share: float = 0.0
    attn_implementation: str | None = None  # e.g. flash_attention_2 on GPUs


@dataclass
class DataSection:
    # A task source in canvasagent.training.sources.SOURCES (scripted, canvascraft, sharegpt,
    # rl-json, mixed, easel, easel-data); the source says what else it needs (path, easel section).
    format: str = "scripted"
    path: str | None = None
    n_train: int = 64  # scripted only
    seed: int = 0  # scripted task sampling
    max_steps_per_task: int = 2  # scripted chain length upper bound
    image_size: int = 64  # scripted input image side (px)
    # A file of task ids, one per line: GRPO trains on only those of the source's training tasks
    # (e.g. the ones the SFT policy does not yet solve: the pipeline's grpo_tasks: unsolved). None: all.
    task_ids: str | None = None


@dataclass
class ToolsSection:
    config: str = "offline"  # a configs/tools/<name>.yaml or a path (local | ray | http client)
    # Tools the policy sees (schemas in the prompt, env methods). Empty = the whole family.
    names: list[str] = field(default_factory=list)
    family: str = "canvasagent"


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # A tiny random lm_head under LoRA samples near-uniformly; training it makes the policy follow SFT.
    modules_to_save: list[str] = field(default_factory=list)


@dataclass
class OptimSection:
    learning_rate: float = 1e-4
    lr_scheduler_type: str = "constant"
    warmup: float = 0.0  # int: steps; float in [0, 1): fraction of the run (TrainingArguments.warmup_steps)
    weight_decay: float = 0.0
    max_steps: int = 10
    num_train_epochs: float = 1.0  # used only when max_steps <= 0
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    bf16: bool = False
    gradient_checkpointing: bool = False


CREDITS = ("sequence", "turn")  # GRPOSection.credit


@dataclass
class GRPOSection:
    num_generations: int = 4
    beta: float = 0.0  # KL coefficient
    max_turns: int = 4  # max_tool_calling_iterations and the episode turn budget
    max_completion_length: int = 256  # all turns, tool-result tokens included
    temperature: float = 1.0
    reward_preset: str = "paper"  # configs/reward/<preset>.yaml
    judge: str = "offline"  # offline | http | local
    use_vllm: bool = False
    vllm_mode: str = "colocate"  # colocate | server
    vllm_server_base_url: str | None = None
    loss_type: str | None = None  # None keeps TRL's default
    # group: standard GRPO (advantages / group std). none: no std scaling (Dr. GRPO), which keeps
    # tiny reward differences (a slightly longer reason) from being blown up to a full ±1 advantage.
    scale_rewards: str = "group"
    # The tool-collapse warning: at least this share of rollouts call no tool on this many logged
    # steps in a row (metrics.jsonl marks the step `tool_collapse: 1`; the report lists it).
    tool_collapse_share: float = 0.9
    tool_collapse_steps: int = 3
    # sequence: GRPO's one advantage per rollout. turn: each model turn against the group's
    # rollouts that reached that turn (canvasagent/training/turn_credit.py).
    credit: str = "sequence"
    # The first k rollouts of every group decoded greedily (every turn), so the advantage moves the
    # policy's argmax: what greedy evaluation runs. 0: every rollout sampled (TRL's GRPO).
    greedy_members: int = 0


@dataclass
class EaselSection:
    """The EASEL sources' settings (`data.format: easel` for GRPO, `easel-data` for SFT)."""

    categories: list[str] = field(default_factory=lambda: ["programmatic", "spatial", "abstract", "natural"])
    n_per_category: int = 4
    seed: int = 0  # task seeds are seed * 1000 + i, as in the reconstruction bench
    resolution: int | None = None  # canvas side; None = the category's (Table 1: 64 or 128)
    budget: int | None = None  # steps per episode; None = the category's (32-128)
    semantic: list[str] = field(default_factory=list)  # semantic task names (canvasagent.easel.semantic.TASK_NAMES)
    # Component -> weight of the GRPO reward (canvasagent.evaluation.scoring.EASEL_COMPONENTS):
    # easel_s (final S; semantic tasks: their score), format / action (R_format / R_action), rule (R_rule).
    reward_weights: dict[str, float] = field(default_factory=lambda: {"easel_s": 1.0, "format": 0.1, "action": 0.1})
    # Path coordinates the policy writes: unit ([0, 1], the registry's) or int1000 (integers 0-1000,
    # what EASEL-Data teaches). The prompt states it; the env rescales int1000 before validation.
    coords: str = "unit"
    # easel-data (SFT): which curriculum files of the build to read (C1 -> c1.jsonl, C2 -> c2.jsonl).
    curricula: list[str] = field(default_factory=lambda: ["C1", "C2"])


@dataclass
class RunSection:
    output_dir: str = "runs/train"
    seed: int = 0
    save_steps: int = 5
    save_total_limit: int | None = 2
    logging_steps: int = 1
    report_to: list[str] = field(default_factory=lambda: ["none"])  # tensorboard | wandb | none
    dump_every: int = 5  # trajectory dump (JSONL + images) every N steps; 0 = off
    resume: bool = False
    init_from: str | None = None  # GRPO: an SFT checkpoint dir (None = model.name_or_path, the RL-only ablation)
    accelerate_config: str | None = None  # launcher file; validated by --dry-run
    deepspeed: str | None = None  # a DeepSpeed JSON, passed to TRL as `deepspeed=`
    num_processes: int = 1  # training processes the launcher is expected to start


@dataclass
class TrainConfig:
    kind: str = "sft"  # sft | grpo
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    tools: ToolsSection = field(default_factory=ToolsSection)
    lora: LoraSection = field(default_factory=LoraSection)
    optim: OptimSection = field(default_factory=OptimSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    easel: EaselSection = field(default_factory=EaselSection)
    run: RunSection = field(default_factory=RunSection)
    max_length: int | None = None  # SFT truncation (None: never truncate; a cut image breaks the sample)
    # The image-context budget (canvasagent.core.image_budget): SFT rows, GRPO rollouts and the held-out
    # evaluation show the last N tool images, older ones as their asset-ID text. None: every image.
    image_budget: int | None = None
    trl_args: dict[str, Any] = field(default_factory=dict)  # any other SFTConfig/GRPOConfig field

    @classmethod
    def load(cls, name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        data = load_yaml(find_config(name_or_path, "train"))
        for dotted, value in (overrides or {}).items():
            _set_dotted(data, dotted, value)
        cfg = from_dict(cls, data)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError for a config no run can start from; the data source checks its own
        settings (`training.sources.Source.validate`)."""
        if self.kind not in ("sft", "grpo"):
            raise ValueError(f"kind must be sft or grpo, got {self.kind!r}")
        source = source_of(self)
        check_budget(self.image_budget)
        from canvasagent.core.models.tiny import TINY_SIZES

        if self.model.tiny_size not in TINY_SIZES:
            raise ValueError(f"model.tiny_size {self.model.tiny_size!r} unknown; known: {sorted(TINY_SIZES)}")
        w = self.model.tiny_warmup_steps
        if not isinstance(w, int) or isinstance(w, bool) or w < 0:
            raise ValueError(f"model.tiny_warmup_steps must be an integer >= 0, got {w!r}")
        if w and self.model.name_or_path != TINY:
            raise ValueError(f"model.tiny_warmup_steps warms up the tiny model only; name_or_path is {self.model.name_or_path!r}")
        for name in ("tiny_warmup_box_share", "tiny_warmup_angle_share"):
            b = getattr(self.model, name)
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b <= 1:
                raise ValueError(f"model.{name} must be a number in [0, 1], got {b!r}")
            if b and not w:
                raise ValueError(f"model.{name} needs model.tiny_warmup_steps > 0: it shapes the warmup")
        if self.model.tiny_warmup_box_share + self.model.tiny_warmup_angle_share > 1:
            raise ValueError("model.tiny_warmup_box_share and model.tiny_warmup_angle_share add up to more than 1")
        if self.easel.coords not in ("unit", "int1000"):
            raise ValueError(f"easel.coords must be unit or int1000, got {self.easel.coords!r}")
        source.validate(self)
        if self.kind == "grpo":
            g = self.grpo
            per_step = self.optim.per_device_train_batch_size * self.optim.gradient_accumulation_steps * max(
                1, self.run.num_processes
            )
            if per_step % g.num_generations:
                raise ValueError(
                    f"the global batch ({per_step}) must be a multiple of grpo.num_generations ({g.num_generations})"
                )
            if g.max_turns < 1:
                raise ValueError("grpo.max_turns must be >= 1")
            if not 0 < g.tool_collapse_share <= 1 or g.tool_collapse_steps < 1:
                raise ValueError("grpo.tool_collapse_share must be in (0, 1] and grpo.tool_collapse_steps >= 1")
            if g.credit not in CREDITS:
                raise ValueError(f"grpo.credit must be one of {CREDITS}, got {g.credit!r}")
            if not 0 <= g.greedy_members < g.num_generations:
                raise ValueError(f"grpo.greedy_members must be 0 to grpo.num_generations - 1 ({g.num_generations - 1}), got {g.greedy_members}")
            if g.greedy_members and g.use_vllm:
                raise ValueError("grpo.greedy_members needs the transformers generation backend, not vLLM")

    def resolve(self, path: str | None) -> Path | None:
        """Config paths are relative to the repository root (configs travel with the code)."""
        if path is None:
            return None
        p = Path(path)
        return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`optim.max_steps=3` -> ("optim.max_steps", 3); values are YAML scalars."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep:
        raise ValueError(f"override {text!r} is not KEY=VALUE")
    value = yaml.safe_load(raw)
    if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
        with suppress(ValueError):
            value = float(value)
    return key.strip(), value
