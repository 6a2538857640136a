"""The tiny offline Qwen3-VL checkpoint: build, reload through the shared loaders, use."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from canvasagent.core.models import (
    PROTOCOL_TOKENS,
    ModelUnavailableError,
    build_tiny_qwen3vl,
    load_policy,
    load_processor,
)
from canvasagent.core.models.special_tokens import QWEN_SPECIAL_TOKENS
from canvasagent.core.models.tiny import TinyQwen3VLSpec, qwen3_vl_chat_template
from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def processor(tiny_qwen3vl_dir):  # noqa: F811
    return load_processor(tiny_qwen3vl_dir)


@pytest.fixture(scope="module")
def policy(tiny_qwen3vl_dir):  # noqa: F811
    return load_policy(tiny_qwen3vl_dir)


def _image(color=(200, 30, 30), size=(96, 64)) -> Image.Image:
    return Image.new("RGB", size, color)


def _tool_conversation() -> list[dict]:
    """user(image) -> assistant(reason + tool call) -> tool(image + text) -> assistant(terminate)."""
    return [
        {"role": "system", "content": [{"type": "text", "text": "You are a visual editing agent."}]},
        {"role": "user", "content": [{"type": "image", "image": _image()}, {"type": "text", "text": "Crop the cat."}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "<reason>The cat is on the left.</reason>"}],
            "tool_calls": [
                {"type": "function", "function": {"name": "Crop", "arguments": {"image": "img_0", "bbox": [0, 0, 48, 64]}}}
            ],
        },
        {
            "role": "tool",
            "name": "Crop",
            "content": [
                {"type": "image", "image": _image((30, 200, 30), (48, 64))},
                {"type": "text", "text": "imglist: [img_0, Crop_0]"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "<reason>Done.</reason><Terminate>"}]},
    ]


def test_checkpoint_layout(tiny_qwen3vl_dir):  # noqa: F811
    names = {p.name for p in Path(tiny_qwen3vl_dir).iterdir()}
    for required in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "processor_config.json", "chat_template.jinja",
                     "video_preprocessor_config.json"):
        assert required in names
    config = json.loads((Path(tiny_qwen3vl_dir) / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    assert config["text_config"]["hidden_size"] == 64 and config["text_config"]["num_hidden_layers"] == 2
    # TRL recognises its templates by exact string: the saved one must be byte-identical.
    assert (Path(tiny_qwen3vl_dir) / "chat_template.jinja").read_text(encoding="utf-8") == qwen3_vl_chat_template()


def test_loaders_return_expected_types(processor, policy):
    assert type(processor.tokenizer).__name__ == "Qwen2Tokenizer"
    assert processor.image_processor.patch_size == 16 and processor.image_processor.merge_size == 2
    assert processor.chat_template == qwen3_vl_chat_template()
    assert type(policy).__name__ == "Qwen3VLForConditionalGeneration"
    assert policy.get_input_embeddings().weight.shape[0] == len(processor.tokenizer)


def test_special_tokens_single_ids_and_roundtrip(processor):
    tok = processor.tokenizer
    ids = {}
    for t in PROTOCOL_TOKENS:
        enc = tok.encode(t, add_special_tokens=False)
        assert len(enc) == 1, (t, enc)
        ids[t] = enc[0]
    assert len(set(ids.values())) == len(PROTOCOL_TOKENS)
    for t in QWEN_SPECIAL_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"

    text = (
        "<reason>Crop the red cat</reason>\n<tool_call>\n"
        '{"name": "Crop", "arguments": {"image": "img_1", "bbox": [10, 20, 300, 400]}}\n</tool_call>'
    )
    enc = tok.encode(text + "<|im_end|>" + "<Terminate>", add_special_tokens=False)
    # Protocol tokens are not special: they survive skip_special_tokens=True (TRL decodes that way).
    assert tok.decode(enc, skip_special_tokens=True) == text + "<Terminate>"
    assert tok.decode(enc) == text + "<|im_end|><Terminate>"
    # The locally trained BPE compresses protocol text (tool names are single tokens).
    assert tok.encode("Crop", add_special_tokens=False) == tok.encode("Crop", add_special_tokens=False)[:1]
    assert len(enc) < len(text) / 2.5


def test_chat_template_renders_multiturn_tool_conversation(processor):
    tools = [{"type": "function", "function": {"name": "Crop", "description": "Crop an image.", "parameters": {
        "type": "object", "properties": {"image": {"type": "string"}, "bbox": {"type": "array"}}, "required": ["image"]}}}]
    text = processor.apply_chat_template(_tool_conversation(), tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a visual editing agent.\n\n# Tools")
    assert '<tool_call>\n{"name": "Crop", "arguments": {"image": "img_0", "bbox": [0, 0, 48, 64]}}\n</tool_call>' in text
    assert (
        "<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>"
        "imglist: [img_0, Crop_0]\n</tool_response><|im_end|>"
    ) in text
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert text.endswith("<|im_start|>assistant\n<reason>Done.</reason><Terminate><|im_end|>\n")

    enc = processor.apply_chat_template(
        _tool_conversation(), tools=tools, tokenize=True, return_dict=True, return_tensors="pt"
    )
    grid = enc["image_grid_thw"]
    assert grid.shape == (2, 3)
    n_image_tokens = int((enc["input_ids"] == processor.image_token_id).sum())
    assert n_image_tokens == int(grid.prod(-1).sum()) // processor.image_processor.merge_size**2


def test_image_processor_returns_torch_without_return_tensors(processor):
    # TRL's GRPO tool loop calls the processor with return_tensors=None and needs torch pixel values.
    out = processor(text=["a <|vision_start|><|image_pad|><|vision_end|>"], images=[_image()])
    assert isinstance(out["pixel_values"], torch.Tensor)
    assert isinstance(out["image_grid_thw"], torch.Tensor)


def test_forward_and_generate_with_image(processor, policy):
    messages = _tool_conversation()[:2]
    enc = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = policy(**enc)
    assert out.logits.shape == (1, enc["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(out.logits).all()
    gen = policy.generate(**enc, max_new_tokens=4, do_sample=False)
    assert gen.shape[0] == 1 and enc["input_ids"].shape[1] < gen.shape[1] <= enc["input_ids"].shape[1] + 4
    assert isinstance(processor.decode(gen[0, enc["input_ids"].shape[1]:]), str)


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_build_is_deterministic_per_seed(tiny_qwen3vl_dir, tmp_path):  # noqa: F811
    rng_before = torch.get_rng_state()
    same = build_tiny_qwen3vl(tmp_path / "again", seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before)  # caller's RNG untouched
    assert _digest(same) == _digest(Path(tiny_qwen3vl_dir))

    other = _digest(build_tiny_qwen3vl(tmp_path / "seed1", seed=1))
    base = _digest(Path(tiny_qwen3vl_dir))
    assert other["model.safetensors"] != base["model.safetensors"]
    # The tokenizer does not depend on the seed (datasets stay valid across tiny models).
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_missing_local_path_raises_clear_error(tmp_path):
    with pytest.raises(ModelUnavailableError, match="not an existing checkpoint directory"):
        load_processor(tmp_path / "nope")
    with pytest.raises(ModelUnavailableError, match="build-tiny"):
        load_policy(str(tmp_path / "nope"))


def test_uncached_hub_id_offline_raises_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    with pytest.raises(ModelUnavailableError, match="offline"):
        load_processor("canvasagent-test/does-not-exist-vl")
    with pytest.raises(ModelUnavailableError, match="offline"):
        load_policy("canvasagent-test/does-not-exist-vl")


def test_protocol_tokens_added_to_foreign_tokenizer(tiny_qwen3vl_dir):  # noqa: F811
    """A checkpoint whose tokenizer lacks our markers (like real Qwen3-VL) gets them on load."""
    from transformers import AutoTokenizer, Qwen2Tokenizer

    from canvasagent.core.models import add_protocol_tokens, ensure_token_capacity
    from canvasagent.core.models.special_tokens import missing_protocol_tokens

    assert missing_protocol_tokens(AutoTokenizer.from_pretrained(tiny_qwen3vl_dir)) == []
    # A minimal tokenizer without the protocol tokens stands in for a foreign checkpoint.
    plain = Qwen2Tokenizer(vocab={"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abc")}}, merges=[], unk_token=None)
    added = add_protocol_tokens(plain)
    assert "<reason>" in added and "<Terminate>" in added
    assert missing_protocol_tokens(plain) == []
    ids = plain.encode("<reason>a</reason>", add_special_tokens=False)
    assert plain.decode(ids, skip_special_tokens=True) == "<reason>a</reason>"

    class _Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(3, 4)

        def get_input_embeddings(self):
            return self.emb

        def resize_token_embeddings(self, n, pad_to_multiple_of=None):
            self.emb = torch.nn.Embedding(n, 4)

    stub = _Stub()
    assert ensure_token_capacity(stub, plain) is True
    assert stub.emb.weight.shape[0] >= len(plain)


def test_tokenizer_compresses_protocol_text(processor):
    """Trained on the live protocol, the BPE reaches the pre-tokenizer floor on the system prompt."""
    from tokenizers import Regex, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from canvasagent.core.protocol import render_system_prompt

    split = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
    for include_tools in (False, True):
        prompt = render_system_prompt("canvasagent", include_tools=include_tools)
        floor = len(split.pre_tokenize_str(prompt))  # BPE never merges across pre-tokens
        assert len(processor.tokenizer.encode(prompt, add_special_tokens=False)) <= int(floor * 1.1)


def test_trl_recognises_template_and_parses_tool_calls(tiny_qwen3vl_dir):  # noqa: F811
    """TRL must treat the tiny processor as Qwen3-VL: tool support, training template, parsing.

    GRPO parses completions with ``prefix=prompt_ids``; without the prefix the new-style
    response template finds no ``<|im_start|>assistant`` anchor and parses nothing.
    """
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        parse_response,
        supports_tool_calling,
    )

    processor = add_response_schema(load_processor(tiny_qwen3vl_dir))
    assert supports_tool_calling(processor)
    assert get_training_chat_template(processor) is not None
    tok = processor.tokenizer
    prefix = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    reply = (
        "<reason>find it</reason>\n<tool_call>\n"
        '{"name": "Crop", "arguments": {"image": "img_1", "bbox": [1, 2, 3, 4]}}\n</tool_call><|im_end|>'
    )
    parsed = parse_response(tok, tok.encode(reply, add_special_tokens=False), prefix=prefix)
    assert parsed["content"] == "<reason>find it</reason>"
    assert parsed["tool_calls"][0]["function"] == {"name": "Crop", "arguments": {"image": "img_1", "bbox": [1, 2, 3, 4]}}
    end_ids = tok.encode("<reason>ok</reason><Terminate><|im_end|>", add_special_tokens=False)
    done = parse_response(tok, end_ids, prefix=prefix)
    assert done["content"] == "<reason>ok</reason><Terminate>" and not done.get("tool_calls")


def test_processor_pickles_and_keeps_torch_outputs(processor):
    """datasets hashes and ships processors to workers with pickle/dill: the patched classes must pickle."""
    import copy
    import pickle

    for clone in (pickle.loads(pickle.dumps(processor)), copy.deepcopy(processor)):
        assert type(clone) is type(processor)
        out = clone(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[_image()])
        assert isinstance(out["pixel_values"], torch.Tensor)


def test_importing_special_tokens_is_cheap():
    import subprocess
    import sys

    code = (
        "import sys; import canvasagent.core.models.special_tokens, canvasagent.core.models; "
        "print('transformers' in sys.modules or 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_named_sizes_build_and_an_unknown_size_is_refused(tmp_path):
    from canvasagent.core.models.tiny import TINY_SIZES, tiny_spec
    from canvasagent.training.config import TrainConfig

    assert tiny_spec("xs") == TinyQwen3VLSpec()
    with pytest.raises(ValueError, match="unknown tiny model size 'xl'"):
        tiny_spec("xl")
    with pytest.raises(ValueError, match="model.tiny_size 'xl' unknown"):
        TrainConfig.load("sft_tiny_cpu", {"model.tiny_size": "xl"})
    # The cached tiny_base follows the configured seed and size: a changed one is rebuilt.
    from dataclasses import asdict

    from canvasagent.training.common import _tiny_model_matches

    cfg = TrainConfig.load("sft_tiny_cpu", {"run.output_dir": str(tmp_path / "run")})
    out = tmp_path / "tiny_base"
    assert not _tiny_model_matches(out, cfg)
    out.mkdir()
    (out / "canvasagent_tiny.json").write_text(json.dumps({"seed": 0, "spec": asdict(tiny_spec("xs"))}))
    assert _tiny_model_matches(out, cfg)
    cfg.model.tiny_size = "s"
    assert not _tiny_model_matches(out, cfg)
    cfg.model.tiny_size, cfg.model.tiny_seed = "xs", 1
    assert not _tiny_model_matches(out, cfg)
    assert TINY_SIZES["s"]["hidden_size"] > TinyQwen3VLSpec().hidden_size
