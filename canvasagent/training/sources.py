"""Task sources: the one registry of where a run's rows, rollout env, reward and held-out tasks come from.

`data.format` names a source in `SOURCES` (scripted, canvascraft, sharegpt, rl-json, mixed =
scripted + canvascraft, easel, easel-data); every module that needs something source-specific
asks `source_of(cfg)` instead of switching on the name or on a toolbox type. A source gives
`validate(cfg)` (ValueError), `sft_rows` / `grpo_rows` (rows in `messages`' layout; a run kind
it cannot feed is refused with ValueError), `env(cfg)` (TRL environment class, toolbox factory),
`scorer(cfg, toolbox)` (a `canvasagent.evaluation.scoring.HybridScorer`), `train_tasks` (the GRPO
training tasks as tasks, reference images attached, in `grpo_rows` order), `eval_tasks`
(held-out tasks, never training ones) and the preflight / dry-run facts (`needs_path`, `hint`,
`needs_toolserver`, `uses_tools_config`, `judged`, `dry_run_data`). Configs are read
duck-typed: the config validates through this module, so it never imports `training.config`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable

from canvascraft.build import read_tasks, shard_files

from canvasagent.core.tasks import Task
from canvasagent.evaluation.scoring import EASEL_COMPONENTS, HybridScorer, easel_scorer, make_scorer
from canvasagent.training import easel_env
from canvasagent.training.env import make_env_class, toolbox_factory
from canvasagent.training.messages import grpo_row, sft_example, sharegpt_example
from canvasagent.training.scripted import attach_reference, make_tasks, run_reference

# Imported where used: canvascraft's readers load `datasets` (about 2 s), EASEL's tasks torch.

Rows = list[dict[str, Any]]
ToolboxFactory = Callable[[], Any]


class Source:
    """The default source: CanvasAgent tool rollouts scored by the hybrid reward."""

    name = ""
    kinds: tuple[str, ...] = ("sft", "grpo")  # run kinds it can feed
    needs_path = True  # data.path names the data
    hint = ""  # how to make a missing data.path ({kind}: sft | rl), appended to the preflight line
    family: str | None = None  # the tools.family it requires (None: any)
    judged = True  # its reward runs the preset's judges
    uses_tools_config = True  # its env or rows build a toolbox from tools.config
    meta_key: str | None = None  # a task whose meta holds this key came from this source

    def validate(self, cfg: Any) -> None:
        if cfg.kind not in self.kinds:
            raise ValueError(f"data.format={self.name} feeds {' and '.join(self.kinds)} runs only, not {cfg.kind}")
        if self.family and cfg.tools.family != self.family:
            raise ValueError(f"data.format={self.name} needs tools.family: {self.family}")
        if self.needs_path and not cfg.data.path:
            raise ValueError(f"data.format={self.name} needs data.path")

    def path_hint(self, cfg: Any) -> str:
        return self.hint.format(kind="rl" if cfg.kind == "grpo" else "sft")

    def needs_toolserver(self, cfg: Any) -> bool:
        """Whether the run calls tools of tools.config: GRPO rollouts always do; SFT only where rows are made by running tools."""
        return cfg.kind == "grpo"

    def sft_rows(self, cfg: Any, system: str, toolbox_factory: ToolboxFactory) -> Rows:
        raise ValueError(f"data.format={self.name} has no SFT rows")

    def grpo_rows(self, cfg: Any, toolbox_factory: ToolboxFactory) -> Rows:
        raise ValueError(f"data.format={self.name} has no GRPO rows")

    def train_tasks(self, cfg: Any, toolbox: Any = None) -> list[Task]:
        """The GRPO training tasks, one per GRPO row and in the same order, ready to evaluate."""
        raise ValueError(f"data.format={self.name} has no GRPO training tasks to evaluate")

    def eval_tasks(self, cfg: Any, n: int | None = None, seed: int | None = None, toolbox: Any = None) -> list[Task]:
        raise ValueError(f"data.format={self.name} has no held-out tasks")

    def env(self, cfg: Any) -> tuple[type, ToolboxFactory]:
        """(TRL environment class, toolbox factory); the factory connects on first use."""
        factory = toolbox_factory(cfg)
        return make_env_class(cfg.tools.names or None, factory, cfg.grpo.max_turns, cfg.tools.family), factory

    def scorer(self, cfg: Any, toolbox: Any = None) -> HybridScorer:
        return make_scorer(cfg.grpo.reward_preset, cfg.grpo.judge, toolbox)

    def dry_run_data(self, cfg: Any, toolbox_factory: ToolboxFactory) -> dict[str, Any]:
        """What `--dry-run` reports about the data: files are only checked to exist."""
        p = cfg.resolve(cfg.data.path)
        return {"format": self.name, "path": str(p), "exists": bool(p and p.exists())}


class Scripted(Source):
    """Templated pure-tool chains (`training.scripted`): data.n_train tasks from data.seed."""

    name = "scripted"
    needs_path = False

    def tasks(self, cfg: Any, n: int | None = None, seed: int | None = None) -> list[tuple[Task, list[str]]]:
        """(task, reference replies) pairs; `n` / `seed` default to data.n_train / data.seed."""
        d = cfg.data
        return make_tasks(n if n is not None else d.n_train, d.seed if seed is None else seed, d.max_steps_per_task, d.image_size)

    def needs_toolserver(self, cfg: Any) -> bool:
        return True  # SFT rows are the reference replies run through the tools

    def sft_rows(self, cfg: Any, system: str, toolbox_factory: ToolboxFactory) -> Rows:
        toolbox = toolbox_factory()
        return [sft_example(run_reference(t, r, toolbox), system, cfg.image_budget) for t, r in self.tasks(cfg)]

    def grpo_rows(self, cfg: Any, toolbox_factory: ToolboxFactory) -> Rows:
        return [grpo_row(t) for t in self.train_tasks(cfg, toolbox_factory())]

    def train_tasks(self, cfg: Any, toolbox: Any = None) -> list[Task]:
        """data.n_train tasks from data.seed, reference images attached by `toolbox`."""
        return [attach_reference(t, toolbox) for t, _ in self.tasks(cfg)]

    def eval_tasks(self, cfg: Any, n: int | None = None, seed: int | None = None, toolbox: Any = None) -> list[Task]:
        """`n` tasks drawn with `seed` (a seed no training stage uses), reference images attached by `toolbox`."""
        return [attach_reference(t, toolbox) for t, _ in self.tasks(cfg, n=n, seed=seed)]

    def dry_run_data(self, cfg: Any, toolbox_factory: ToolboxFactory) -> dict[str, Any]:
        task = self.tasks(cfg, n=2)[0][0]
        return {"format": self.name, "example": grpo_row(task)["prompt"][1]["content"][-1]["text"]}


class CanvasCraft(Source):
    """A CanvasCraft build at data.path: `sft` shards for SFT, `rl` shards (train / eval splits) for GRPO."""

    name = "canvascraft"
    meta_key = "chain"
    hint = " (build it with `python -m canvascraft build-{kind} --out DIR`)"
    reader = ""  # a canvascraft.formats reader of one file (public formats); "" = the build's shards

    def read(self, cfg: Any, kind: str) -> Rows:
        """The rows at data.path: of `kind` (sft | rl) in a build, every row of a file."""
        from canvascraft import formats

        path = cfg.resolve(cfg.data.path)
        return getattr(formats, self.reader)(path) if self.reader else formats.read_rows(shard_files(path, kind))

    def sft_rows(self, cfg: Any, system: str, toolbox_factory: ToolboxFactory) -> Rows:
        """Rows that carry the executed trajectory (our parquet, our ShareGPT) go through it;
        public ShareGPT rows are converted message by message."""
        from canvascraft.formats import trajectory_of

        out = []
        for row in self.read(cfg, "sft"):
            ex = (sft_example(trajectory_of(row), system, cfg.image_budget) if row.get("trajectory")
                  else sharegpt_example(row, system, cfg.image_budget))
            # Images loaded from a temporary folder remember its path, and `datasets` would store the
            # path instead of the pixels; copies carry the pixels only.
            ex["images"] = [im.copy() for im in ex["images"]]
            out.append(ex)
        if not out:
            raise FileNotFoundError(f"no SFT rows in {cfg.data.path} (format {self.name})")
        return out

    def _tasks(self, cfg: Any, split: str) -> list[Task]:
        from canvascraft.rl import tasks_of

        return tasks_of(self.read(cfg, "rl"), split) if self.reader else read_tasks(cfg.resolve(cfg.data.path), split)

    def grpo_rows(self, cfg: Any, toolbox_factory: ToolboxFactory) -> Rows:
        return [grpo_row(t) for t in self.train_tasks(cfg)]

    def train_tasks(self, cfg: Any, toolbox: Any = None) -> list[Task]:
        """The build's `train` split (its references were made when the build ran the tools)."""
        return self._tasks(cfg, "train")

    def eval_tasks(self, cfg: Any, n: int | None = None, seed: int | None = None, toolbox: Any = None) -> list[Task]:
        """The build's `eval` split (the build fixed its seed), the first `n` when given."""
        return self._tasks(cfg, "eval")[:n]


