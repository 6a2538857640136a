"""Pieces SFT and GRPO share: model/processor resolution, the tool env, data, PEFT and TRL args."""

from __future__ import annotations

import json
import logging
import re
import shutil
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from canvasagent.training.config import TINY, TrainConfig
from canvasagent.training.env import load_tools_config, tool_functions, toolbox_factory  # noqa: F401 (callers import them from here)
from canvasagent.training.sources import source_of

log = logging.getLogger(__name__)


@dataclass
class Workspace:
    """Resolved paths and objects of one run (no weights)."""

    cfg: TrainConfig
    output_dir: Path
    model_path: str  # hub id or local dir of the weights to start from
    env_cls: type
    tool_fns: list[Callable]
    toolbox_factory: Callable[[], Any]


def output_dir(cfg: TrainConfig) -> Path:
    p = cfg.resolve(cfg.run.output_dir)
    assert p is not None
    return p


def _tiny_model_matches(out: Path, cfg: TrainConfig) -> bool:
    """Whether ``out`` holds the tiny model of this config's seed and size (a changed size rebuilds)."""
    from canvasagent.core.models.tiny import tiny_spec

    marker = out / "canvasagent_tiny.json"
    if not marker.exists():
        return False
    built = json.loads(marker.read_text(encoding="utf-8"))
    want = json.loads(json.dumps(asdict(tiny_spec(cfg.model.tiny_size))))
    return built.get("seed") == cfg.model.tiny_seed and built.get("spec") == want


def resolve_model_path(cfg: TrainConfig, build: bool = True) -> str:
    """Where the starting weights are: init_from (GRPO after SFT), a hub id/dir, or the tiny model."""
    ref = cfg.run.init_from if cfg.kind == "grpo" and cfg.run.init_from else cfg.model.name_or_path
    if ref == TINY:
        out = output_dir(cfg) / "tiny_base"
        if build and not _tiny_model_matches(out, cfg):
            from canvasagent.core.models.tiny import build_tiny_qwen3vl, tiny_spec

            build_tiny_qwen3vl(out, seed=cfg.model.tiny_seed, spec=tiny_spec(cfg.model.tiny_size))
        return str(out)
    p = cfg.resolve(ref)
    return str(p) if p is not None and p.exists() else ref


def workspace(cfg: TrainConfig, build_model: bool = True) -> Workspace:
    """The run's paths, its source's env class and toolbox factory (`sources.Source.env`) and tool functions."""
    env_cls, factory = source_of(cfg).env(cfg)
    return Workspace(
        cfg=cfg,
        output_dir=output_dir(cfg),
        model_path=resolve_model_path(cfg, build=build_model),
        env_cls=env_cls,
        # In the order GRPO's prompt lists them: TRL collects an environment's tools with
        # inspect.getmembers, i.e. sorted by name, and SFT's system text must be the same bytes.
        tool_fns=tool_functions(cfg.tools.names or None, cfg.tools.family),
        toolbox_factory=factory,
    )


def load_model_and_processor(ws: Workspace, padding_side: str | None = None, processor: Any = None):
    """The policy at `ws.model_path` and its processor (`processor`: one already loaded for it,
    used as it is, so `padding_side` applies only to a processor loaded here)."""
    from canvasagent.core.models import ensure_token_capacity, load_policy, load_processor

    kwargs = {"padding_side": padding_side} if padding_side else {}
    processor = processor if processor is not None else load_processor(ws.model_path, **kwargs)
    extra = {"attn_implementation": ws.cfg.model.attn_implementation} if ws.cfg.model.attn_implementation else {}
    model = load_policy(ws.model_path, dtype=ws.cfg.model.dtype, **extra)
    ensure_token_capacity(model, processor.tokenizer)  # real Qwen tokenizers gain <reason>, <Terminate>
    return model, processor


