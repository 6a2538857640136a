"""Offline GPU check: one GRPO step of a random-weight policy shaped like Qwen3-VL-8B-Instruct, and
one call of a random-weight pipeline shaped like FLUX.2-klein 4B; prints peak GPU memory and time.

Nothing is downloaded. The shapes are written here from the public architecture numbers (the
models' config.json files as published); the weights are random, the tokenizer is the tiny
offline one (its ids fit inside the real vocabulary size), so the numbers are memory and time,
never quality. Run through `scripts/gpu_check.sh`.

    python -P scripts/gpu_check.py [--dry-run | --smoke] [--out DIR] [--json FILE] [--skip-policy] [--skip-flux]

`--dry-run` builds the configs and counts parameters on the meta device only: no GPU, no
weights, a few seconds. `--smoke` runs the whole check (the same code path: build, save, one GRPO
step, two pipeline calls) with the same architectures at toy sizes, on the GPU when there is one
and else on the CPU, in about a minute: what the test suite runs, so a GPU session finds a check
that works. On the CPU the memory reported is the process's peak RSS, not GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

for _k, _v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

# Qwen/Qwen3-VL-8B-Instruct config.json (text_config / vision_config).
QWEN3VL_8B_TEXT = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    "tie_word_embeddings": False,
}
QWEN3VL_8B_VISION = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "out_hidden_size": 4096, "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
}
# black-forest-labs/FLUX.2-klein-4B: transformer, Qwen3-4B text encoder (layers 9/18/27 read), VAE.
FLUX2_KLEIN_TRANSFORMER = {
    "patch_size": 1, "in_channels": 128, "num_layers": 5, "num_single_layers": 20, "attention_head_dim": 128, "num_attention_heads": 24,
    "joint_attention_dim": 3 * 2560, "timestep_guidance_channels": 256, "axes_dims_rope": (32, 32, 32, 32), "guidance_embeds": False,
}
QWEN3_4B_TEXT = {
    "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": True,
}
FLUX2_VAE = {"block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "latent_channels": 32, "norm_num_groups": 32}
FLUX2_OUT_LAYERS = (9, 18, 27)


@dataclass(frozen=True)
class Shapes:
    """What one check runs: the architectures' sizes and the GRPO step's and the pipeline call's
    settings. `FULL` is the published models; `SMOKE` the same architectures at toy sizes."""

    policy_text: dict[str, Any]
    policy_vision: dict[str, Any]
    flux_transformer: dict[str, Any]
    flux_text: dict[str, Any]
    flux_vae: dict[str, Any]
    flux_out_layers: tuple[int, ...]
    rollouts: int
    turns: int
    max_completion_length: int
    image_size: int
    flux_size: int
    flux_steps: int
    flux_max_sequence_length: int


FULL = Shapes(QWEN3VL_8B_TEXT, QWEN3VL_8B_VISION, FLUX2_KLEIN_TRANSFORMER, QWEN3_4B_TEXT, FLUX2_VAE, FLUX2_OUT_LAYERS,
              rollouts=8, turns=3, max_completion_length=512, image_size=512, flux_size=512, flux_steps=4,
              flux_max_sequence_length=512)
# Toy sizes keep every structural constraint of the full ones: rope sections sum to head_dim / 2,
# the deepstack indexes lie inside the vision depth, the transformer's joint attention takes the
# three text-encoder layers it reads, and VAE channels are multiples of its group norm.
SMOKE = Shapes(
    {**QWEN3VL_8B_TEXT, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "rope_parameters": {**QWEN3VL_8B_TEXT["rope_parameters"], "mrope_section": [4, 2, 2]}},
    {**QWEN3VL_8B_VISION, "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
     "num_position_embeddings": 256, "deepstack_visual_indexes": [0, 1]},
    {**FLUX2_KLEIN_TRANSFORMER, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 32, "num_attention_heads": 2,
     "joint_attention_dim": 3 * 64, "axes_dims_rope": (8, 8, 8, 8)},
    {**QWEN3_4B_TEXT, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16},
    {**FLUX2_VAE, "block_out_channels": (32, 32, 32, 32), "layers_per_block": 1},
    (0, 1, 2), rollouts=2, turns=2, max_completion_length=24, image_size=64, flux_size=64, flux_steps=1,
    flux_max_sequence_length=32,
)


def policy_config(tokenizer: Any, shapes: Shapes = FULL):
    """A Qwen3VLConfig with the shapes' sizes (Qwen3-VL-8B's by default) and the given tokenizer's
    special-token ids."""
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = {**shapes.policy_text, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None}
    return Qwen3VLConfig(
        text_config=text, vision_config=dict(shapes.policy_vision), image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )


def meta_params(build) -> int:
    import torch

    with torch.device("meta"):
        model = build()
    n = sum(p.numel() for p in model.parameters())
    # A tied output head counts once. Whether construction tied it on the meta device can depend
    # on what else the process has loaded, so count what the tied model holds.
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and inp is not None and out.weight is not inp.weight:
            n -= out.weight.numel()
    return n


def dry_run() -> dict[str, Any]:
    """Build every config and count parameters on the meta device (no weights, no GPU)."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import (
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3VLForConditionalGeneration,
    )

    from canvasagent.core.models.tiny import TinyQwen3VLSpec, build_tiny_tokenizer

    tok = build_tiny_tokenizer(TinyQwen3VLSpec())
    cfg = policy_config(tok)
    return {
        "policy_params": meta_params(lambda: Qwen3VLForConditionalGeneration(cfg)),
        "flux_transformer_params": meta_params(lambda: Flux2Transformer2DModel(**FLUX2_KLEIN_TRANSFORMER)),
        "flux_text_encoder_params": meta_params(lambda: Qwen3ForCausalLM(Qwen3Config(**QWEN3_4B_TEXT))),
        "flux_vae_params": meta_params(lambda: AutoencoderKLFlux2(**FLUX2_VAE)),
        "tokenizer_vocab": len(tok),
    }