class ShareGPT(CanvasCraft):
    name, meta_key, hint, reader = "sharegpt", None, "", "read_sharegpt"


class RLJson(CanvasCraft):
    name, meta_key, hint, reader = "rl-json", None, "", "read_rl_json"


class Mixed(CanvasCraft):
    """The parts' rows concatenated in `parts` order; each part reads the same config as its own source."""

    name = "mixed"
    meta_key = None
    parts = ("scripted", "canvascraft")

    def part_config(self, cfg: Any, part: str) -> Any:
        return replace(cfg, data=replace(cfg.data, format=part))

    def _each(self, cfg: Any) -> list[tuple[Source, Any]]:
        return [(SOURCES[p], self.part_config(cfg, p)) for p in self.parts]

    def needs_toolserver(self, cfg: Any) -> bool:
        return any(s.needs_toolserver(c) for s, c in self._each(cfg))

    def sft_rows(self, cfg: Any, system: str, toolbox_factory: ToolboxFactory) -> Rows:
        return [r for s, c in self._each(cfg) for r in s.sft_rows(c, system, toolbox_factory)]

    def grpo_rows(self, cfg: Any, toolbox_factory: ToolboxFactory) -> Rows:
        return [r for s, c in self._each(cfg) for r in s.grpo_rows(c, toolbox_factory)]

    def train_tasks(self, cfg: Any, toolbox: Any = None) -> list[Task]:
        return [t for s, c in self._each(cfg) for t in s.train_tasks(c, toolbox)]

    def eval_tasks(self, cfg: Any, n: int | None = None, seed: int | None = None, toolbox: Any = None) -> list[Task]:
        return [t for s, c in self._each(cfg) for t in s.eval_tasks(c, n, seed, toolbox)]


