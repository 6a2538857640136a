"""EASEL-Data -> SFT -> GRPO on EASEL: one chain, one layout, one coordinate convention (issue 8)."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from canvasagent.easel.painter import PainterConfig
from canvasagent.core.models import load_policy, load_processor
from canvasagent.core.protocol import parse_reply, render_system_prompt
from canvasagent.training.common import workspace
from canvasagent.training.config import TrainConfig
from canvasagent.training.data import grpo_rows, sft_rows
from canvasagent.training.easel_env import build_sft_data
from canvasagent.training.env import tool_functions
from canvasagent.training.messages import fill_images, system_text

# Two references, 4 strokes each (the budget): small enough to paint in seconds on one core.
EASEL = {"easel.categories": ["programmatic", "abstract"], "easel.n_per_category": 1}
CHEAP_PAINTER = PainterConfig(work_res=32, iters_low=20, iters_full=10)
INT_SENTENCE = "Path coordinates xs, ys, xc, yc, xe, ye are integers in 0-1000"


def _sft_cfg(data: Path, out: Path, tiny: Path, **extra) -> TrainConfig:
    return TrainConfig.load("sft_easel_tiny_cpu", {
        **EASEL, "data.path": str(data), "run.output_dir": str(out), "model.name_or_path": str(tiny), **extra})


def _grpo_cfg(out: Path, **extra) -> TrainConfig:
    return TrainConfig.load("grpo_easel_from_sft_tiny_cpu", {**EASEL, "run.output_dir": str(out), **extra})


@pytest.fixture(scope="module")
def easel_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("easel_data")
    counts = build_sft_data(TrainConfig.load("sft_easel_tiny_cpu", EASEL).easel, out, painter_cfg=CHEAP_PAINTER)
    assert counts["references"] == 2 and counts["C1"] == 8  # states 0..3 of both trajectories
    return out


@pytest.fixture(scope="module")
def processor(tiny_qwen3vl_dir):
    return load_processor(tiny_qwen3vl_dir)


def test_sft_rows_are_the_grpo_layout_byte_for_byte(easel_data, processor, tiny_qwen3vl_dir, tmp_path):
    cfg = _sft_cfg(easel_data, tmp_path, tiny_qwen3vl_dir)
    ws = workspace(cfg, build_model=False)
    rows = sft_rows(cfg, system_text(processor, ws.tool_fns, "easel"), ws.toolbox_factory)
    records = [json.loads(x) for x in (easel_data / "c1.jsonl").read_text().splitlines()]
    records += [json.loads(x) for x in (easel_data / "c2.jsonl").read_text().splitlines()]
    assert len(rows) == len(records)

    grpo_cfg = _grpo_cfg(tmp_path / "grpo")
    grpo_ws = workspace(grpo_cfg, build_model=False)
    by_ref = {json.loads(r["task"])["id"]: r for r in grpo_rows(grpo_cfg, grpo_ws.toolbox_factory)}
    # What TRL passes as `tools=`: every public function of the env class but `reset` (as
    # GRPOTrainer collects them), which must be the registry's easel tools and nothing else.
    env = grpo_ws.env_cls()
    fns = [getattr(env, n) for n, _ in inspect.getmembers(grpo_ws.env_cls, inspect.isfunction)
           if n != "reset" and not n.startswith("_")]
    assert sorted(f.__name__ for f in fns) == sorted(f.__name__ for f in tool_functions(None, "easel"))
    for row, rec in zip(rows, records):
        sft_msgs = fill_images({"messages": [row["messages"]], "images": [row["images"]]})["messages"][0]
        sft_text = processor.apply_chat_template(sft_msgs, tokenize=False)
        # The GRPO rollout that reaches this state: the row's prompt, then each earlier call and the
        # tool reply a real EaselEnv returns for it, rendered as TRL renders a multi-turn rollout.
        grpo_row = by_ref[rec["ref_id"]]
        env = grpo_ws.env_cls()
        env.reset(**grpo_row)
        rollout = list(grpo_row["prompt"])
        for m in sft_msgs[2:-1]:
            if m["role"] == "assistant":
                fn = m["tool_calls"][0]["function"]
                rollout += [m, {"role": "tool", "name": fn["name"], "content": env.brush_stroke(**fn["arguments"])}]
        prompt = processor.apply_chat_template(rollout, tools=fns, tokenize=False, add_generation_prompt=True)
        assert sft_text.startswith(prompt), rec["step"]
        assert sum(m["role"] == "tool" for m in sft_msgs) == rec["step"]
        assert [im.tobytes() for im in row["images"][:2]] == [im.tobytes() for im in grpo_row["images"]]
        assert INT_SENTENCE in sft_text and "coordinates as fractions" not in sft_text
        reply = sft_text[len(prompt):].split("<|im_end|>")[0]
        parsed = parse_reply(reply)
        assert not parsed.findings and parsed.call.name == "brush_stroke"
        expected = json.loads(rec["messages"][-1]["content"].split("<tool_call>")[1].split("</tool_call>")[0])
        assert parsed.call.arguments == expected["arguments"]  # EASEL-Data's integers, untouched
        assert all(isinstance(parsed.call.arguments[k], int) for k in ("xs", "ys", "xc", "yc", "xe", "ye"))
        if rec["step"] == 3:  # the replayed canvas is the state EASEL-Data recorded (up to quantisation)
            state = np.asarray(Image.open(easel_data / rec["images"][1]).convert("RGB"), np.float32)
            assert np.abs(np.asarray(row["images"][-1], np.float32) - state).mean() < 2.0
    # The GRPO prompt states the same convention; the unit config keeps the registry's.
    assert INT_SENTENCE in prompt
    unit = TrainConfig.load("grpo_easel_tiny_cpu", {**EASEL, "run.output_dir": str(tmp_path / "u")})
    unit_system = grpo_rows(unit, workspace(unit, build_model=False).toolbox_factory)[0]["prompt"][0]["content"][0]["text"]
    assert unit_system == render_system_prompt("easel", include_tools=False) and INT_SENTENCE not in unit_system


def test_int1000_env_rescales_before_validation(tmp_path):
    cfg = _grpo_cfg(tmp_path)
    ws = workspace(cfg, build_model=False)
    env = ws.env_cls()
    env.reset(**grpo_rows(cfg, ws.toolbox_factory)[0])
    stroke = {"xs": 100, "ys": 200, "xc": 500, "yc": 900, "xe": 900, "ye": 300, "rs": 0.15, "os": 0.9,
              "re": 0.1, "oe": 0.8, "cr": 0.8, "cg": 0.2, "cb": 0.1}
    ok = env.brush_stroke(**stroke)
    assert "stroke applied" in ok[1]["text"]
    assert env.session.history[0].params[:6] == pytest.approx([0.1, 0.2, 0.5, 0.9, 0.9, 0.3])
    bad = env.brush_stroke(**{**stroke, "xs": 1500})  # 1.5 after rescaling: the validator refuses it
    assert "must be in [0, 1]" in bad[1]["text"] and len(env.session.strokes) == 1


@pytest.fixture(scope="module")
def sft_run(easel_data, tiny_qwen3vl_dir, tmp_path_factory):
    """Through the command line's function: `python -m canvasagent.train sft --config sft_easel_tiny_cpu ...`."""
    from canvasagent.train import main

    out = tmp_path_factory.mktemp("sft_easel")
    sets = {**EASEL, "data.path": str(easel_data), "model.name_or_path": str(tiny_qwen3vl_dir), "optim.max_steps": 3,
            "optim.per_device_train_batch_size": 2, "run.save_steps": 3, "run.logging_steps": 1}
    argv = ["sft", "--config", "sft_easel_tiny_cpu", "--output-dir", str(out)]
    for k, v in sets.items():
        argv += ["--set", f"{k}={json.dumps(v) if isinstance(v, list) else v}"]
    assert main(argv) == 0
    return out


