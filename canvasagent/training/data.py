"""Training rows in the shared message layout, from our scripted tasks or CanvasCraft files."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from canvasagent.tasks import Task
from canvasagent.training.config import TrainConfig
from canvasagent.training.messages import prompt_messages, sft_example

log = logging.getLogger(__name__)


def scripted_tasks(cfg: TrainConfig, n: int | None = None, seed: int | None = None):
    from canvasagent.training.scripted import make_tasks

    d = cfg.data
    return make_tasks(n if n is not None else d.n_train, d.seed if seed is None else seed, d.max_steps_per_task, d.image_size)


def grpo_row(task: Task) -> dict[str, Any]:
    """A GRPO row: the prompt (TRL adds the tool block), the input images, the task for `reset`.

    Reference images (for the offline alignment judge) travel in their own image column, since
    the task JSON cannot hold images.
    """
    meta = {k: v for k, v in task.meta.items() if k != "reference_images"}
    data = {**task.to_dict(), "meta": meta}
    return {
        "prompt": prompt_messages(task, task.family),
        "images": list(task.images),
        "reference_images": list(task.meta.get("reference_images") or []),
        "task": json.dumps(data, default=str),
    }


def sft_rows(cfg: TrainConfig, system: str, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    if cfg.data.format == "scripted":
        from canvasagent.training.scripted import run_reference

        toolbox = toolbox_factory()
        return [sft_example(run_reference(t, r, toolbox), system) for t, r in scripted_tasks(cfg)]
    return _canvascraft_sft_rows(cfg, system)


def eval_tasks(cfg: TrainConfig, n: int, seed: int, toolbox: Any) -> list[Task]:
    """Held-out scripted tasks with their reference images attached."""
    from canvasagent.training.scripted import attach_reference

    return [attach_reference(t, toolbox) for t, _ in scripted_tasks(cfg, n=n, seed=seed)]


def grpo_rows(cfg: TrainConfig, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    if cfg.data.format == "scripted":
        from canvasagent.training.scripted import attach_reference

        toolbox = toolbox_factory()
        return [grpo_row(attach_reference(t, toolbox)) for t, _ in scripted_tasks(cfg)]
    return [grpo_row(t) for t in _canvascraft_tasks(cfg)]


def sft_dataset(cfg: TrainConfig, system: str, toolbox_factory: Callable[[], Any]):
    from datasets import Dataset

    from canvasagent.training.messages import fill_images

    return Dataset.from_list(sft_rows(cfg, system, toolbox_factory)).with_transform(fill_images)


def grpo_dataset(cfg: TrainConfig, toolbox_factory: Callable[[], Any]):
    from datasets import Dataset

    return Dataset.from_list(grpo_rows(cfg, toolbox_factory))


# -- CanvasCraft / public formats (issue 4 owns the readers) ---------------------------------------


def _canvascraft_sft_rows(cfg: TrainConfig, system: str) -> list[dict[str, Any]]:
    """CanvasCraft trajectories -> rows in our layout (the system turn replaced by ours)."""
    from canvasagent.trajectory import Trajectory

    path = cfg.resolve(cfg.data.path)
    assert path is not None
    try:
        from canvascraft import io as ccio  # type: ignore[attr-defined]

        trajs = list(ccio.read_trajectories(path, fmt=cfg.data.format))
    except (ImportError, AttributeError):
        # Fallback: a directory of saved trajectories (`Trajectory.save` layout).
        trajs = [Trajectory.load(p) for p in sorted(path.glob("**/trajectory.json"))]
    if not trajs:
        raise FileNotFoundError(f"no trajectories found in {path} (format {cfg.data.format})")
    return [sft_example(t, system) for t in trajs]


def _canvascraft_tasks(cfg: TrainConfig) -> list[Task]:
    path = cfg.resolve(cfg.data.path)
    assert path is not None
    from canvascraft import io as ccio  # type: ignore[attr-defined]

    return list(ccio.read_tasks(path, fmt=cfg.data.format))
