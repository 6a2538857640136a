"""GRPO tool calls run concurrently across rollouts (CanvasGRPOTrainer's tool loop).

Real TRL runs on the tiny Qwen3-VL: the policy's turns are replayed at the sampler (a random
model never writes a valid call), every call goes through the env, the episode, the toolbox and
the `latency` backend, whose counters say how many calls it really held at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from canvasagent.training.config import TrainConfig
from canvasagent.training.grpo import build_grpo_trainer
from canvasagent.training.trl_multimodal import ConcurrentToolRunner, ToolConcurrency
from tests.training.conftest import record_scored_batches, replay_turns
from toolserver.backends.latency import reset_latency_stats

EDIT = ('<reason>Edit {a}.</reason>\n<tool_call>\n{{"name": "ImageEdit", "arguments": '
        '{{"image": "{a}", "edit_prompt": "brighter"}}}}\n</tool_call><|im_end|>')
STOP = "<reason>Done.</reason><Terminate><|im_end|>"
LATENCY_S = 0.3
N = 4  # rollouts in the step


def _cfg(out: Path, tiny_dir: Path) -> TrainConfig:
    return TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "tools.config": "latency", "tools.names": ["ImageEdit"],
        "data.n_train": 4, "optim.max_steps": 1, "optim.per_device_train_batch_size": N,
        "grpo.num_generations": N, "grpo.max_turns": 2, "grpo.max_completion_length": 256,
        "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1,
    })


def _run(cfg: TrainConfig, concurrent: bool, script: list[list[str]]):
    trainer, processor, ws = build_grpo_trainer(cfg)
    if not concurrent:
        trainer.tool_runner = None  # TRL's own serial loop
    box = ws.env_cls.toolbox()
    box.backends["ImageEdit"]._fn = None  # rebuilt on first call with this test's latency
    box.backends["ImageEdit"].params = {"latency_s": LATENCY_S, "stats_key": f"test-{concurrent}"}
    stats = reset_latency_stats(f"test-{concurrent}")
    replay_turns(trainer, processor.tokenizer, script)
    batches = record_scored_batches(trainer)
    t0 = time.perf_counter()
    trainer.train()
    return trainer, batches, stats.snapshot(), time.perf_counter() - t0


@pytest.fixture(scope="module")
def both_runs(tiny_qwen3vl_dir, tmp_path_factory):
    # Rollouts 0 and 2 edit twice, 1 and 3 once then stop: unequal turns, as in real rollouts.
    script = [[EDIT.format(a="img_1")], [EDIT.format(a="ImageEdit_0"), STOP], [STOP]]
    runs = {}
    for concurrent in (False, True):
        cfg = _cfg(tmp_path_factory.mktemp(f"conc{concurrent}"), tiny_qwen3vl_dir)
        runs[concurrent] = _run(cfg, concurrent, script)
    return runs


def test_calls_of_a_turn_are_held_at_once(both_runs):
    _, _, serial, _ = both_runs[False]
    trainer, _, conc, _ = both_runs[True]
    assert serial["calls"] == conc["calls"] == N + N // 2  # N first-turn edits, N/2 second-turn ones
    assert serial["max_in_flight"] == 1
    assert conc["max_in_flight"] == N  # every rollout's first-turn call was in flight together
    waits = trainer.tool_runner.turn_wait_s
    assert len(waits) == 2 and all(w < 2 * LATENCY_S for w in waits)  # one latency per turn, not N


def test_masks_and_tokens_match_the_serial_loop(both_runs):
    _, b_serial, _, _ = both_runs[False]
    _, b_conc, _, _ = both_runs[True]
    assert len(b_serial) == len(b_conc) == 1
    s, c = b_serial[0], b_conc[0]
    for key in ("prompt_ids", "completion_ids", "completion_mask", "tool_mask", "image_grid_thw"):
        assert torch.equal(s[key], c[key]), key
    assert torch.equal(s["pixel_values"], c["pixel_values"])
    # The tool results really are in there: tool tokens masked out, both edits per even rollout.
    assert (s["tool_mask"] == 0).any()
    assert s["image_grid_thw"].shape[0] > N


def test_per_tool_cap_bounds_calls_in_flight():
    stats = reset_latency_stats("test-cap")
    from PIL import Image

    from toolserver.backends import build_backend
    from toolserver.request import ToolRequest

    fn = build_backend("latency", {"latency_s": 0.1, "stats_key": "test-cap"})
    req = ToolRequest("ImageEdit", {"image": "img_1", "edit_prompt": "x"}, images={"image": Image.new("RGB", (8, 8))})
    runner = ConcurrentToolRunner(ToolConcurrency(max_workers=8, per_tool={"ImageEdit": 3}))
    out = runner.run([[("ImageEdit", lambda: fn(req), {})] for _ in range(8)])
    assert all(r[0].value.ok for r in out)
    assert stats.snapshot()["max_in_flight"] == 3
    runner.close()


def test_a_groups_calls_run_in_order_and_errors_stay_with_their_call():
    seen: list[tuple[int, int]] = []

    def make(g: int, k: int):
        def f():
            seen.append((g, k))
            if k == 1:
                raise ValueError(f"bad {g}")
            return (g, k)

        return f

    runner = ConcurrentToolRunner(ToolConcurrency())
    out = runner.run([[(f"t{k}", make(g, k), {}) for k in range(3)] for g in range(4)])
    for g, group in enumerate(out):
        assert [r.value for r in group] == [(g, 0), None, (g, 2)]
        assert isinstance(group[1].error, ValueError) and str(group[1].error) == f"bad {g}"
    for g in range(4):
        assert [k for gg, k in seen if gg == g] == [0, 1, 2]
    runner.close()


def test_concurrency_settings_are_validated():
    with pytest.raises(ValueError):
        ToolConcurrency(max_workers=0)
    with pytest.raises(ValueError):
        ToolConcurrency(per_tool={"ImageEdit": 0})
