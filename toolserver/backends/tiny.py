"""Tiny random-weight checkpoints of the real Gen/Edit, Grounding and SAM architectures.

No weights for these models ship in a wheel, so offline machines (CI, laptops) use checkpoints
of the same classes with a few thousand random parameters, built here in seconds and loaded by
the same backends as the real models; their outputs are always flagged ``plumbing_only`` (the
marker file in each directory forces the flag).

Checkpoints are cached under ``$CANVASAGENT_CACHE/tiny`` (default ``~/.cache/canvasagent/tiny``)
as ``<kind>-v<version>-seed<seed>``, and are identical for a given seed.

    python -m toolserver.backends.tiny --out DIR    # build all three into DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import string
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from toolserver.backends._base import TINY_MARKER, parse_params, seeded_torch

log = logging.getLogger(__name__)

#: Bump when a builder changes, so stale caches are not reused.
TINY_VERSION = 2
DEFAULT_SEED = 0


def cache_root(cache_dir: str | Path | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("CANVASAGENT_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "canvasagent"
    return base / "tiny"


def _write_marker(out: Path, kind: str, seed: int, **extra: Any) -> None:
    meta = {"kind": kind, "version": TINY_VERSION, "seed": seed, "random_weights": True, **extra}
    (out / TINY_MARKER).write_text(json.dumps(meta, indent=2) + "\n")


# A minimal chat template: the klein pipeline wraps every prompt as a user turn before encoding.
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_level_vocab() -> dict[str, int]:
    """GPT-2 style byte-to-unicode alphabet: a byte-level BPE with no merges encodes any text."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))  # the other bytes take the next code points past 255, in order
    vocab = {chr(b if b in keep else next(shifted)): b for b in range(256)}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    return vocab


def build_tiny_flux2(out: Path, seed: int = DEFAULT_SEED) -> Path:
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    vocab = _byte_level_vocab()
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = _CHAT_TEMPLATE
    hidden = 16
    out_layers = (1, 2, 3)  # klein concatenates three text-encoder layers (9, 18, 27 in the 4B model)
    with seeded_torch(seed):
        text_encoder = Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=len(vocab),
                hidden_size=hidden,
                intermediate_size=32,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=8,
            )
        )
        transformer = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=hidden * len(out_layers),  # the concatenated layers
            timestep_guidance_channels=32,
            axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=False,
        )
        vae = AutoencoderKLFlux2(block_out_channels=(8, 16, 32, 32), layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=64)
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=False,
    )
    pipe.save_pretrained(out)
    _write_marker(out, "flux2", seed, pipeline_kwargs={"text_encoder_out_layers": list(out_layers), "max_sequence_length": 64})
    return out


_WORDS = (
    "a an the of and on in at with to left right top bottom red green blue white black yellow "
    "cat dog person man woman car sign text ball tree sky house bird cup bottle chair table logo"
).split()


def _wordpiece_vocab() -> dict[str, int]:
    """Special tokens, a few words, and single characters with their ## continuations, so any
    lower-case alphanumeric prompt tokenises without [UNK]."""
    chars = string.ascii_lowercase + string.digits
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.punctuation, *chars, *(f"##{c}" for c in chars), *_WORDS]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


def build_tiny_grounding(out: Path, seed: int = DEFAULT_SEED) -> Path:
    import transformers
    from transformers import BertConfig, BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection, GroundingDinoProcessor, SwinConfig

    # The PIL image processor needs no torchvision; naming it avoids transformers' fallback warning.
    image_processor_cls = getattr(transformers, "GroundingDinoImageProcessorPil", None) or transformers.GroundingDinoImageProcessor

    vocab = _wordpiece_vocab()
    # `vocab=` (a dict); `vocab_file=` is silently ignored and would make every token [UNK].
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=4, out_indices=[2, 3, 4])
    text = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    config = GroundingDinoConfig(
        backbone_config=backbone.to_dict(),
        text_config=text.to_dict(),
        d_model=32,  # GroupNorm(32, d_model) in the input projections needs a multiple of 32
        encoder_layers=1,
        decoder_layers=2,  # 1 trips a tied-weights check in transformers 5
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=10,
        encoder_n_points=2,
        decoder_n_points=2,
        max_text_len=32,
    )
    with seeded_torch(seed):
        model = GroundingDinoForObjectDetection(config)
    # 128 px: the coarsest feature level (stride 64) must keep >1 value per GroupNorm group.
    processor = GroundingDinoProcessor(image_processor=image_processor_cls(size={"shortest_edge": 128, "longest_edge": 192}), tokenizer=tokenizer)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    _write_marker(out, "grounding", seed)
    return out