class _EaselLayout(Source):
    family = "easel"
    judged = False

    def validate(self, cfg: Any) -> None:
        super().validate(cfg)
        if cfg.image_budget is not None:
            raise ValueError("image_budget applies to the CanvasAgent layout; EASEL rows keep their own (set it to null)")

    def needs_toolserver(self, cfg: Any) -> bool:
        return False  # strokes run on an in-process canvas; EASEL-Data rows replay through it


class Easel(_EaselLayout):
    """EASEL tasks made here (`easel` section) as the GRPO task source, S as the outcome reward."""

    name = "easel"
    meta_key = "easel"
    kinds = ("grpo",)
    needs_path = False
    uses_tools_config = False

    def validate(self, cfg: Any) -> None:
        from canvasagent.easel.semantic import TASK_NAMES
        from canvasagent.easel.tasks import CATEGORIES

        if cfg.kind != "grpo":
            raise ValueError("data.format=easel is a GRPO task source (SFT data: `canvasagent easel data`)")
        super().validate(cfg)
        e = cfg.easel
        bad = [c for c in e.categories if c not in CATEGORIES] + [n for n in e.semantic if n not in TASK_NAMES]
        if bad:
            raise ValueError(f"easel: unknown categories/semantic tasks {bad}; choose from {list(CATEGORIES)} / {list(TASK_NAMES)}")
        unknown = sorted(set(e.reward_weights) - set(EASEL_COMPONENTS))
        if unknown:
            raise ValueError(f"easel.reward_weights: unknown components {unknown}; choose from {list(EASEL_COMPONENTS)}")
        if (e.resolution is not None and e.resolution < 16) or (e.budget is not None and e.budget < 1):
            raise ValueError("easel.resolution must be >= 16 and easel.budget >= 1")

    def grpo_rows(self, cfg: Any, toolbox_factory: ToolboxFactory) -> Rows:
        return easel_env.grpo_rows(cfg.easel)

    def eval_tasks(self, cfg: Any, n: int | None = None, seed: int | None = None, toolbox: Any = None) -> list[Task]:
        """The configured categories and semantic tasks drawn with `seed`, the first `n` when given."""
        e = cfg.easel if seed is None else replace(cfg.easel, seed=seed)
        return [easel_env.agent_task_of(s) for s in easel_env.task_specs(e)][:n]

    def env(self, cfg: Any) -> tuple[type, ToolboxFactory]:
        # EASEL episodes act on a canvas session, not on a toolbox from tools.config.
        env_cls = easel_env.make_easel_env_class(cfg.grpo.max_turns, cfg.easel.coords)
        return env_cls, env_cls._toolbox_factory

    def scorer(self, cfg: Any, toolbox: Any = None) -> HybridScorer:
        return easel_scorer(cfg.easel.reward_weights, cfg.grpo.reward_preset)

    def dry_run_data(self, cfg: Any, toolbox_factory: ToolboxFactory) -> dict[str, Any]:
        rows = self.grpo_rows(cfg, toolbox_factory)  # procedural references: cheap, and proves the spec is valid
        return {"format": self.name, "rows": len(rows), "example": json.loads(rows[0]["task"]).get("instruction") if rows else None}


