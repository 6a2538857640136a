"""Build a tiny random-weight Qwen3-VL checkpoint fully offline.

The result is laid out like a hub checkpoint (``config.json``, ``model.safetensors``,
``generation_config.json``, tokenizer files, ``chat_template.jinja``, image/video processor
configs), so :func:`canvasagent.core.models.load_policy` / :func:`load_processor` load it through the
same code as ``Qwen/Qwen3-VL-8B-Instruct``. It exists so tests and the CPU default pipeline run
without network access and in seconds.

Design choices (see ``../shared/notes/trl-spike/FINDINGS.md``):

* Qwen3-VL, because TRL 1.16 parses tool calls only for the qwen3_vl / qwen3_5 chat templates.
* The chat template is TRL's shipped ``qwen3_vl.jinja``, byte-identical: TRL recognises templates
  by exact string (tool-call parsing, and the swap to its training template for assistant masks).
* The tokenizer is a byte-level BPE trained here on protocol-shaped text, so that tool calls and
  JSON arguments take few tokens (short sequences = fast CPU training), wrapped as
  ``Qwen2Tokenizer`` so ``AutoTokenizer`` resolves the same class as for real Qwen checkpoints.
* The tokenizer does not depend on the seed: datasets tokenized for one tiny model remain valid
  for another. The seed only drives the weights.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

from canvasagent.core.models.special_tokens import (
    EOS_TOKEN,
    PAD_TOKEN,
    QWEN_SPECIAL_TOKENS,
    non_special_added_tokens,
)

logger = logging.getLogger(__name__)

# Generic words for free-text arguments and reasons (instructions, object names, colours...).
_WORDS = (
    "the a an of to in on at and or with from by is are be this that it its into onto over under "
    "image picture photo canvas asset tool call reason response result output input edit generate "
    "crop rotate flip mirror horizontal vertical left right top bottom center upper lower corner "
    "red green blue yellow black white gray orange purple pink brown dark light bright "
    "cat dog car tree house person sky sun flower table cup book sign logo text word letter "
    "object region area mask segment box boundary background foreground overlay paste extract "
    "detect find locate ground read recognize upscale enhance resolution super stroke brush draw "
    "undo submit finish done terminate stop first then next finally because so need should will "
    "Make Add Remove Replace Change Put Create Draw Cut Move Turn Rotate Crop Flip Read "
    "error invalid missing unknown failed success ok"
).split()
@dataclass(frozen=True)
class TinyQwen3VLSpec:
    """Sizes of the tiny model. Defaults give ~0.4M parameters and build in seconds on one core."""

    bpe_vocab_size: int = 4096  # BPE target before added tokens; the trainer may stop earlier
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    # Qwen3-VL's interleaved M-RoPE splits head_dim/2 frequencies over (t, h, w).
    mrope_section: tuple[int, int, int] = (4, 2, 2)
    rope_theta: float = 5e5
    max_position_embeddings: int = 4096
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    # Learned vision position grid (8x8), bilinearly interpolated for other grids.
    vision_num_position_embeddings: int = 64
    deepstack_visual_indexes: tuple[int, ...] = (0,)
    patch_size: int = 16  # Qwen3-VL's patch size
    temporal_patch_size: int = 2
    merge_size: int = 2
    # Resize bounds: 32x32 px (1 visual token) to 128x128 px (8x8 patches = 16 visual tokens).
    min_pixels: int = 32 * 32
    max_pixels: int = 128 * 128
    model_max_length: int = 4096
    extra_corpus: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if sum(self.mrope_section) * 2 != self.head_dim:
            raise ValueError(f"sum(mrope_section)*2 must equal head_dim, got {self.mrope_section} / {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")


# Named sizes for ``model.tiny_size``; all share the tokenizer, so a dataset tokenized for one size
# stays valid for another. "xs" (~0.4M parameters) is the CPU default; "s" (~1.6M) is for the GRPO
# testbed, where instructions vary and chains are longer.
TINY_SIZES: dict[str, dict] = {
    "xs": {},
    "s": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mrope_section": (8, 4, 4),
        "vision_hidden_size": 64,
        "vision_intermediate_size": 128,
    },
}


def tiny_spec(size: str = "xs") -> TinyQwen3VLSpec:
    """The spec of a named tiny size; refuses an unknown name with the known ones."""
    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; known: {sorted(TINY_SIZES)}")
    return TinyQwen3VLSpec(**TINY_SIZES[size])


def _arg_value(arg, rng: random.Random, assets: list[str]):
    """A plausible value for a registry argument, in the shapes the policy will emit."""
    from toolserver.registry import ArgType

    if arg.type is ArgType.ASSET:
        return rng.choice(assets)
    if arg.type is ArgType.BBOX:
        box = sorted(rng.sample(range(0, 1001), 4))
        return [box[0], box[1], box[2], box[3]] if rng.random() < 0.7 else str([box[0], box[1], box[2], box[3]])
    if arg.type is ArgType.POSITION:
        return [rng.randint(0, 1000), rng.randint(0, 1000)]
    if arg.type is ArgType.CHOICE and arg.choices:
        return rng.choice(list(arg.choices))
    if arg.type is ArgType.UNIT:
        return round(rng.random(), rng.choice((1, 2)))
    return " ".join(rng.choices(_WORDS, k=rng.randint(2, 10)))


def protocol_corpus(extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Deterministic training text for the tiny tokenizer, generated from the live protocol.
    It is rendered from the tool registry and :mod:`canvasagent.core.protocol` (system prompts, tool
    schemas, well-formed replies, tool observations) plus the chat template's own text, so the BPE
    learns merges for exactly what training sequences contain; this keeps them short on CPU."""
    from canvasagent.core import protocol
    from toolserver.registry import openai_schemas, tools

    rng = random.Random(20240607)  # fixed: the tokenizer must not depend on the model seed
    families = sorted({t.family for t in tools(None)})
    # System prompts and schemas appear in every training sample: repeat them so all their
    # frequent pairs get merged (BPE cannot merge across pre-tokens, so this reaches the floor).
    for _ in range(8):
        yield qwen3_vl_chat_template()
        for family in families:
            yield protocol.render_system_prompt(family)
            yield protocol.render_system_prompt(family, include_tools=False)
            for schema in openai_schemas(family):
                yield json.dumps(schema, ensure_ascii=False)  # the chat template's `tojson` layout
    all_tools = tools(None)
    for i in range(1200):
        spec = all_tools[i % len(all_tools)]
        assets = [f"img_{k}" for k in range(1, rng.randint(2, 4))]
        assets += [f"{t.name}_{rng.randint(0, 3)}" for t in rng.sample(all_tools, k=rng.randint(0, 3))]
        args = {a.name: _arg_value(a, rng, assets) for a in spec.args if a.required or rng.random() < 0.5}
        reason = " ".join(rng.choices(_WORDS, k=rng.randint(3, 14)))
        call = {"name": spec.name, "arguments": args}
        yield protocol.format_reply(reason, call)
        yield protocol.format_reply(reason, terminate=True)
        imglist = "{" + ", ".join(assets) + "}"
        new_id = f"{spec.name}_{rng.randint(0, 3)}"
        tool_text = f"{spec.name} done." if rng.random() < 0.5 else f"Error: {reason}"
        yield protocol.echo_saved(tool_text, new_id, imglist)
        yield protocol.echo_plain(tool_text, imglist)
        yield " ".join(str(rng.randint(0, 10 ** rng.randint(1, 4))) for _ in range(8))
    yield from extra