def peft_config(cfg: TrainConfig):
    if not cfg.lora.enabled:
        return None
    from peft import LoraConfig

    lo = cfg.lora
    return LoraConfig(
        r=lo.r,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=list(lo.target_modules),
        modules_to_save=list(lo.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )


def common_trl_args(cfg: TrainConfig, with_deepspeed: bool = True) -> dict[str, Any]:
    """TrainingArguments fields shared by SFTConfig and GRPOConfig. `with_deepspeed=False` (the dry
    run on a machine without the GPUs) leaves out DeepSpeed (it needs the package) and bf16 (a GPU),
    validated separately instead."""
    o, r = cfg.optim, cfg.run
    args: dict[str, Any] = dict(
        output_dir=str(output_dir(cfg)),
        max_steps=o.max_steps if o.max_steps > 0 else -1,
        num_train_epochs=o.num_train_epochs,
        per_device_train_batch_size=o.per_device_train_batch_size,
        gradient_accumulation_steps=o.gradient_accumulation_steps,
        learning_rate=o.learning_rate,
        lr_scheduler_type=o.lr_scheduler_type,
        warmup_steps=o.warmup,
        weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm,
        bf16=o.bf16 if with_deepspeed else False,
        gradient_checkpointing=o.gradient_checkpointing,
        seed=r.seed,
        data_seed=r.seed,
        logging_steps=r.logging_steps,
        save_strategy="steps" if r.save_steps > 0 else "no",
        save_steps=max(1, r.save_steps),
        save_total_limit=r.save_total_limit,
        report_to=list(r.report_to),
        remove_unused_columns=False,  # our transforms and the env need every column
        dataloader_num_workers=0,
    )
    if with_deepspeed and r.deepspeed:
        args["deepspeed"] = str(cfg.resolve(r.deepspeed))
    args.update(cfg.trl_args)
    return args


_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "global_step*")  # HF weights, or a DeepSpeed state folder


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is torn (header or tensor bytes cut short), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if size < 8 + n:
                return f"{path.name} is cut short inside its header"
            header = json.loads(fh.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"{path.name} has an unreadable header ({e})"
    if size < 8 + n + max(ends, default=0):
        return f"{path.name} is cut short ({size} bytes, its header needs {8 + n + max(ends)})"
    return None


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """Why a `checkpoint-N` folder cannot be resumed from, or None when it is complete.

    Complete means what the Trainer writes last, `trainer_state.json`, parses and names step N,
    model weights are there, and no weight, optimizer or RNG file is torn (safetensors checked
    against their header, torch files as zip archives). A folder a kill left mid-save fails.
    """
    ckpt = Path(ckpt)
    m = _CHECKPOINT_RE.match(ckpt.name)
    state_file = ckpt / "trainer_state.json"
    if not state_file.is_file():
        return "no trainer_state.json (the save did not finish)"
    try:
        state = json.loads(state_file.read_text())
        step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"trainer_state.json is unreadable ({e})"
    if m and step != int(m.group(1)):
        return f"trainer_state.json is for step {step}, not {m.group(1)}"
    if not any(any(ckpt.glob(g)) for g in _WEIGHT_GLOBS):
        return "no model weights"
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as e:
            return f"{index.name} is unreadable ({e})"
        missing = sorted(f for f in shards if not (ckpt / f).is_file())
        if missing:
            return f"weight shards missing: {', '.join(missing)}"
    for f in sorted(ckpt.rglob("*.safetensors")):
        if (why := _safetensors_problem(f)) is not None:
            return why
    for f in sorted([*ckpt.rglob("*.pt"), *ckpt.rglob("*.pth"), *ckpt.rglob("*.bin")]):
        if not zipfile.is_zipfile(f):  # torch.save writes zip archives; a torn one has no central directory
            return f"{f.relative_to(ckpt)} is torn (not a complete torch archive)"
    return None


def last_checkpoint(out: Path) -> str | None:
    """The newest complete `checkpoint-N` under `out` (None if there is none); newer folders that
    fail `checkpoint_problem` (a kill during a save leaves one) are skipped with a warning."""
    if not out.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in out.iterdir() if (m := _CHECKPOINT_RE.match(p.name)) and p.is_dir()), reverse=True
    )
    for _, ckpt in found:
        why = checkpoint_problem(ckpt)
        if why is None:
            return str(ckpt)
        log.warning("not resuming from %s: %s; trying an older checkpoint", ckpt, why)
    if found:
        log.warning("no complete checkpoint in %s: training starts from the beginning", out)
    return None