def test_sft_trains_and_the_checkpoint_reloads(sft_run):
    state = json.loads((sft_run / "checkpoint-3" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert state["global_step"] == 3 and len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)
    load_processor(sft_run / "final")
    assert sum(p.numel() for p in load_policy(sft_run / "final").parameters()) > 0


def test_only_the_brush_stroke_call_is_trained(easel_data, tiny_qwen3vl_dir, tmp_path):
    from canvasagent.training.sft import build_sft_trainer

    trainer, processor, _ = build_sft_trainer(_sft_cfg(easel_data, tmp_path, tiny_qwen3vl_dir))
    tok = processor.tokenizer
    steps = [json.loads(x)["step"] for x in (easel_data / "c1.jsonl").read_text().splitlines()]
    for i in (steps.index(0), steps.index(3)):
        batch = trainer.data_collator([trainer.train_dataset[i]])
        ids, labels = batch["input_ids"][0], batch["labels"][0]
        trained, masked = tok.decode(ids[labels != -100]), tok.decode(ids[labels == -100])
        # Exactly the assistant turns: each a reason and one brush_stroke call, then the end of turn.
        turns = trained.split("<|im_end|>")[:-1]
        assert len(turns) == steps[i] + 1
        for turn in turns:
            turn = turn.strip()
            assert turn.startswith("<reason>") and turn.endswith("</tool_call>")
            call = parse_reply(turn).call
            assert call.name == "brush_stroke" and isinstance(call.arguments["xs"], int)
        for not_trained in ("img_1:", "img_2", "# Tools", "integers in 0-1000", "<tool_response>", "stroke applied",
                            "<|image_pad|>", "<|vision_start|>"):
            assert not_trained not in trained, not_trained
        assert masked.count("<|image_pad|>") >= 2 + steps[i] and masked.count("stroke applied") == steps[i]
        assert batch["image_grid_thw"].shape[0] == 2 + steps[i]  # reference, blank canvas, one per tool reply


def test_grpo_on_easel_starts_from_the_sft_checkpoint(sft_run, tmp_path):
    from canvasagent import training

    cfg = _grpo_cfg(tmp_path, **{
        "run.init_from": str(sft_run / "final"), "easel.budget": 2, "optim.max_steps": 2,
        "optim.per_device_train_batch_size": 4, "grpo.num_generations": 2, "grpo.max_turns": 3,
        "grpo.max_completion_length": 256, "run.dump_every": 0})
    assert workspace(cfg, build_model=False).model_path == str(sft_run / "final")
    summary = training.run(cfg)
    logs = [h for h in summary["log_history"] if "reward" in h]
    assert len(logs) == 2
    for h in logs:
        assert math.isfinite(h["reward"]) and math.isfinite(h["loss"])
        for k in ("easel_s", "format", "action"):
            assert math.isfinite(h[f"rewards/{k}/mean"])
        assert 0.0 < h["rewards/easel_s/mean"] <= 1.0
