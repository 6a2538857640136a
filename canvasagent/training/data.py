"""Training rows and held-out tasks of a config, from its task source (`training.sources`).

Entry points only: each looks the config's source up (`data.format`) and asks it.
"""

from __future__ import annotations

import json
from pathlib import Path
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
    """The source's GRPO rows; with `data.task_ids`, only the rows of the tasks that file names, in
    the source's order. Refused (ValueError): a name the source's training tasks lack, or no name."""
    source = source_of(cfg)
    rows = source.grpo_rows(cfg, toolbox_factory)
    if cfg.data.task_ids is None:
        return rows
    wanted = read_task_ids(cfg.resolve(cfg.data.task_ids))
    ids = [json.loads(r["task"])["id"] for r in rows]
    if missing := sorted(wanted - set(ids)):
        raise ValueError(f"data.task_ids {cfg.data.task_ids}: {len(missing)} ids are not training tasks of "
                         f"the {source.name} source (first: {missing[:3]})")
    return [r for r, i in zip(rows, ids) if i in wanted]


def read_task_ids(path: Path) -> set[str]:
    """The task ids of a file, one per line (blank lines and lines starting with # skipped); a
    missing file or one that names no task is refused (ValueError)."""
    if not path.is_file():
        raise ValueError(f"task id file {path} does not exist")
    ids = {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")}
    if not ids:
        raise ValueError(f"task id file {path} names no task")
    return ids


def eval_tasks(cfg: TrainConfig, n: int, seed: int, toolbox: Any, source: str = "scripted") -> list[Task]:
    """Held-out tasks of `source` (default: scripted tasks drawn with `seed`, reference images attached)."""
    return get_source(source).eval_tasks(cfg, n, seed, toolbox)


def grpo_dataset(cfg: TrainConfig, toolbox_factory: Callable[[], Any]):
    from datasets import Dataset

    return Dataset.from_list(grpo_rows(cfg, toolbox_factory))