def build_tiny_sam(out: Path, seed: int = DEFAULT_SEED) -> Path:
    import transformers
    from transformers import SamConfig, SamMaskDecoderConfig, SamModel, SamProcessor, SamPromptEncoderConfig, SamVisionConfig

    image_processor_cls = getattr(transformers, "SamImageProcessorPil", None) or transformers.SamImageProcessor

    frame, patch = 128, 16  # the real model: 1024 and 16
    vision = SamVisionConfig(
        hidden_size=32,
        output_channels=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=frame,
        patch_size=patch,
        mlp_dim=64,
        global_attn_indexes=[1],
        window_size=4,
        num_pos_feats=8,  # half the prompt encoder width, as in the real configs (128 for 256)
    )
    prompt = SamPromptEncoderConfig(hidden_size=16, image_size=frame, patch_size=patch, mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=32, iou_head_hidden_dim=16)
    config = SamConfig(vision_config=vision.to_dict(), prompt_encoder_config=prompt.to_dict(), mask_decoder_config=decoder.to_dict())
    with seeded_torch(seed):
        model = SamModel(config)
    low_res = frame // patch * 4  # the decoder upsamples the embedding grid 4x
    image_processor = image_processor_cls(
        size={"longest_edge": frame},
        pad_size={"height": frame, "width": frame},
        mask_size={"longest_edge": low_res},
        mask_pad_size={"height": low_res, "width": low_res},
    )
    model.save_pretrained(out)
    SamProcessor(image_processor=image_processor).save_pretrained(out)
    _write_marker(out, "sam", seed)
    return out


BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "flux2": build_tiny_flux2,
    "grounding": build_tiny_grounding,
    "sam": build_tiny_sam,
}


def tiny_dir(kind: str, cache_dir: str | Path | None = None, seed: int = DEFAULT_SEED) -> Path:
    return cache_root(cache_dir) / f"{kind}-v{TINY_VERSION}-seed{seed}"


def ensure_tiny(kind: str, cache_dir: str | Path | None = None, seed: int = DEFAULT_SEED) -> Path:
    """The cached tiny checkpoint of `kind`, built first if missing: in a temporary sibling
    renamed into place, so a concurrent or interrupted build never leaves a half-written one."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown tiny model {kind!r}; known: {sorted(BUILDERS)}")
    out = tiny_dir(kind, cache_dir, seed)
    if (out / TINY_MARKER).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    t0 = time.perf_counter()
    try:
        BUILDERS[kind](tmp, seed)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first (or a stale incomplete dir is in the way)
            if (out / TINY_MARKER).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.warning("built tiny random-weight %s checkpoint in %s (%.1f s): plumbing only", kind, out, time.perf_counter() - t0)
    return out


def _tiny_params(kind: str, params: dict[str, Any], cls: type, **defaults: Any) -> Any:
    params = dict(params)
    # `weights_seed` picks the random weights; `seed` stays the backend's own (FLUX sampling).
    path = ensure_tiny(kind, params.pop("cache_dir", None), int(params.pop("weights_seed", DEFAULT_SEED)))
    if "model" in params:
        raise ValueError(f"{kind}-tiny builds its own checkpoint; use the real backend to load {params['model']!r}")
    # The CPU unless asked otherwise: plumbing runs should not take GPU memory from real models.
    return parse_params(cls, {**defaults, "device": "cpu", **params, "model": str(path), "plumbing_only": True}, f"{kind}-tiny")


def grounding_tiny(**params: Any) -> Any:
    from toolserver.backends.grounding import GroundingBackend, GroundingParams

    return GroundingBackend(_tiny_params("grounding", params, GroundingParams))


def sam_tiny(**params: Any) -> Any:
    from toolserver.backends.sam import SamBackend, SamParams

    return SamBackend(_tiny_params("sam", params, SamParams))


def flux2_tiny(**params: Any) -> Any:
    from toolserver.backends.flux import FluxBackend, FluxParams

    # Small sizes by default: the outputs are noise anyway, and this keeps CPU tests fast.
    return FluxBackend(_tiny_params("flux2", params, FluxParams, width=64, height=64, max_pixels=128 * 128))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolserver.backends.tiny", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="cache directory (default: $CANVASAGENT_CACHE/tiny or ~/.cache/canvasagent/tiny)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--only", nargs="*", choices=sorted(BUILDERS), help="build only these")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for kind in args.only or sorted(BUILDERS):
        t0 = time.perf_counter()
        path = ensure_tiny(kind, args.out, args.seed)
        print(f"{kind}\t{path}\t{time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
