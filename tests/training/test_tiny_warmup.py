"""The tiny model's warmup before SFT: its examples (fresh boxes and scenes too), its learning, reuse and refusals."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.core.models import load_policy, load_processor
from canvasagent.training.config import TrainConfig
from canvasagent.training.tiny_warmup import (
    STATED_BOX, WARMUP_MARKER, fresh_box, pad_batch, stated_box, warm_up, warmup_example,
)

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


def test_sft_starts_from_the_warmed_model(tmp_path, monkeypatch):
    from canvasagent.training import sft
    from canvasagent.training.sft import build_sft_trainer

    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return warm_up(*args, **{**kwargs, "box_share": 0.0, "angle_share": 0.0})  # scripted rows state their boxes and angles

    monkeypatch.setattr(sft, "warm_up", spy)
    cfg = TrainConfig.load("sft_tiny_cpu", {
        "run.output_dir": str(tmp_path), "model.name_or_path": "tiny", "model.tiny_warmup_steps": 3,
        "model.tiny_warmup_box_share": 0.25, "model.tiny_warmup_angle_share": 0.5,
        "data.n_train": 4, "optim.max_steps": 1, "optim.per_device_train_batch_size": 2,
    })
    trainer, _, ws = build_sft_trainer(cfg)
    assert (seen["box_share"], seen["angle_share"], seen["profile"].value) == (0.25, 0.5, "canvascraft")
    assert ws.model_path == str(tmp_path / "tiny_warm")
    assert json.loads((tmp_path / "tiny_warm" / WARMUP_MARKER).read_text())["steps"] == 3
    warmed = load_policy(ws.model_path).state_dict()
    base = load_policy(str(tmp_path / "tiny_base")).state_dict()
    assert any(not torch.equal(warmed[k], base[k]) for k in base)
    assert all(torch.equal(p.detach(), warmed[k]) for k, p in trainer.model.state_dict().items() if k in warmed)


# --- fresh boxes (model.tiny_warmup_box_share) ---

def _crop_row(box: str, image: object = None) -> dict:
    args = {"image": "img_1", "bbox": box}
    return {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "SYSTEM TURN"}]},
        {"role": "user", "content": [{"type": "text", "text": "img_1:"}, {"type": "image", "image": image},
                                     {"type": "text", "text": f"Crop it to the area {box} (coordinates from 0 to 1000)."}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"<reason>I crop img_1 to {box}.</reason>"}],
         "tool_calls": [{"type": "function", "function": {"name": "Crop", "arguments": json.dumps(args)}}]},
    ]}


corner = st.integers(0, 1000)


def dumps(x: object) -> str:
    return json.dumps(x, default=id)  # images as their identity


@given(box=st.tuples(corner, corner, corner, corner), seed=st.integers(0, 2**32))
@settings(max_examples=200, deadline=None)
def test_fresh_box_replaces_the_stated_box_everywhere_and_nothing_else(box, seed):
    old = f"[{box[0]}, {box[1]}, {box[2]}, {box[3]}]"
    image = object()
    row = _crop_row(old, image)
    before = dumps(row)
    new_row = fresh_box(row, random.Random(seed))
    assert dumps(row) == before  # the input row is not changed
    new = stated_box(new_row)
    x1, y1, x2, y2 = map(int, new[1:-1].split(", "))
    assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000 and all(v % 10 == 0 for v in (x1, y1, x2, y2))
    assert new_row["messages"][1]["content"][1]["image"] is image
    text = dumps(new_row["messages"])
    if new != old:
        assert old not in text
    assert text.count(new) == dumps(row["messages"]).count(old) == 3  # instruction, reason, call
    assert json.loads(new_row["messages"][2]["tool_calls"][0]["function"]["arguments"])["bbox"] == new
    assert text.replace(new, "BOX") == dumps(row["messages"]).replace(old, "BOX")


@pytest.mark.parametrize("row, expected", [
    (ROWS[0], None),
    ({"messages": [{"role": "user", "content": "img_1: crop to [1, 2, 3, 4] please"}]}, "[1, 2, 3, 4]"),
    ({"messages": [{"role": "user", "content": "a box [1, 2, 3] or [1,2,3,4] is no box"}]}, None),
    ({"messages": [{"role": "assistant", "content": "[1, 2, 3, 4]"}]}, None),
    ({"messages": []}, None),
])
def test_stated_box_reads_the_first_user_turn_only(row, expected):
    assert stated_box(row) == expected
    if expected is None:
        with pytest.raises(ValueError, match="states no box"):
            fresh_box(row, random.Random(0))


BOXED = [_crop_row(b) for b in ("[100, 200, 300, 400]", "[500, 100, 900, 600]")]


def test_box_share_draws_fresh_boxes_at_its_share(tiny_qwen3vl_dir, tmp_path, monkeypatch):
    from canvasagent.training import tiny_warmup

    drawn: list[str] = []
    real = tiny_warmup.train_step
    processor = load_processor(str(tiny_qwen3vl_dir))
    tok = processor.tokenizer

    def spy(model, opt, examples, pad):
        drawn.extend(tok.decode(ids) for ids, _ in examples)
        return real(model, opt, examples, pad)

    monkeypatch.setattr(tiny_warmup, "train_step", spy)
    warm_up(tiny_qwen3vl_dir, ROWS + BOXED, 40, tmp_path / "w", processor=processor, box_share=0.5)
    written = {"[100, 200, 300, 400]", "[500, 100, 900, 600]"}
    boxes = [m.group(0) for d in drawn if (m := STATED_BOX.search(d))]
    assert len(drawn) == 40 * 8 and 0.35 < len(boxes) / len(drawn) < 0.65
    assert len(set(boxes) - written) > 0.9 * len(boxes)  # drawn afresh, not as written
    assert all(d.count(m.group(0)) == 3 for d in drawn if (m := STATED_BOX.search(d)))
    marker = json.loads((tmp_path / "w" / WARMUP_MARKER).read_text())
    assert marker["box_share"] == 0.5 and marker["box_scheme"] == tiny_warmup.FRESH_BOX_SCHEME

    drawn.clear()
    assert warm_up(tiny_qwen3vl_dir, ROWS + BOXED, 40, tmp_path / "w", processor=processor, box_share=0.5) == tmp_path / "w"
    assert drawn == []  # the same share: reused
    monkeypatch.setattr(tiny_warmup, "FRESH_BOX_SCHEME", "another way to draw boxes")
    warm_up(tiny_qwen3vl_dir, ROWS + BOXED, 40, tmp_path / "w", processor=processor, box_share=0.5)
    assert len(drawn) == 40 * 8  # the same share, boxes drawn another way: rebuilt
    assert json.loads((tmp_path / "w" / WARMUP_MARKER).read_text())["box_scheme"] == "another way to draw boxes"
    monkeypatch.undo()
    monkeypatch.setattr(tiny_warmup, "train_step", spy)
    warm_up(tiny_qwen3vl_dir, ROWS + BOXED, 40, tmp_path / "w", processor=processor, box_share=0.25)
    assert json.loads((tmp_path / "w" / WARMUP_MARKER).read_text())["box_share"] == 0.25  # another: rebuilt

    drawn.clear()  # share 0: the rows as written, drawn as before the option existed, and its marker
    warm_up(tiny_qwen3vl_dir, ROWS + BOXED, 40, tmp_path / "w", processor=processor)
    examples = [tok.decode(warmup_example(processor, r)[0]) for r in ROWS + BOXED]
    rng = random.Random(0)
    assert drawn == [rng.choice(examples) for _ in range(40 * 8)]
    assert set(json.loads((tmp_path / "w" / WARMUP_MARKER).read_text())) == {
        "steps", "seed", "batch", "learning_rate", "base", "examples"}


def test_box_share_one_draws_only_stated_boxes(tiny_qwen3vl_dir, tmp_path):
    out = warm_up(tiny_qwen3vl_dir, BOXED, 2, tmp_path / "w", box_share=1.0)
    assert json.loads((out / WARMUP_MARKER).read_text())["box_share"] == 1.0


@pytest.mark.parametrize("bbox", [[280, 190, 770, 520], "[280, 190, 770, 520]", "[280,190,770,520]"])
def test_fresh_box_rewrites_a_reply_built_the_way_sft_rows_are(tiny_qwen3vl_dir, bbox):
    from canvasagent.core.protocol import format_reply
    from canvasagent.training.messages import assistant_message

    reply = format_reply("I crop img_1 to [280, 190, 770, 520].", {"name": "Crop", "arguments": {"image": "img_1", "bbox": bbox}})
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "img_1:"}, {"type": "image"},
                                                     {"type": "text", "text": "Crop it to the area [280, 190, 770, 520]."}]},
                        assistant_message(reply)]}
    processor = load_processor(str(tiny_qwen3vl_dir))
    before = processor.tokenizer.decode(warmup_example(processor, row)[0])
    after = processor.tokenizer.decode(warmup_example(processor, fresh_box(row, random.Random(3)))[0])
    new = stated_box(fresh_box(row, random.Random(3)))
    old_anywhere = r"\[\s*280\s*,\s*190\s*,\s*770\s*,\s*520\s*\]"
    assert len(re.findall(old_anywhere, before)) == 3 and not re.findall(old_anywhere, after)
    assert after.count(new) + after.count(new.replace(" ", "")) == 3


@pytest.mark.parametrize("rows, share, message", [
    (ROWS, 0.25, "none of the 4 SFT rows states a box"),
    (BOXED, 0.5, "every SFT row is singled out"),
    (ROWS + BOXED, 1.5, r"in \[0, 1\]"),
    (ROWS + BOXED, -0.1, r"in \[0, 1\]"),
])
def test_warmup_refuses_a_box_share_it_cannot_draw(tiny_qwen3vl_dir, tmp_path, rows, share, message):
    with pytest.raises(ValueError, match=message):
        warm_up(tiny_qwen3vl_dir, rows, 2, tmp_path / "w", box_share=share)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("share, steps, message", [
    (1.5, 10, r"in \[0, 1\]"), (-0.5, 10, r"in \[0, 1\]"), ("0.2", 10, r"in \[0, 1\]"), (True, 10, r"in \[0, 1\]"),
    (0.25, 0, "needs model.tiny_warmup_steps"),
])
def test_config_refuses_bad_box_shares(share, steps, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.load("sft_tiny_cpu", {"model.tiny_warmup_steps": steps, "model.name_or_path": "tiny",
                                          "model.tiny_warmup_box_share": share})


# --- fresh scenes (model.tiny_warmup_angle_share) ---

def _rotate_row(instruction: str, angle: int, then_flip: bool = False, images: int = 1, reason: str | None = None) -> dict:
    from PIL import Image

    user = [{"type": "text", "text": "img_1:"}, {"type": "image"}]
    if images == 2:
        user += [{"type": "text", "text": "img_2:"}, {"type": "image"}]
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": "SYSTEM TURN"}]},
        {"role": "user", "content": [*user, {"type": "text", "text": instruction}]},
        {"role": "assistant", "content": [{"type": "text", "text": reason or f"<reason>img_1 is turned, so I rotate it by {angle} degrees.</reason>"}],
         "tool_calls": [{"type": "function", "function": {"name": "Rotate", "arguments": json.dumps({"image": "img_1", "angle": angle})}}]},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "[Output image saved as: Rotate_0.]"}]},
    ]
    if then_flip:
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": "<reason>Now the mirror.</reason>"}],
                     "tool_calls": [{"type": "function", "function": {"name": "Flip", "arguments": json.dumps({"image": "Rotate_0"})}}]})
    return {"messages": msgs, "images": [Image.new("RGB", (256, 256), (200, 10, 10))] * (images + 1)}


@pytest.mark.parametrize("row, expected", [
    (_rotate_row("Get it the right way up.", 90), 90),
    (_rotate_row("Fix the 190 sign so it stands upright.", 90), 90),  # 190 does not state 90
    (_rotate_row("Rotate the image by 90 degrees.", 90), None),
    (_rotate_row("A 180-degree turn, please.", 180), None),
    (_rotate_row("Get it the right way up.", 45, images=2), None),  # which picture it shows is not one
    (_rotate_row("Get it the right way up.", 90, reason="<reason>Turned 90 degrees, so 90 it is.</reason>"), None),  # which to rewrite?
    (_rotate_row("Get it the right way up.", 90, reason="<reason>Score 0.90: I rotate it by 90.</reason>"), 90),
    (_crop_row("[100, 200, 300, 400]"), None),
    ({"messages": []}, None),
])
def test_turned_angle_is_a_first_rotate_whose_angle_is_left_unstated(row, expected):
    from canvasagent.training.tiny_warmup import turned_angle

    assert turned_angle(row) == expected


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), angle=st.sampled_from([45, 90, 180]), then_flip=st.booleans())
def test_fresh_scene_draws_a_turned_scene_and_writes_the_angle_that_undoes_it(seed, angle, then_flip):
    from canvascraft.plan import correctable_rotations, correction_angle
    from canvascraft.sources import ProceduralSource
    from canvasagent.training.tiny_warmup import fresh_scene, turned_angle
    from toolserver.validation import Profile

    row = _rotate_row("Get it the right way up.", angle, then_flip)
    before = dumps(row)
    out = fresh_scene(row, random.Random(seed))
    assert dumps(row) == before  # the row itself is not changed
    # What the scene must be: the build's procedural source, turned (and mirrored before a Flip).
    wants = frozenset({"rotated", "mirrored"} if then_flip else {"rotated"})
    scene = ProceduralSource(256, rotations=correctable_rotations(Profile.CANVASCRAFT)).sample(
        random.Random(seed), frozenset({"text"}), wants)
    assert scene.meta["rotation"] and scene.meta.get("mirrored", False) == then_flip
    new = correction_angle(scene.meta["rotation"], Profile.CANVASCRAFT)
    assert len(out["images"]) == 1 and out["images"][0].tobytes() == scene.image.convert("RGB").tobytes()
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant"]  # the first exchange only
    assert out["messages"][1] == row["messages"][1]
    assert turned_angle(out) == new
    assert out["messages"][2]["content"][0]["text"] == f"<reason>img_1 is turned, so I rotate it by {new} degrees.</reason>"


def test_fresh_scene_rewrites_the_angle_as_a_whole_number_only():
    from canvasagent.training.tiny_warmup import fresh_scene, turned_angle

    row = _rotate_row("Get it the right way up.", 90, reason="<reason>Score 0.90, -90 and 190 stay: I rotate it by 90.</reason>")
    for seed in range(20):
        out = fresh_scene(row, random.Random(seed))
        new = turned_angle(out)
        assert out["messages"][2]["content"][0]["text"] == f"<reason>Score 0.90, -90 and 190 stay: I rotate it by {new}.</reason>"


def test_fresh_scene_refuses_a_row_that_is_not_a_turned_picture():
    from canvasagent.training.tiny_warmup import fresh_scene

    with pytest.raises(ValueError, match="not a Rotate"):
        fresh_scene(_rotate_row("Rotate it by 90 degrees.", 90), random.Random(0))


def test_image_example_keeps_the_picture_and_trains_the_reply_alone(tiny_qwen3vl_dir):
    from canvasagent.training.tiny_warmup import fresh_scene

    processor = load_processor(str(tiny_qwen3vl_dir))
    tok = processor.tokenizer
    row = fresh_scene(_rotate_row("Get it the right way up.", 90), random.Random(1))
    ids, labels, extra = warmup_example(processor, row, images=True)
    grid = extra["image_grid_thw"]
    pads = sum(i == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") for i in ids)
    assert grid.shape == (1, 3) and extra["pixel_values"].shape[0] == int(grid.prod())
    assert pads == int(grid.prod()) // processor.image_processor.merge_size ** 2 > 0
    text_ids, text_labels = warmup_example(processor, row)  # the same exchange without its picture
    assert [x for x in labels if x != -100] == [x for x in text_labels if x != -100]
    assert "SYSTEM" not in tok.decode(ids) and "<|vision_start|>" not in tok.decode(text_ids)


def test_angle_share_draws_fresh_scenes_at_its_share(tiny_qwen3vl_dir, tmp_path, monkeypatch):
    from canvasagent.training import tiny_warmup
    from toolserver.validation import Profile

    turned = [_rotate_row("Get it the right way up.", a) for a in (45, 90, 180)]
    stated = [_rotate_row("Rotate it by 90 degrees.", 90)]
    rows = ROWS + BOXED + turned + stated
    drawn: list[tuple] = []
    real = tiny_warmup.train_step
    processor = load_processor(str(tiny_qwen3vl_dir))

    def spy(model, opt, examples, pad):
        drawn.extend(examples)
        return real(model, opt, examples, pad)

    monkeypatch.setattr(tiny_warmup, "train_step", spy)
    warm_up(tiny_qwen3vl_dir, rows, 40, tmp_path / "w", processor=processor, box_share=0.25, angle_share=0.5)
    pictures = [e for e in drawn if len(e) == 3]
    boxes = [e for e in drawn if len(e) == 2 and STATED_BOX.search(processor.tokenizer.decode(e[0]))]
    assert len(drawn) == 40 * 8
    assert 0.4 < len(pictures) / len(drawn) < 0.6 and 0.15 < len(boxes) / len(drawn) < 0.35
    angles = [re.search(r"rotate it by (\d+) degrees", processor.tokenizer.decode(e[0])).group(1) for e in pictures]
    assert set(angles) == {"45", "90", "180"}
    assert len({e[2]["pixel_values"].sum().item() for e in pictures}) > 0.9 * len(pictures)  # a new scene each draw
    # The stated-angle row is drawn as written, without its picture.
    assert any(len(e) == 2 and "Rotate it by 90 degrees" in processor.tokenizer.decode(e[0]) for e in drawn)
    marker = json.loads((tmp_path / "w" / WARMUP_MARKER).read_text())
    assert (marker["angle_share"], marker["profile"], marker["scene_scheme"]) == (0.5, "canvascraft", tiny_warmup.FRESH_SCENE_SCHEME)

    drawn.clear()
    warm_up(tiny_qwen3vl_dir, rows, 40, tmp_path / "w", processor=processor, box_share=0.25, angle_share=0.5)
    assert drawn == []  # the same shares and profile: reused
    warm_up(tiny_qwen3vl_dir, rows, 40, tmp_path / "w", processor=processor, box_share=0.25, angle_share=0.5,
            profile=Profile.EXACT)
    assert len(drawn) == 40 * 8  # another profile turns scenes the other way: rebuilt


@pytest.mark.parametrize("box, angle, message", [
    (0.0, 0.25, "no SFT row starts with a Rotate"),
    (0.6, 0.6, "add up to more than 1"),
    (0.0, -0.1, r"angle share must be in \[0, 1\]"),
])
def test_warmup_refuses_an_angle_share_it_cannot_draw(tiny_qwen3vl_dir, tmp_path, box, angle, message):
    rows = ROWS + BOXED + ([_rotate_row("Get it the right way up.", 90)] if "Rotate" not in message else [])
    with pytest.raises(ValueError, match=message):
        warm_up(tiny_qwen3vl_dir, rows, 2, tmp_path / "w", box_share=box, angle_share=angle)
    assert not (tmp_path / "w").exists()


def test_warmup_refuses_shares_that_leave_nothing_else_to_draw(tiny_qwen3vl_dir, tmp_path):
    with pytest.raises(ValueError, match="every SFT row is singled out"):
        warm_up(tiny_qwen3vl_dir, BOXED + [_rotate_row("Get it the right way up.", 90)], 2, tmp_path / "w",
                box_share=0.25, angle_share=0.25)


@pytest.mark.parametrize("overrides, message", [
    ({"model.tiny_warmup_angle_share": 1.5}, r"tiny_warmup_angle_share must be a number in \[0, 1\]"),
    ({"model.tiny_warmup_angle_share": "0.5"}, r"tiny_warmup_angle_share must be a number in \[0, 1\]"),
    ({"model.tiny_warmup_angle_share": 0.5, "model.tiny_warmup_steps": 0}, "angle_share needs model.tiny_warmup_steps"),
    ({"model.tiny_warmup_angle_share": 0.5, "model.tiny_warmup_box_share": 0.6}, "add up to more than 1"),
])
def test_config_refuses_bad_angle_shares(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.load("sft_tiny_cpu", {"model.tiny_warmup_steps": 10, "model.name_or_path": "tiny", **overrides})