def _train_bpe(spec: TinyQwen3VLSpec):
    """Train a byte-level BPE with Qwen2's pre-tokenizer; returns (vocab, merges)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    # Must match Qwen2Tokenizer's pipeline exactly, or the learned merges would not apply at use time.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.bpe_vocab_size,
        min_frequency=2,
        # Reserve Qwen's control tokens first so they get small, stable ids (0..7) in Qwen's order.
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no UNK ever
        show_progress=False,
    )
    tok.train_from_iterator(protocol_corpus(spec.extra_corpus), trainer=trainer)
    raw_merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in raw_merges]
    return tok.get_vocab(), merges


def build_tiny_tokenizer(spec: TinyQwen3VLSpec | None = None):
    """The tiny model's ``Qwen2Tokenizer`` with Qwen's special tokens and our protocol tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    spec = spec or TinyQwen3VLSpec()
    vocab, merges = _train_bpe(spec)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        errors="replace",
        model_max_length=spec.model_max_length,
    )
    # Special, and already in the vocabulary; listing them as additional special tokens (as Qwen's
    # config does) matches them before BPE, never split, and lists them in ``all_special_tokens``.
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [t for t in QWEN_SPECIAL_TOKENS if t != PAD_TOKEN]}
    )
    # Not special: they must survive decoding of generated text (TRL decodes with skip_special_tokens).
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in non_special_added_tokens()],
        special_tokens=False,
    )
    return tokenizer