def checkpoint_state(ckpt: str | None) -> dict[str, Any] | None:
    """The trainer state saved in `ckpt` (None without one). Read it before training resumes:
    `save_total_limit` may delete that checkpoint while the run goes on."""
    return json.loads((Path(ckpt) / "trainer_state.json").read_text()) if ckpt else None


def whole_run_loss(state: Any, before: dict[str, Any] | None, run_loss: float) -> float:
    """The mean training loss over every step of a run, resumed or not; `before` is the
    `checkpoint_state` the run resumed from. The Trainer's `training_loss` covers only this call's
    steps; earlier ones come from the checkpoint's logged losses, each weighted by the steps it
    covers. Steps after the checkpoint's last loss log and before its save were never logged, so
    they are left out of the mean rather than guessed."""
    if not before:
        return run_loss
    start = int(before["global_step"])
    total, steps, prev = 0.0, 0, 0
    for h in before.get("log_history", []):
        if "loss" in h and "step" in h and prev < h["step"] <= start:
            total += float(h["loss"]) * (h["step"] - prev)
            steps += h["step"] - prev
            prev = h["step"]
    resumed = state.global_step - start
    if steps + resumed <= 0:
        return run_loss
    return (total + run_loss * resumed) / (steps + resumed)


def save_final(trainer: Any, processor: Any, src_model_path: str, dest: Path) -> Path:
    """Save a loadable policy dir (LoRA merged) with the processor, like the starting checkpoint."""
    dest.mkdir(parents=True, exist_ok=True)
    model = trainer.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(dest)
    processor.save_pretrained(dest)
    src = Path(src_model_path)
    # The image-only processor does not write the video config; keep the folder standard.
    for name in ("video_preprocessor_config.json", "chat_template.jinja"):
        if (src / name).exists() and not (dest / name).exists():
            shutil.copy(src / name, dest / name)
    (dest / "canvasagent_train.json").write_text(json.dumps({"from": src_model_path, "step": trainer.state.global_step}))
    return dest


def validate_launcher(cfg: TrainConfig) -> dict[str, Any]:
    """Check the accelerate/DeepSpeed files a config names (used by --dry-run)."""
    import yaml

    report: dict[str, Any] = {}
    if cfg.run.deepspeed:
        p = cfg.resolve(cfg.run.deepspeed)
        if p is None or not p.exists():
            raise FileNotFoundError(f"run.deepspeed: {cfg.run.deepspeed} not found")
        ds = json.loads(p.read_text())
        stage = ds.get("zero_optimization", {}).get("stage")
        if stage not in (2, 3):
            raise ValueError(f"{p}: expected ZeRO stage 2 or 3, got {stage}")
        report["deepspeed"] = {"file": str(p), "zero_stage": stage}
    if cfg.run.accelerate_config:
        p = cfg.resolve(cfg.run.accelerate_config)
        if p is None or not p.exists():
            raise FileNotFoundError(f"run.accelerate_config: {cfg.run.accelerate_config} not found")
        acc = yaml.safe_load(p.read_text())
        n = int(acc.get("num_processes", 1))
        if n != cfg.run.num_processes:
            raise ValueError(f"{p}: num_processes={n} but run.num_processes={cfg.run.num_processes}")
        ds_file = (acc.get("deepspeed_config") or {}).get("deepspeed_config_file")
        if ds_file and not (cfg.resolve(ds_file) or Path(ds_file)).exists():
            raise FileNotFoundError(f"{p}: deepspeed_config_file {ds_file} not found")
        report["accelerate"] = {"file": str(p), "num_processes": n, "distributed_type": acc.get("distributed_type")}
    return report
