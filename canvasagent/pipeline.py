"""The main job as one resumable command: data -> SFT -> GRPO -> held-out evaluation -> report.

    canvasagent pipeline --out runs/main

Runs offline on a CPU machine with the tiny Qwen3-VL and only tools that really run offline.
By default (`data: mixed`, configs/pipeline/default.yaml) it trains on two sources together: the
scripted Crop/Flip/Rotate tasks and a small CanvasCraft build of single-tool offline chains
(OCR, Flip, Rotate, SR); held-out tasks of both are evaluated and reported per source.
The stages run through `canvasagent.stage_runner.StagedRun`: each writes `<out>/<stage>/done.json`
when it finishes; a rerun skips finished stages, and training stages resume from their last
checkpoint, so an interrupted pipeline loses at most the steps since the last save.
With `grpo_tasks: unsolved`, an `unsolved_tasks` stage between the SFT evaluation and GRPO
evaluates the SFT checkpoint on the GRPO training tasks, and GRPO trains only on those it does
not solve yet (`canvasagent.training.unsolved`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from canvasagent.stage_runner import StagedRun, train

log = logging.getLogger(__name__)


STAGES = ("data", "eval_base", "sft", "eval_sft", "unsolved_tasks", "grpo", "eval_grpo", "report")


DATA_MODES = ("mixed", "scripted", "canvascraft")  # training data formats (sources.SOURCES) the pipeline runs
GRPO_TASKS = ("all", "unsolved")
# Stages that evaluate a checkpoint: each is refused when rerun under other `eval_inputs`.
EVALUATIONS = ("eval_base", "eval_sft", "unsolved_tasks", "eval_grpo")


@dataclass
class PipelineConfig:
    """configs/pipeline/default.yaml documents every field; these defaults mirror it."""

    out: str = "runs/main"
    seed: int = 0
    sft_config: str = "sft_tiny_cpu"
    grpo_config: str = "grpo_tiny_cpu"
    data: str = "mixed"  # mixed | scripted | canvascraft
    n_eval: int = 24  # held-out scripted tasks (a task seed never used for training)
    # The untrained model rambles to max_new_tokens every turn (slow on CPU) and scores ~0 anyway:
    # it is evaluated on the first n_eval_base held-out tasks of each source only.
    n_eval_base: int = 8
    # Tokens one evaluated reply may have; None: the GRPO run's max_completion_length, so a reply a
    # rollout can finish is not cut short in evaluation (GRPO also caps the episode at that total).
    eval_max_new_tokens: int | None = 96
    # Besides greedy decoding, trained policies are also evaluated by sampling at the training
    # temperature (what GRPO optimises): `eval_samples` episodes per task.
    eval_samples: int = 4
    # The reward preset of every evaluation stage; None: the GRPO run's. Set it to train GRPO on
    # one preset (`--grpo-set grpo.reward_preset=...`) and still compare the stages on another.
    eval_preset: str | None = None
    skip_base_eval: bool = False
    # The GRPO training tasks: all, or unsolved: only those the SFT checkpoint does not solve yet
    # (its greedy episode or one of max(eval_samples, 1) sampled ones fails a check), found by the
    # `unsolved_tasks` stage (`canvasagent.training.unsolved`), which sets GRPO's data.task_ids.
    grpo_tasks: str = "all"
    # The toolbox of every stage: images over 400x400 refused (configs/tools/offline_small.yaml).
    sft_overrides: dict[str, Any] = field(default_factory=lambda: {"tools.config": "offline_small"})
    # GRPO's loss on 4 of a step's 16 rollouts at a time: the same step at a lower memory peak.
    grpo_overrides: dict[str, Any] = field(default_factory=lambda: {
        "tools.config": "offline_small", "optim.per_device_train_batch_size": 4, "optim.gradient_accumulation_steps": 4})
    # The CanvasCraft build, restricted to tools that really run offline.
    cc_sft_n: int = 64
    cc_rl_n: int = 48
    cc_eval_n: int = 16  # its RL eval split: the held-out CanvasCraft tasks
    # None: the build config's eval_seed, so every pipeline seed is evaluated on the same tasks;
    # an int: the split is drawn with cc_eval_seed + seed, so each seed has held-out tasks of its own.
    cc_eval_seed: int | None = None
    cc_chains: list[str] = field(default_factory=lambda: ["chains"])  # chain files under configs/canvascraft/
    cc_mix: dict[str, float] = field(default_factory=lambda: {"single": 0, "hard": 0, "OCR": 1, "Flip": 1, "Rotate": 1, "SR": 1})
    cc_rl_mix: dict[str, float] = field(default_factory=dict)  # the RL build's mix; {} = cc_mix
    cc_rl_targets: dict[str, dict[str, float]] = field(default_factory=lambda: {
        "reasoning": {"easy": 1}, "length": {"easy": 1}, "diversity": {"easy": 1}})
    cc_sr_input_side: int = 64

    @classmethod
    def load(cls, name_or_path: str | Path = "default", **overrides: Any) -> "PipelineConfig":
        """A configs/pipeline/ YAML (or a path); keyword overrides that are not None win. The
        `sft_overrides` / `grpo_overrides` given here are merged over the file's (or the default's),
        key by key, so `--grpo-set optim.learning_rate=...` keeps the file's tools config. A file
        with `extends: <name or path>` is that config with the file's fields over it: the two
        override maps merged key by key, every other field replaced whole. Refuses a cycle."""
        from toolserver.config import from_dict

        data = _read_pipeline_yaml(name_or_path)
        for key in ("sft_overrides", "grpo_overrides"):
            if overrides.get(key) is not None:
                base = data[key] if data.get(key) is not None else cls.__dataclass_fields__[key].default_factory()
                overrides[key] = {**base, **overrides[key]}
        data.update({k: v for k, v in overrides.items() if v is not None})
        cfg = from_dict(cls, data)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.data not in DATA_MODES:
            raise ValueError(f"unknown pipeline data {self.data!r} ({' | '.join(DATA_MODES)})")
        if self.eval_max_new_tokens is not None and self.eval_max_new_tokens < 1:
            raise ValueError(f"eval_max_new_tokens must be at least 1 or null, not {self.eval_max_new_tokens}")
        if self.grpo_tasks not in GRPO_TASKS:
            raise ValueError(f"unknown grpo_tasks {self.grpo_tasks!r} ({' | '.join(GRPO_TASKS)})")
        if self.grpo_tasks == "unsolved" and "data.task_ids" in self.grpo_overrides:
            raise ValueError("grpo_tasks: unsolved writes GRPO's data.task_ids itself; drop data.task_ids from grpo_overrides "
                             "or set grpo_tasks: all")
        unknown = set(self.cc_rl_targets) - {"reasoning", "length", "diversity"}
        if unknown:
            raise ValueError(f"cc_rl_targets: unknown axes {sorted(unknown)} (reasoning, length, diversity)")

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources it trains and evaluates on: a composite source's parts (`sources.Mixed.parts`), else itself."""
        from canvasagent.training.sources import get_source

        return tuple(getattr(get_source(self.data), "parts", (self.data,)))


