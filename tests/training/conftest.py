import os

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: E402,F401  (session fixture)

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_script(name: str):
    """benchmarks/<name>.py as a module, with benchmarks/ on sys.path while it is in use (the
    scripts import their siblings); a generator for module-scoped fixtures (`yield from`)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def record_scored_batches(trainer) -> list[dict]:
    """Keep every training batch the GRPO trainer scores (tensors as detached copies), so tests
    can inspect masks, image grids and rewards after `trainer.train()`."""
    import torch

    batches: list[dict] = []
    score = trainer._generate_and_score_completions

    def keep(inputs):
        out = score(inputs)
        batches.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = keep
    return batches


def replay_turns(trainer, tokenizer, script: list[list[str]]) -> dict[str, int]:
    """Replace the policy's sampler: its k-th call (one turn of every active rollout) answers row
    i with `script[k % len(script)][i % len(that turn)]`, right-padded. Returns the call counter."""
    import torch

    calls = {"n": 0}

    def generate(**kw):
        turn = script[calls["n"] % len(script)]
        calls["n"] += 1
        ids = kw["input_ids"]
        replies = [tokenizer.encode(turn[i % len(turn)], add_special_tokens=False) for i in range(ids.shape[0])]
        new = torch.full((ids.shape[0], max(map(len, replies))), tokenizer.pad_token_id, dtype=ids.dtype)
        for i, r in enumerate(replies):
            new[i, : len(r)] = torch.tensor(r)
        return torch.cat([ids, new], dim=1)

    trainer.model.generate = generate
    return calls


# A replayed group of four on a 2-turn task: three rollouts call Flip and one breaks its call;
# after the call, two stop and one rambles. Which turn is better is known by construction.
CALL = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": "img_1"}}\n</tool_call><|im_end|>'
BROKEN = '<reason>Mirror img_1.</reason>\n<tool_call>\n{"name": "Flip", "arguments": {"image": <|im_end|>'
STOP = "<reason>Flip_0 is the final image.</reason><Terminate><|im_end|>"
RAMBLE = "<reason>The image image image image.</reason><|im_end|>"
REPLAYED_GROUP = [[CALL, CALL, CALL, BROKEN], [STOP, RAMBLE, STOP]]


def replayed_group_trainer(out, tiny_dir, credit: str, **overrides):
    """A one-step GRPO trainer of the tiny model whose sampler replays REPLAYED_GROUP, not yet
    trained: (trainer, the list its scored batches will be recorded in)."""
    from canvasagent.training.config import TrainConfig
    from canvasagent.training.grpo import build_grpo_trainer

    cfg = TrainConfig.load("grpo_tiny_cpu", {
        "run.output_dir": str(out), "model.name_or_path": str(tiny_dir), "run.init_from": None,
        "data.n_train": 2, "optim.max_steps": 1, "optim.per_device_train_batch_size": 4,
        "grpo.num_generations": 4, "grpo.max_turns": 2, "grpo.max_completion_length": 256,
        "grpo.credit": credit, "run.save_steps": 0, "run.dump_every": 0, "run.logging_steps": 1, **overrides,
    })
    trainer, processor, _ = build_grpo_trainer(cfg)
    assert trainer.credit == credit
    replay_turns(trainer, processor.tokenizer, REPLAYED_GROUP)
    return trainer, record_scored_batches(trainer)
