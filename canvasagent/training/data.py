"""Training rows in the shared message layout, from our scripted tasks or CanvasCraft files."""

from __future__ import annotations

import logging
from typing import Any, Callable

from canvasagent.core.image_budget import apply_image_budget
from canvasagent.core.tasks import Task
from canvasagent.training.config import TrainConfig
from canvasagent.training.messages import grpo_row, sft_example

log = logging.getLogger(__name__)


def scripted_tasks(cfg: TrainConfig, n: int | None = None, seed: int | None = None):
    from canvasagent.training.scripted import make_tasks

    d = cfg.data
    return make_tasks(n if n is not None else d.n_train, d.seed if seed is None else seed, d.max_steps_per_task, d.image_size)


# `mixed`: the scripted tasks (data.n_train, data.seed, ...) plus the CanvasCraft build at data.path.
MIXED_SOURCES = ("scripted", "canvascraft")


def source_config(cfg: TrainConfig, fmt: str) -> TrainConfig:
    """One source of a `mixed` set: the same config, reading only that source, so each source
    keeps its own loader instead of a second copy of it here."""
    from dataclasses import replace

    return replace(cfg, data=replace(cfg.data, format=fmt))


def sft_rows(cfg: TrainConfig, system: str, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    if cfg.data.format == "mixed":
        return [r for fmt in MIXED_SOURCES for r in sft_rows(source_config(cfg, fmt), system, toolbox_factory)]
    if cfg.data.format == "easel-data":
        from canvasagent.training import easel_env

        return easel_env.sft_rows(cfg, system)
    if cfg.data.format == "scripted":
        from canvasagent.training.scripted import run_reference

        toolbox = toolbox_factory()
        return [sft_example(run_reference(t, r, toolbox), system, cfg.image_budget) for t, r in scripted_tasks(cfg)]
    return _canvascraft_sft_rows(cfg, system)


def eval_tasks(cfg: TrainConfig, n: int, seed: int, toolbox: Any) -> list[Task]:
    """Held-out scripted tasks with their reference images attached."""
    from canvasagent.training.scripted import attach_reference

    return [attach_reference(t, toolbox) for t, _ in scripted_tasks(cfg, n=n, seed=seed)]


def grpo_rows(cfg: TrainConfig, toolbox_factory: Callable[[], Any]) -> list[dict[str, Any]]:
    if cfg.data.format == "mixed":
        return [r for fmt in MIXED_SOURCES for r in grpo_rows(source_config(cfg, fmt), toolbox_factory)]
    if cfg.data.format == "easel":
        from canvasagent.training import easel_env

        return easel_env.grpo_rows(cfg.easel)
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


# -- CanvasCraft / public formats (readers in canvascraft.formats) ---------------------------------


def _canvascraft_rows(cfg: TrainConfig, kind: str, split: str | None = None) -> list[dict[str, Any]]:
    from canvascraft.build import shard_files
    from canvascraft.formats import read_rl_json, read_rows, read_sharegpt

    path = cfg.resolve(cfg.data.path)
    assert path is not None
    if cfg.data.format == "sharegpt":
        return read_sharegpt(path)
    if cfg.data.format == "rl-json":
        return read_rl_json(path)
    return read_rows(shard_files(path, kind, split))


def _canvascraft_sft_rows(cfg: TrainConfig, system: str) -> list[dict[str, Any]]:
    """CanvasCraft SFT rows -> our layout. Rows that carry the executed trajectory (our parquet,
    our ShareGPT) go through it; public ShareGPT rows are converted message by message."""
    from canvascraft.formats import trajectory_of

    out = []
    for row in _canvascraft_rows(cfg, "sft"):
        ex = (sft_example(trajectory_of(row), system, cfg.image_budget) if row.get("trajectory")
              else sharegpt_example(row, system, cfg.image_budget))
        # Images loaded from a temporary folder remember its path, and `datasets` would store the
        # path instead of the pixels; copies carry the pixels only.
        ex["images"] = [im.copy() for im in ex["images"]]
        out.append(ex)
    if not out:
        raise FileNotFoundError(f"no SFT rows in {cfg.data.path} (format {cfg.data.format})")
    return out


def sharegpt_example(row: dict[str, Any], system: str, image_budget: int | None = None) -> dict[str, Any]:
    """A public ShareGPT row (`<image>` placeholders in string contents) in our layout, under
    `image_budget` (`canvasagent.core.image_budget`; None: every image)."""
    from canvasagent.core.imageio import open_image
    from canvasagent.training.messages import assistant_message

    roles = {"human": "user", "gpt": "assistant", "observation": "tool", "function": "tool", "function_call": "assistant"}
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": system}]}]
    for m in row["messages"]:
        role = roles.get(m["role"], m["role"])
        if role == "system":
            continue  # our system turn (with the tool block) replaces theirs
        if role == "assistant":
            messages.append(assistant_message(m["content"]))
            continue
        content: list[dict[str, Any]] = []
        for i, part in enumerate(str(m["content"]).split("<image>")):
            if i:
                content.append({"type": "image"})
            if part:
                content.append({"type": "text", "text": part})
        messages.append({"role": role, "content": content})
    messages, images = apply_image_budget(messages, image_budget, [open_image(c["bytes"]) for c in row["images"]])
    return {"messages": messages, "images": images}


def _canvascraft_tasks(cfg: TrainConfig) -> list[Task]:
    from canvascraft.rl import task_of

    return [task_of(r) for r in _canvascraft_rows(cfg, "rl", "train") if r.get("split") in (None, "train")]