def _read_pipeline_yaml(name_or_path: str | Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A configs/pipeline/ YAML as a dict, with its `extends` chain resolved (see `PipelineConfig.load`)."""
    from toolserver.config import find_config, load_yaml

    path = find_config(name_or_path, "pipeline").resolve()
    if path in seen:
        raise ValueError(f"pipeline config {path} extends itself: {' -> '.join(str(p) for p in (*seen, path))}")
    data = load_yaml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    out = _read_pipeline_yaml(base, (*seen, path))
    for key in ("sft_overrides", "grpo_overrides"):
        if data.get(key) is not None and out.get(key) is not None:
            data[key] = {**out[key], **data[key]}
    out.update(data)
    return out


def offline_tools() -> list[str]:
    """Tools with real offline backends, the only ones the CPU pipeline uses: the registry's pure
    tools plus the model tools `configs/tools/offline.yaml` gives a backend (OCR, SR), in registry
    order. Derived, so the registry stays the one tool list."""
    from toolserver.config import ToolsConfig
    from toolserver.registry import Backend, tools

    served = set(ToolsConfig.load("offline").backends)
    return [t.name for t in tools("canvasagent") if t.backend is Backend.PURE or t.name in served]


class Pipeline:
    def __init__(self, cfg: PipelineConfig):
        from canvasagent.training.config import TrainConfig

        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        self._tools: list[str] | None = None
        self._eval_cache: dict[str, list] | None = None
        seed = cfg.seed
        self.sft = TrainConfig.load(cfg.sft_config, {
            "run.output_dir": str(self.out / "sft"), "run.seed": seed, "model.tiny_seed": seed,
            "data.seed": 1000 * seed, **self.train_data("sft"), **cfg.sft_overrides,
        })
        self.grpo = TrainConfig.load(cfg.grpo_config, {
            "run.output_dir": str(self.out / "grpo"), "run.seed": seed, "model.tiny_seed": seed,
            "data.seed": 1000 * seed + 1, "run.init_from": str(self.out / "sft" / "final"),
            **self.train_data("grpo"), **cfg.grpo_overrides,
            **({"data.task_ids": str(self.out / "unsolved_tasks" / "task_ids.txt")} if cfg.grpo_tasks == "unsolved" else {}),
        })
        self.stages = StagedRun(self.out, "pipeline")

    @property
    def eval_max_new_tokens(self) -> int:
        """The per-reply token limit of every evaluation stage (`PipelineConfig.eval_max_new_tokens`)."""
        return self.grpo.grpo.max_completion_length if self.cfg.eval_max_new_tokens is None else self.cfg.eval_max_new_tokens

    def train_data(self, kind: str) -> dict[str, Any]:
        """The training config fields that point a `kind` (sft | grpo) run at this pipeline's data:
        its data format, the CanvasCraft build under `<out>/data` and the tools its tasks use;
        {} when it trains on made tasks only (the training config's own data section)."""
        if "canvascraft" not in self.cfg.sources:
            return {}
        if self._tools is None:
            self._tools = self.policy_tools()
        return {"tools.names": list(self._tools), "data.format": self.cfg.data,
                "data.path": str(self.out / "data" / "canvascraft" / ("sft" if kind == "sft" else "rl"))}

    def policy_tools(self) -> list[str]:
        """The offline tools the tasks use: those of the CanvasCraft chains the mix keeps, plus the
        scripted tasks' tools. Each tool schema lengthens every training sequence (7 tools: ~1350
        tokens per SFT row, the 5 the default mix needs: ~970), so unused tools are left out."""
        from canvascraft.chains import ChainSet
        from canvasagent.training.scripted import SCRIPTED_TOOLS

        offline = offline_tools()
        chains = ChainSet.load(self.cfg.cc_chains)
        used = {t for mix in (self.cfg.cc_mix, self.cfg.cc_rl_mix or self.cfg.cc_mix)
                for c in chains.with_weights(mix) if c.weight > 0 for t in c.tools} & set(offline)
        if "scripted" in self.cfg.sources:
            used |= set(SCRIPTED_TOOLS)
        return [t for t in offline if t in used]

    def _eval_sets(self) -> dict[str, list]:
        """Held-out tasks per source, in `cfg.sources` order, from the source registry: a build's whole
        eval split (`cc_eval_n` tasks), or `n_eval` made tasks drawn with a seed no training stage uses.
        Read once per pipeline (after the data stage has built what a source reads)."""
        from canvasagent.training.common import toolbox_factory
        from canvasagent.training.sources import get_source

        if self._eval_cache is None:
            cfg = replace(self.sft, data=replace(self.sft.data, path=str(self.out / "data" / "canvascraft" / "rl")))
            toolbox = toolbox_factory(self.sft)()
            try:
                self._eval_cache = {name: (src := get_source(name)).eval_tasks(cfg, None if src.needs_path else self.cfg.n_eval,
                                                                                1000 * self.cfg.seed + 999, toolbox)
                                    for name in self.cfg.sources}
            finally:
                toolbox.close()
        return {name: list(tasks) for name, tasks in self._eval_cache.items()}

    def eval_tasks(self, limit: int | None = None) -> tuple[list, list[str]]:
        """Every source's held-out tasks (the first `limit` of each) in `cfg.sources` order, and
        the source of each task."""
        tasks, sources = [], []
        for source, ts in self._eval_sets().items():
            tasks += ts[:limit]
            sources += [source] * len(ts[:limit])
        return tasks, sources

    def _build_canvascraft(self) -> dict[str, Any]:
        from canvascraft.build import load_build_config, run_build

        base = self.out / "data" / "canvascraft"
        c = self.cfg
        common = dict(seed=c.seed, workers=1, tools_config="offline", chains=c.cc_chains, sr_input_side=c.cc_sr_input_side)
        out: dict[str, Any] = {}
        for kind, extra in (("sft", {"n": c.cc_sft_n, "mix": c.cc_mix}),
                            ("rl", {"n": c.cc_rl_n, "eval_n": c.cc_eval_n, "mix": c.cc_rl_mix or c.cc_mix, **c.cc_rl_targets, "eval_seed": None if c.cc_eval_seed is None else c.cc_eval_seed + c.seed})):
            bcfg = load_build_config(kind, None, **common, **extra)
            manifest = run_build(kind, bcfg, str(base / kind), progress=False)  # resumable: finished shards are kept
            out[kind] = {"path": str(base / kind), "rows": {k: v["rows"] for k, v in manifest["shards"].items()}}
        return out

    def stage_data(self) -> dict[str, Any]:
        from canvasagent.training.data import scripted_tasks

        out: dict[str, Any] = {"source": self.cfg.data, "sources": list(self.cfg.sources)}
        if "canvascraft" in self.cfg.sources:
            out["canvascraft"] = self._build_canvascraft()
        sets = self._eval_sets()
        if "scripted" in sets:
            train_ids = {t.id + t.instruction for t, _ in scripted_tasks(self.sft)}
            out["scripted"] = {"n_sft": self.sft.data.n_train, "n_grpo": self.grpo.data.n_train,
                               "eval_overlap_instructions": sum(t.id + t.instruction in train_ids for t in sets["scripted"])}
        (self.out / "data").mkdir(parents=True, exist_ok=True)
        with open(self.out / "data" / "eval_tasks.jsonl", "w") as fh:
            for source, tasks in sets.items():
                for t in tasks:
                    d = t.to_dict()
                    d["meta"] = {**{k: v for k, v in d["meta"].items() if k != "reference_images"}, "source": source}
                    fh.write(json.dumps(d, default=str) + "\n")
        out["n_eval"] = {source: len(tasks) for source, tasks in sets.items()}
        out["eval_chains"] = {source: dict(Counter("+".join(t.expected_tools) for t in tasks)) for source, tasks in sets.items()}
        return out

    def _run_evaluation(self, model_dir: Path, stage: str, tasks_of: Callable[[Any], list]) -> tuple[dict[str, Any], Any, list]:
        """`evaluate_checkpoint` of `model_dir` on `tasks_of(toolbox)` under the stage's `eval_inputs`,
        into `<out>/<stage>/greedy|sampled` (resumable per task); returns its results by mode, the
        scorer and the tasks. The one place a stage's inputs become evaluation arguments."""
        from canvasagent.training.common import workspace
        from canvasagent.training.evaluate import evaluate_checkpoint
        from canvasagent.training.rewarding import make_scorer

        ws, e = workspace(self.sft), self.eval_inputs(stage)
        toolbox = ws.env_cls.toolbox()
        try:
            tasks = tasks_of(toolbox)
            scorer = make_scorer(e["preset"], e["judge"], toolbox)
            res = evaluate_checkpoint(model_dir, tasks, scorer, toolbox, ws.tool_fns, self.out / stage, max_turns=e["max_turns"],
                                      max_new_tokens=e["max_new_tokens"], temperature=e["temperature"], samples=e["samples"],
                                      seed=e["seed"], image_budget=e["image_budget"])
        finally:
            toolbox.close()
        return res, scorer, tasks

    def _evaluate(self, model_dir: Path, name: str) -> dict[str, Any]:
        """All held-out tasks (the first `limit` of each source for eval_base) in one
        `evaluate_checkpoint` run under the stage's `eval_inputs` (resumable, under
        <stage>/greedy|sampled); metrics overall and per source."""
        e = self.eval_inputs(name)
        sources = self.eval_tasks(e["limit"])[1]
        res, scorer, _ = self._run_evaluation(model_dir, name, lambda _toolbox: self.eval_tasks(e["limit"])[0])
        index = {s: [i for i, x in enumerate(sources) if x == s] for s in dict.fromkeys(sources)}
        out: dict[str, Any] = {"model": str(model_dir), "scorer": scorer.source, "task_sources": sources,
                               "max_new_tokens": e["max_new_tokens"], "by_source": {s: {} for s in index}}
        for mode, suffix in (("greedy", ""), ("sampled", "_sampled")):
            if mode in res:
                out.update({f"metrics{suffix}": res[mode].metrics, f"per_task{suffix}": res[mode].scores})
                for s, ix in index.items():
                    out["by_source"][s][f"metrics{suffix}"] = res[mode].metrics_for(ix)
        return out

    def stage_unsolved_tasks(self, checkpoint: Path | None = None) -> dict[str, Any]:
        """The SFT checkpoint (default `<out>/sft/final`) on every GRPO training task
        (`Source.train_tasks`), under this stage's `eval_inputs`: the ids of those it does not solve
        go to `unsolved_tasks/task_ids.txt`, which GRPO's data.task_ids names
        (`canvasagent.training.unsolved`)."""
        from canvasagent.training.sources import source_of
        from canvasagent.training.unsolved import write_unsolved

        checkpoint = checkpoint or self.out / "sft" / "final"
        every = replace(self.grpo, data=replace(self.grpo.data, task_ids=None))
        res, _, tasks = self._run_evaluation(checkpoint, "unsolved_tasks", lambda toolbox: source_of(every).train_tasks(every, toolbox))
        e = self.eval_inputs("unsolved_tasks")
        return write_unsolved(checkpoint, tasks, res, self.out / "unsolved_tasks", e["samples"], e["temperature"])

    def stage_eval_base(self) -> dict[str, Any]:
        from canvasagent.training.common import resolve_model_path

        return self._evaluate(Path(resolve_model_path(self.sft)), "eval_base")

    def stage_report(self) -> dict[str, Any]:
        from canvasagent.training.report import write_report

        results = {s: self.stages.done(s) for s in STAGES if s != "report"}
        return write_report(self.out, results)

    def run(self, only: list[str] | None = None, isolate: bool = True) -> dict[str, Any]:
        """Run the stages not done yet, in order; the report is redrawn every time. With `isolate`
        every stage but the report runs in a fresh subprocess, so what it loaded is gone before the
        next one starts. Each stage's `done.json` records its time and the peak RSS of this process
        plus the stage's subprocess while it ran: `peak_rss_mb`, `peak_anon_mb`."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "pipeline_config.json").write_text(json.dumps(asdict(self.cfg), indent=2))
        plan = {"data": (self.stage_data,), "eval_base": (self.stage_eval_base,), "sft": (train, self.sft),
                "eval_sft": (self._evaluate, self.out / "sft" / "final", "eval_sft"),
                "unsolved_tasks": (self.stage_unsolved_tasks,), "grpo": (train, self.grpo),
                "eval_grpo": (self._evaluate, self.out / "grpo" / "final", "eval_grpo"), "report": (self.stage_report,)}
        results: dict[str, Any] = {}
        for stage in STAGES:
            if ((only and stage not in only) or (stage == "eval_base" and self.cfg.skip_base_eval)
                    or (stage == "unsolved_tasks" and self.cfg.grpo_tasks != "unsolved")):
                continue
            fn, *args = plan[stage]
            results[stage] = self.stages.run(stage, fn, *args, isolate=isolate and stage != "report", rerun=stage == "report",
                                             inputs=self.eval_inputs(stage) if stage in EVALUATIONS else None)
        return results

    def eval_inputs(self, stage: str) -> dict[str, Any]:
        """What an evaluation stage's scores depend on besides its checkpoint and its tasks: its
        stage is refused when these differ from the ones it started with (`StaleStage`), so every
        stage paired in a report cut, sampled and scored replies alike. `unsolved_tasks` samples at
        least one episode a task, so a task is solved only if sampling solves it too."""
        samples = max(self.cfg.eval_samples, 1) if stage == "unsolved_tasks" else self.cfg.eval_samples
        return {"max_new_tokens": self.eval_max_new_tokens, "max_turns": self.grpo.grpo.max_turns,
                "temperature": self.grpo.grpo.temperature, "samples": samples, "seed": self.cfg.seed,
                "preset": self.cfg.eval_preset or self.grpo.grpo.reward_preset, "judge": self.grpo.grpo.judge,
                "image_budget": self.grpo.image_budget, "limit": self.cfg.n_eval_base if stage == "eval_base" else None}


def run_pipeline(cfg: PipelineConfig, only: list[str] | None = None, isolate: bool = True) -> dict[str, Any]:
    return Pipeline(cfg).run(only, isolate=isolate)
