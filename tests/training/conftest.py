import os

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: E402,F401  (session fixture)


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
