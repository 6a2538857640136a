"""A real GRPO trajectory dump from one tiny GRPO step on the CPU, for the rollout viewer tests.

The random tiny model almost never writes a valid call, so the first turn of each rollout is
forced: two rollouts of the group mirror img_1 (the tool runs, its image comes back) and two name
an asset that does not exist (a tool error). Everything after that turn, the rewards and the dump
itself are the trainer's own path.
"""

from __future__ import annotations

from pathlib import Path

GOOD = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'
BAD = '<reason>Mirror img_9.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_9"}}\n</tool_call><|im_end|>'


def run_tiny_grpo(out: Path, tiny_dir: Path) -> Path:
    """Run one GRPO step (one group of 4 rollouts) into `out`; return its `trajectories` dir."""
    from canvasagent.training.config import TrainConfig
    from canvasagent.training.grpo import build_grpo_trainer

    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 4, "optim.max_steps": 1, "optim.per_device_train_batch_size": 4,
        "grpo.num_generations": 4, "grpo.max_turns": 2, "grpo.max_completion_length": 64,
        "run.save_steps": 0, "run.dump_every": 1, "run.logging_steps": 1,
    })
    trainer, processor, _ = build_grpo_trainer(cfg)
    tok = processor.tokenizer
    forced = [tok.encode(GOOD if i % 2 == 0 else BAD, add_special_tokens=False) for i in range(4)]
    orig = trainer._generate_single_turn
    calls = {"n": 0}

    def single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls["n"] += 1
        if calls["n"] == 1:  # the first turn of the generation round
            return [list(forced[i % 4]) for i in range(len(prompt_ids))], None
        return orig(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    trainer._generate_single_turn = single_turn
    trainer.train()
    return out / "trajectories"


if __name__ == "__main__":  # python -m tests.ui.grpo_dump OUT: build a dump by hand
    import sys
    import time

    from canvasagent.core.models.tiny import build_tiny_qwen3vl

    root = Path(sys.argv[1])
    t0 = time.time()
    if not (root / "tiny" / "canvasagent_tiny.json").exists():
        build_tiny_qwen3vl(root / "tiny", seed=0)
    print(run_tiny_grpo(root / "grpo", root / "tiny"), f"{time.time() - t0:.1f}s")
