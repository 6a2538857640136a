"""The tiny model's text-only warmup before SFT: its examples, its learning, reuse and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from canvasagent.core.models import load_policy, load_processor
from canvasagent.training.config import TrainConfig
from canvasagent.training.tiny_warmup import WARMUP_MARKER, pad_batch, warm_up, warmup_example

WORDS = ["Best Coffee", "Thank You", "Grand Opening", "Hello World"]


def _row(instruction: str, content: str) -> dict:
    args = {"base_image": "img_1", "overlay_type": "text", "content": content, "position": "[500, 500]"}
    return {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "SYSTEM TURN " * 40}]},
        {"role": "user", "content": [{"type": "text", "text": "img_1:"}, {"type": "image"}, {"type": "text", "text": instruction}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<reason>I add the caption.</reason>"}],
         "tool_calls": [{"type": "function", "function": {"name": "Overlayer", "arguments": json.dumps(args)}}]},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "[Output image saved as: Overlayer_0.]"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<reason>Done.</reason><Terminate>"}]},
    ]}


ROWS = [_row(f"Please write '{w}' on it.", w) for w in WORDS]


def test_example_trains_the_first_reply_on_the_instruction_alone(tiny_qwen3vl_dir):
    processor = load_processor(str(tiny_qwen3vl_dir))
    ids, labels = warmup_example(processor, ROWS[0])
    tok = processor.tokenizer
    trained = tok.decode([i for i, y in zip(ids, labels) if y != -100])
    prompt = tok.decode([i for i, y in zip(ids, labels) if y == -100])
    assert trained.startswith("<reason>I add the caption.</reason>") and '"content": "Best Coffee"' in trained
    assert "<Terminate>" not in trained and "Overlayer_0" not in trained  # the first exchange only
    assert "Please write 'Best Coffee' on it." in prompt and "img_1:" in prompt
    for absent in ("SYSTEM TURN", "<|vision_start|>", "<|image_pad|>"):
        assert absent not in prompt + trained, absent
    assert [y for y in labels if y != -100] == ids[len(ids) - len([y for y in labels if y != -100]):]


@pytest.mark.parametrize("messages", [
    [],
    [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    [{"role": "assistant", "content": "<reason>r</reason><Terminate>"}],
    [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
])
def test_rows_without_a_first_exchange_give_no_example(tiny_qwen3vl_dir, messages):
    assert warmup_example(load_processor(str(tiny_qwen3vl_dir)), {"messages": messages}) is None


def test_refuses_negative_steps_and_rows_without_examples(tiny_qwen3vl_dir, tmp_path):
    with pytest.raises(ValueError, match=">= 0"):
        warm_up(tiny_qwen3vl_dir, ROWS, -1, tmp_path / "w")
    with pytest.raises(ValueError, match="none of the 1 SFT rows"):
        warm_up(tiny_qwen3vl_dir, [{"messages": []}], 2, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def _loss(model_dir: Path) -> float:
    processor, model = load_processor(str(model_dir)), load_policy(str(model_dir))
    ids, labels, mask = pad_batch([warmup_example(processor, r) for r in ROWS], processor.tokenizer.pad_token_id or 0)
    with torch.inference_mode():
        return float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)


def test_warmup_learns_the_replies_and_is_reused_until_its_inputs_change(tiny_qwen3vl_dir, tmp_path):
    out = warm_up(tiny_qwen3vl_dir, ROWS, 120, tmp_path / "warm", seed=0)
    assert _loss(out) < 0.5 * _loss(tiny_qwen3vl_dir)
    marker = json.loads((out / WARMUP_MARKER).read_text())
    assert marker["steps"] == 120 and marker["seed"] == 0
    # A loadable checkpoint with the base's processor files.
    for f in Path(tiny_qwen3vl_dir).iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    # The caller's processor gives the same examples as the one warm_up would load.
    assert warm_up(tiny_qwen3vl_dir, ROWS, 120, out, seed=0, processor=load_processor(str(tiny_qwen3vl_dir))) == out
    assert weights.stat().st_mtime_ns == stamp  # reused, not retrained
    warm_up(tiny_qwen3vl_dir, ROWS[:2], 2, out, seed=0)  # other examples: rebuilt
    assert json.loads((out / WARMUP_MARKER).read_text())["examples"] != marker["examples"]


@pytest.mark.parametrize("steps, path, message", [
    (-3, "tiny", ">= 0"), (1.5, "tiny", "integer"), (True, "tiny", "integer"), (10, "some/checkpoint", "tiny model only"),
])
def test_config_refuses_bad_warmup_settings(steps, path, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.load("sft_tiny_cpu", {"model.tiny_warmup_steps": steps, "model.name_or_path": path})


def test_sft_starts_from_the_warmed_model(tmp_path):
    from canvasagent.training.sft import build_sft_trainer

    cfg = TrainConfig.load("sft_tiny_cpu", {
        "run.output_dir": str(tmp_path), "model.name_or_path": "tiny", "model.tiny_warmup_steps": 3,
        "data.n_train": 4, "optim.max_steps": 1, "optim.per_device_train_batch_size": 2,
    })
    trainer, _, ws = build_sft_trainer(cfg)
    assert ws.model_path == str(tmp_path / "tiny_warm")
    assert json.loads((tmp_path / "tiny_warm" / WARMUP_MARKER).read_text())["steps"] == 3
    warmed = load_policy(ws.model_path).state_dict()
    base = load_policy(str(tmp_path / "tiny_base")).state_dict()
    assert any(not torch.equal(warmed[k], base[k]) for k in base)
    assert all(torch.equal(p.detach(), warmed[k]) for k, p in trainer.model.state_dict().items() if k in warmed)