def qwen3_vl_chat_template() -> str:
    """TRL's shipped Qwen3-VL chat template, byte-for-byte."""
    return (resources.files("trl") / "chat_templates" / "qwen3_vl.jinja").read_text(encoding="utf-8")


def _image_processor(spec: TinyQwen3VLSpec):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=spec.patch_size,
        temporal_patch_size=spec.temporal_patch_size,
        merge_size=spec.merge_size,
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL normalisation
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
    )


def _video_processor_config(spec: TinyQwen3VLSpec) -> dict:
    # Lets AutoProcessor build the stock Qwen3VLProcessor from this folder where torchvision exists.
    return {
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": spec.patch_size,
        "temporal_patch_size": spec.temporal_patch_size,
        "merge_size": spec.merge_size,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": spec.min_pixels * 2, "longest_edge": spec.max_pixels * 2},
        "fps": 2,
        "min_frames": 2,
        "max_frames": 8,
        "do_sample_frames": True,
    }


def _model_config(spec: TinyQwen3VLSpec, tokenizer):
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            head_dim=spec.head_dim,
            max_position_embeddings=spec.max_position_embeddings,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": spec.rope_theta,
                "mrope_section": list(spec.mrope_section),
                "mrope_interleaved": True,
            },
            pad_token_id=ids[PAD_TOKEN],
            eos_token_id=ids[EOS_TOKEN],
            bos_token_id=None,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=spec.vision_depth,
            hidden_size=spec.vision_hidden_size,
            intermediate_size=spec.vision_intermediate_size,
            num_heads=spec.vision_num_heads,
            patch_size=spec.patch_size,
            spatial_merge_size=spec.merge_size,
            temporal_patch_size=spec.temporal_patch_size,
            out_hidden_size=spec.hidden_size,
            num_position_embeddings=spec.vision_num_position_embeddings,
            deepstack_visual_indexes=list(spec.deepstack_visual_indexes),
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _rewrite_json(path: Path, **updates) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data.update(updates)
    _write_json(path, data)


def build_tiny_qwen3vl(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    spec: TinyQwen3VLSpec | None = None,
) -> Path:
    """Build and save a tiny random Qwen3-VL checkpoint into ``out_dir``; return its path.
    Deterministic: the same ``seed`` and ``spec`` give byte-identical files; the caller's torch RNG
    state is left untouched."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from canvasagent.core.models.loading import _image_only_processor_class

    spec = spec or TinyQwen3VLSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    tokenizer = build_tiny_tokenizer(spec)
    chat_template = qwen3_vl_chat_template()
    tokenizer.chat_template = chat_template  # also usable for text-only rendering

    # Save through the image-only processor: the stock Qwen3VLProcessor cannot be instantiated
    # without torchvision. Its to_dict() names the stock class, so the folder stays standard.
    processor = _image_only_processor_class()(
        image_processor=_image_processor(spec), tokenizer=tokenizer, chat_template=chat_template
    )
    processor.save_pretrained(out)
    # Backend-neutral image processor type (like the hub's): torchvision machines pick the fast one.
    if (out / "preprocessor_config.json").exists():
        _rewrite_json(out / "preprocessor_config.json", image_processor_type="Qwen2VLImageProcessor",
                      processor_class="Qwen3VLProcessor")
    _write_json(out / "video_preprocessor_config.json", _video_processor_config(spec))
    _rewrite_json(out / "tokenizer_config.json", processor_class="Qwen3VLProcessor")

    config = _model_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    ]
    model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    model.generation_config.bos_token_id = None
    model.save_pretrained(out)
    _write_json(out / "canvasagent_tiny.json", {"seed": seed, "spec": asdict(spec)})
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Built tiny Qwen3-VL (%s params, vocab %d) in %s in %.1fs",
        f"{n_params:,}",
        len(tokenizer),
        out,
        time.perf_counter() - t0,
    )
    return out
