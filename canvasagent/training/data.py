"""Training rows and held-out tasks of a config, from its task source (`training.sources`).

Entry points only: each looks the config's source up (`data.format`) and asks it.
"""

from __future__ import annotations

from typing import Any, Callable

from canvasagent.core.tasks import Task
from canvasagent.training.config import TrainConfig
from canvasagent.training.sources import SOURCES, get_source, source_of


def scripted_tasks(cfg: TrainConfig, n: int | None = None, seed: int | None = None):
    """The scripted source's (task, reference replies) pairs; `n` / `seed` default to data.n_train / data.seed."""
    return SOURCES["scripted"].tasks(cfg, n, seed)


def sft_rows(cfg: TrainConfig, system: str, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    return source_of(cfg).sft_rows(cfg, system, toolbox_factory)


def grpo_rows(cfg: TrainConfig, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    return source_of(cfg).grpo_rows(cfg, toolbox_factory)


def eval_tasks(cfg: TrainConfig, n: int, seed: int, toolbox: Any, source: str = "scripted") -> list[Task]:
    """Held-out tasks of `source` (default: scripted tasks drawn with `seed`, reference images attached)."""
    return get_source(source).eval_tasks(cfg, n, seed, toolbox)


def grpo_dataset(cfg: TrainConfig, toolbox_factory: Callable[[], Any]):
    from datasets import Dataset

    return Dataset.from_list(grpo_rows(cfg, toolbox_factory))