def _is_gpu(device: str) -> bool:
    return device == "cuda"


def _sync(device: str) -> None:
    import torch

    if _is_gpu(device):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    import torch

    _sync(device)
    if _is_gpu(device):
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> dict[str, float]:
    """Peak GPU memory since the last reset; on the CPU the process's peak RSS (never reset)."""
    import resource

    import torch

    if _is_gpu(device):
        return {"peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
    return {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def build_policy_dir(out: Path, shapes: Shapes = FULL, device: str = "cuda") -> Path:
    """The tiny checkpoint's tokenizer/processor files with the shapes' config and random weights
    (bf16 on a GPU, float32 on the CPU)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from canvasagent.core.models import build_tiny_qwen3vl, load_processor

    build_tiny_qwen3vl(out)  # tokenizer, processor, chat template (its small weights are replaced below)
    tok = load_processor(str(out)).tokenizer
    for f in out.glob("*.safetensors*"):
        f.unlink()
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(policy_config(tok, shapes)).to(torch.bfloat16 if _is_gpu(device) else torch.float32)
    model.save_pretrained(out)
    marker = out / "canvasagent_tiny.json"
    meta = json.loads(marker.read_text()) if marker.exists() else {}
    label = "Qwen3-VL-8B" if shapes is FULL else "Qwen3-VL, toy sizes"
    marker.write_text(json.dumps({**meta, "shape": f"{label} (random weights, gpu_check)"}))
    del model
    if _is_gpu(device):
        torch.cuda.empty_cache()
    return out


def policy_step(work: Path, shapes: Shapes = FULL, device: str = "cuda") -> dict[str, Any]:
    """One GRPO step of the grpo_tiny_cpu preset's tiny tools and reward on the shapes' policy."""
    from canvasagent.training.config import TrainConfig
    from canvasagent.training.grpo import build_grpo_trainer

    t0 = time.perf_counter()
    model_dir = build_policy_dir(work / "policy_random", shapes, device)
    build_s = time.perf_counter() - t0
    gpu = _is_gpu(device)
    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(work / "grpo"), "model.name_or_path": str(model_dir), "run.init_from": None,
        "model.dtype": "bfloat16" if gpu else "float32", "optim.bf16": gpu, "optim.gradient_checkpointing": gpu,
        "optim.max_steps": 1, "optim.per_device_train_batch_size": shapes.rollouts, "grpo.num_generations": shapes.rollouts,
        "grpo.max_turns": shapes.turns, "grpo.max_completion_length": shapes.max_completion_length,
        "data.n_train": shapes.rollouts, "data.image_size": shapes.image_size,
        "optim.learning_rate": 1e-6, "run.save_steps": 0, "run.dump_every": 0,
    })
    trainer, _, _ = build_grpo_trainer(cfg)
    step_s: list[float] = []
    inner = trainer.training_step

    def timed(*a, **kw):
        _sync(device)
        t = time.perf_counter()
        out = inner(*a, **kw)
        _sync(device)
        step_s.append(time.perf_counter() - t)
        return out

    trainer.training_step = timed
    _reset_peak(device)
    trainer.train()
    return {"build_and_save_s": round(build_s, 1), "grpo_step_s": round(step_s[0], 2), **_peak(device),
            "rollouts": shapes.rollouts, "turns": shapes.turns, "max_completion_length": shapes.max_completion_length}


def flux_call(shapes: Shapes = FULL, device: str = "cuda") -> dict[str, Any]:
    """Two calls of a random-weight FLUX.2-klein pipeline of the shapes' sizes (the first carries
    kernel selection and allocator warm-up)."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    from toolserver.backends.tiny import _CHAT_TEMPLATE, _byte_level_vocab

    dtype = torch.bfloat16 if _is_gpu(device) else torch.float32
    tok = Qwen2Tokenizer(vocab=_byte_level_vocab(), merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    tok.chat_template = _CHAT_TEMPLATE
    with torch.device(device):
        pipe = Flux2KleinPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(), vae=AutoencoderKLFlux2(**shapes.flux_vae).to(dtype),
            text_encoder=Qwen3ForCausalLM(Qwen3Config(**shapes.flux_text)).to(dtype), tokenizer=tok,
            transformer=Flux2Transformer2DModel(**shapes.flux_transformer).to(dtype), is_distilled=True,
        )
    _reset_peak(device)
    out: dict[str, Any] = {}
    for label in ("first", "second"):
        t = time.perf_counter()
        image = pipe(prompt="a red bicycle", height=shapes.flux_size, width=shapes.flux_size, num_inference_steps=shapes.flux_steps,
                     guidance_scale=1.0, text_encoder_out_layers=shapes.flux_out_layers,
                     max_sequence_length=shapes.flux_max_sequence_length,
                     generator=torch.Generator(device).manual_seed(0)).images[0]
        _sync(device)
        out[f"{label}_call_s"] = round(time.perf_counter() - t, 2)
    out.update(_peak(device))
    out["size"], out["steps"] = f"{image.width}x{image.height}", shapes.flux_steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="configs and meta-device parameter counts only")
    mode.add_argument("--smoke", action="store_true", help="the whole check at toy sizes (GPU if any, else CPU)")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the report to this file")
    ap.add_argument("--skip-policy", action="store_true")
    ap.add_argument("--skip-flux", action="store_true")
    args = ap.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    if not (args.dry_run or args.smoke or gpu):
        print("gpu_check: no CUDA device; use --dry-run or --smoke on a machine without a GPU", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"shapes": dry_run()}
    if not args.dry_run:
        shapes, device = (SMOKE if args.smoke else FULL), ("cuda" if gpu else "cpu")
        report["device"] = torch.cuda.get_device_name(0) if gpu else "cpu"
        report["sizes"] = "toy (--smoke)" if args.smoke else "published"
        report["versions"] = _versions()
        work = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_"))
        work.mkdir(parents=True, exist_ok=True)
        for name, skip, check in (("flux2_klein_call", args.skip_flux, lambda: flux_call(shapes, device)),
                                  ("qwen3vl_8b_grpo_step", args.skip_policy, lambda: policy_step(work, shapes, device))):
            if not skip:
                report[name] = _measured(check, device)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(isinstance(v, dict) and "error" in v for v in report.values()) else 0


def _measured(check, device: str) -> dict[str, Any]:
    """The check's numbers; running out of GPU memory is a number too (the peak it reached), so it
    is reported and the next check still runs."""
    import torch

    try:
        return check()
    except torch.OutOfMemoryError as e:
        return {"error": f"out of GPU memory: {str(e).splitlines()[0]}", **_peak(device)}
    finally:
        if _is_gpu(device):
            torch.cuda.empty_cache()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "diffusers", "datasets", "accelerate", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


if __name__ == "__main__":
    sys.exit(main())
