"""Offline GPU check: one GRPO step of a random-weight policy shaped like Qwen3-VL-8B-Instruct, and
one call of a random-weight pipeline shaped like FLUX.2-klein 4B; prints peak GPU memory and time.

Nothing is downloaded. The shapes are written here from the public architecture numbers (the
models' config.json files as published); the weights are random, the tokenizer is the tiny
offline one (its ids fit inside the real vocabulary size), so the numbers are memory and time,
never quality. Run through `scripts/gpu_check.sh`.

    python -P scripts/gpu_check.py [--dry-run] [--out DIR] [--skip-policy] [--skip-flux]

`--dry-run` builds the configs and counts parameters on the meta device only: no GPU, no
weights, a few seconds; it is what the test suite runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
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


def policy_config(tokenizer: Any):
    """A Qwen3VLConfig with Qwen3-VL-8B's shapes and the given tokenizer's special-token ids."""
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = {**QWEN3VL_8B_TEXT, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None}
    return Qwen3VLConfig(
        text_config=text, vision_config=dict(QWEN3VL_8B_VISION), image_token_id=ids["<|image_pad|>"],
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


def build_policy_dir(out: Path) -> Path:
    """The tiny checkpoint's tokenizer/processor files with an 8B-shaped config and random bf16 weights."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from canvasagent.core.models import build_tiny_qwen3vl, load_processor

    build_tiny_qwen3vl(out)  # tokenizer, processor, chat template (its small weights are replaced below)
    tok = load_processor(str(out)).tokenizer
    for f in out.glob("*.safetensors*"):
        f.unlink()
    with torch.device("cuda"):
        model = Qwen3VLForConditionalGeneration(policy_config(tok)).to(torch.bfloat16)
    model.save_pretrained(out)
    marker = out / "canvasagent_tiny.json"
    meta = json.loads(marker.read_text()) if marker.exists() else {}
    marker.write_text(json.dumps({**meta, "shape": "Qwen3-VL-8B (random weights, gpu_check)"}))
    del model
    torch.cuda.empty_cache()
    return out


def policy_step(work: Path) -> dict[str, Any]:
    import torch

    from canvasagent.training.config import TrainConfig
    from canvasagent.training.grpo import build_grpo_trainer

    t0 = time.perf_counter()
    model_dir = build_policy_dir(work / "qwen3vl_8b_random")
    build_s = time.perf_counter() - t0
    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(work / "grpo"), "model.name_or_path": str(model_dir), "run.init_from": None,
        "model.dtype": "bfloat16", "optim.bf16": True, "optim.gradient_checkpointing": True,
        "optim.max_steps": 1, "optim.per_device_train_batch_size": 8, "grpo.num_generations": 8,
        "grpo.max_turns": 3, "grpo.max_completion_length": 512, "data.n_train": 8, "data.image_size": 512,
        "optim.learning_rate": 1e-6, "run.save_steps": 0, "run.dump_every": 0,
    })
    trainer, _, _ = build_grpo_trainer(cfg)
    step_s: list[float] = []
    inner = trainer.training_step

    def timed(*a, **kw):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = inner(*a, **kw)
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t)
        return out

    trainer.training_step = timed
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    return {"build_and_save_s": round(build_s, 1), "grpo_step_s": round(step_s[0], 2),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "rollouts": 8, "turns": 3, "max_completion_length": 512}


def flux_call() -> dict[str, Any]:
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    from toolserver.backends.tiny import _CHAT_TEMPLATE, _byte_level_vocab

    tok = Qwen2Tokenizer(vocab=_byte_level_vocab(), merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    tok.chat_template = _CHAT_TEMPLATE
    with torch.device("cuda"):
        pipe = Flux2KleinPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(), vae=AutoencoderKLFlux2(**FLUX2_VAE).to(torch.bfloat16),
            text_encoder=Qwen3ForCausalLM(Qwen3Config(**QWEN3_4B_TEXT)).to(torch.bfloat16), tokenizer=tok,
            transformer=Flux2Transformer2DModel(**FLUX2_KLEIN_TRANSFORMER).to(torch.bfloat16), is_distilled=True,
        )
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = {}
    for label in ("first", "second"):  # the first call carries kernel selection and allocator warm-up
        t = time.perf_counter()
        pipe(prompt="a red bicycle", height=512, width=512, num_inference_steps=4, guidance_scale=1.0,
             text_encoder_out_layers=FLUX2_OUT_LAYERS, max_sequence_length=512, generator=torch.Generator("cuda").manual_seed(0))
        torch.cuda.synchronize()
        out[f"{label}_call_s"] = round(time.perf_counter() - t, 2)
    out["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    out["size"], out["steps"] = "512x512", 4
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="configs and meta-device parameter counts only")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--skip-policy", action="store_true")
    ap.add_argument("--skip-flux", action="store_true")
    args = ap.parse_args(argv)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; use --dry-run on a machine without a GPU", file=sys.stderr)
            return 2
    report: dict[str, Any] = {"shapes": dry_run()}
    if not args.dry_run:
        report["device"] = torch.cuda.get_device_name(0)
        work = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_"))
        work.mkdir(parents=True, exist_ok=True)
        if not args.skip_flux:
            report["flux2_klein_call"] = flux_call()
            torch.cuda.empty_cache()
        if not args.skip_policy:
            report["qwen3vl_8b_grpo_step"] = policy_step(work)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