class EaselData(_EaselLayout):
    """An EASEL-Data build at data.path (`c1.jsonl` / `c2.jsonl`, curricula `easel.curricula`), SFT."""

    name = "easel-data"
    kinds = ("sft",)
    hint = " (build it with `canvasagent easel data --out DIR`)"

    def validate(self, cfg: Any) -> None:
        if cfg.kind != "sft" or cfg.tools.family != "easel" or not cfg.data.path:
            raise ValueError("data.format=easel-data is SFT data: kind sft, tools.family easel, data.path = the build")
        super().validate(cfg)
        bad = sorted(set(cfg.easel.curricula) - {"C1", "C2"})
        if bad:
            raise ValueError(f"easel.curricula: unknown {bad}; choose from C1, C2")

    def sft_rows(self, cfg: Any, system: str, toolbox_factory: ToolboxFactory) -> Rows:
        return easel_env.sft_rows(cfg, system)


# In `task_source` precedence order: an EASEL spec in a task's meta outranks a chain.
SOURCES: dict[str, Source] = {s.name: s for s in (Scripted(), Easel(), EaselData(), CanvasCraft(), ShareGPT(), RLJson(), Mixed())}


def get_source(name: str) -> Source:
    """The source registered as `name`; ValueError for an unknown one."""
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown data.format {name!r}; choose from {', '.join(SOURCES)}") from None


def source_of(cfg: Any) -> Source:
    """The source a training config reads (`data.format`)."""
    return get_source(cfg.data.format)


def task_source(task: Task) -> str:
    """The source a task came from: `meta["source"]` when its loader set it, else the source whose
    `meta_key` its meta holds (an EASEL spec: easel; a CanvasCraft chain: canvascraft), else its family."""
    meta = task.meta or {}
    if meta.get("source"):
        return str(meta["source"])
    return next((s.name for s in SOURCES.values() if s.meta_key and s.meta_key in meta), task.family or "unknown")
