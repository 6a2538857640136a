"""SFT and GRPO training of the CanvasAgent policy with TRL (see `python -m canvasagent.train -h`).

Heavy imports (torch, transformers, trl) happen inside the functions; importing this package is cheap.
"""

from canvasagent.training.config import TrainConfig

__all__ = ["TrainConfig", "dry_run", "run"]


def run(cfg: TrainConfig, callbacks: list | None = None) -> dict:
    """Train according to `cfg.kind` and return a summary (final dir, steps, log history)."""
    if cfg.kind == "sft":
        from canvasagent.training.sft import run_sft

        return run_sft(cfg, callbacks)
    from canvasagent.training.grpo import run_grpo

    return run_grpo(cfg, callbacks)


def dry_run(cfg: TrainConfig) -> dict:
    from canvasagent.training.dryrun import dry_run as _dry

    return _dry(cfg)
