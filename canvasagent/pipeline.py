"""The main job as one resumable command: data -> SFT -> GRPO -> held-out evaluation -> report.

    canvasagent pipeline --out runs/main

Runs offline on a CPU machine with the tiny Qwen3-VL and only tools that really run offline.
Each stage writes `<out>/<stage>/done.json` when it finishes; a rerun skips finished stages, and
training stages resume from their last checkpoint, so an interrupted pipeline loses at most the
steps since the last save.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

STAGES = ("data", "eval_base", "sft", "eval_sft", "grpo", "eval_grpo", "report")


@dataclass
class PipelineConfig:
    out: str = "runs/main"
    seed: int = 0
    sft_config: str = "sft_tiny_cpu"
    grpo_config: str = "grpo_tiny_cpu"
    n_eval: int = 24  # held-out templated tasks (a task seed never used for training)
    # The untrained model rambles to max_new_tokens every turn (slow on CPU) and scores ~0 anyway:
    # it is evaluated on the first n_eval_base held-out tasks only.
    n_eval_base: int = 8
    eval_max_new_tokens: int = 96
    # Besides greedy decoding, trained policies are also evaluated by sampling at the training
    # temperature (what GRPO optimises): `eval_samples` episodes per task.
    eval_samples: int = 4
    sft_overrides: dict[str, Any] = field(default_factory=dict)
    grpo_overrides: dict[str, Any] = field(default_factory=dict)
    skip_base_eval: bool = False
    # scripted: templated Crop/Flip/Rotate tasks with reference solutions (learnable by the tiny
    # model in minutes). canvascraft: a small CanvasCraft-SFT/RL build restricted to the tools
    # that really run offline; held-out tasks are its RL eval split.
    data: str = "scripted"
    cc_sft_n: int = 64
    cc_rl_n: int = 32
    cc_eval_n: int = 16


def offline_tools() -> list[str]:
    """Tools with real offline backends, the only ones the CPU pipeline uses: the registry's pure
    tools plus the model tools `configs/tools/offline.yaml` gives a backend (OCR, SR), in registry
    order. Derived, so the registry stays the one tool list."""
    from canvasagent.config import ToolsConfig
    from toolserver.registry import Backend, tools

    served = set(ToolsConfig.load("offline").backends)
    return [t.name for t in tools("canvasagent") if t.backend is Backend.PURE or t.name in served]


def _done(path: Path) -> dict[str, Any] | None:
    f = path / "done.json"
    return json.loads(f.read_text()) if f.exists() else None


def _mark(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "done.json.tmp"
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path / "done.json")
    return data


class Pipeline:
    def __init__(self, cfg: PipelineConfig):
        from canvasagent.training.config import TrainConfig

        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        seed = cfg.seed
        data: dict[str, Any] = {}
        if cfg.data == "canvascraft":
            data = {"tools.names": offline_tools(), "data.format": "canvascraft"}
        elif cfg.data != "scripted":
            raise ValueError(f"unknown pipeline data {cfg.data!r} (scripted | canvascraft)")
        cc = self.out / "data" / "canvascraft"
        self.sft = TrainConfig.load(cfg.sft_config, {
            "run.output_dir": str(self.out / "sft"), "run.seed": seed, "model.tiny_seed": seed,
            "data.seed": 1000 * seed, **data, **({"data.path": str(cc / "sft")} if data else {}), **cfg.sft_overrides,
        })
        self.grpo = TrainConfig.load(cfg.grpo_config, {
            "run.output_dir": str(self.out / "grpo"), "run.seed": seed, "model.tiny_seed": seed,
            "data.seed": 1000 * seed + 1, "run.init_from": str(self.out / "sft" / "final"),
            **data, **({"data.path": str(cc / "rl")} if data else {}), **cfg.grpo_overrides,
        })
        self.timings: dict[str, float] = {}

    # -- stages ------------------------------------------------------------------------------------
    def _eval_tasks(self):
        from canvasagent.training.common import toolbox_factory
        from canvasagent.training.data import eval_tasks

        if self.cfg.data == "canvascraft":
            from canvascraft.build import shard_files
            from canvascraft.formats import read_rows
            from canvascraft.rl import task_of

            rows = read_rows(shard_files(self.out / "data" / "canvascraft" / "rl", "rl", "eval"))
            return [task_of(r) for r in rows][: self.cfg.n_eval]
        # Held out: a task seed no training stage uses.
        return eval_tasks(self.sft, self.cfg.n_eval, 1000 * self.cfg.seed + 999, toolbox_factory(self.sft)())

    def _build_canvascraft(self) -> dict[str, Any]:
        from canvascraft.build import load_build_config, run_build

        base = self.out / "data" / "canvascraft"
        out: dict[str, Any] = {}
        for kind, n, extra in (("sft", self.cfg.cc_sft_n, {}), ("rl", self.cfg.cc_rl_n, {"eval_n": self.cfg.cc_eval_n})):
            bcfg = load_build_config(kind, None, n=n, seed=self.cfg.seed, workers=1, tools_config="offline", **extra)
            run_build(kind, bcfg, str(base / kind), progress=False)  # resumable: finished shards are kept
            out[kind] = str(base / kind)
        return out

    def stage_data(self) -> dict[str, Any]:
        from canvasagent.training.data import scripted_tasks

        if self.cfg.data == "canvascraft":
            paths = self._build_canvascraft()
            eval_tasks = self._eval_tasks()
            return {"source": "canvascraft", "paths": paths, "n_eval": len(eval_tasks),
                    "eval_tools": sorted({t for task in eval_tasks for t in task.expected_tools})}

        eval_tasks = self._eval_tasks()
        train_ids = {t.id + t.instruction for t, _ in scripted_tasks(self.sft)}
        (self.out / "data").mkdir(parents=True, exist_ok=True)
        with open(self.out / "data" / "eval_tasks.jsonl", "w") as fh:
            for t in eval_tasks:
                d = t.to_dict()
                d["meta"] = {k: v for k, v in d["meta"].items() if k != "reference_images"}
                fh.write(json.dumps(d) + "\n")
        return {"n_sft": self.sft.data.n_train, "n_grpo": self.grpo.data.n_train, "n_eval": len(eval_tasks),
                "source": self.sft.data.format, "eval_overlap_instructions": sum(t.id + t.instruction in train_ids for t in eval_tasks)}

    def _evaluate(self, model_dir: Path, name: str, limit: int | None = None, sampled: bool = True) -> dict[str, Any]:
        from canvasagent.models import load_policy, load_processor
        from canvasagent.training.common import workspace
        from canvasagent.training.evaluate import evaluate_model
        from canvasagent.training.rewarding import make_scorer

        ws = workspace(self.sft)
        toolbox = ws.env_cls.toolbox()
        scorer = make_scorer(self.grpo.grpo.reward_preset, self.grpo.grpo.judge, toolbox)
        tasks = self._eval_tasks()[:limit]
        model, processor = load_policy(str(model_dir)), load_processor(str(model_dir))
        common = dict(scorer=scorer, toolbox=toolbox, tool_fns=ws.tool_fns, max_turns=self.grpo.grpo.max_turns,
                      max_new_tokens=self.cfg.eval_max_new_tokens, model=model, processor=processor)
        res = evaluate_model(model_dir, tasks, out_dir=self.out / name / "trajectories", **common)
        out = {"model": str(model_dir), "metrics": res.metrics, "per_task": res.scores, "scorer": scorer.source}
        if sampled and self.cfg.eval_samples > 0:
            smp = evaluate_model(model_dir, tasks, temperature=self.grpo.grpo.temperature, samples=self.cfg.eval_samples,
                                 seed=self.cfg.seed, **common)
            out.update(metrics_sampled=smp.metrics, per_task_sampled=smp.scores)
        return out

    def stage_eval_base(self) -> dict[str, Any]:
        from canvasagent.training.common import resolve_model_path

        return self._evaluate(Path(resolve_model_path(self.sft)), "eval_base", limit=self.cfg.n_eval_base, sampled=False)

    def stage_sft(self) -> dict[str, Any]:
        from canvasagent.training import run

        self.sft.run.resume = True  # a no-op on a fresh dir; continues an interrupted stage
        s = run(self.sft)
        return {k: v for k, v in s.items() if k != "log_history"}

    def stage_eval_sft(self) -> dict[str, Any]:
        return self._evaluate(self.out / "sft" / "final", "eval_sft")

    def stage_grpo(self) -> dict[str, Any]:
        from canvasagent.training import run

        self.grpo.run.resume = True
        s = run(self.grpo)
        return {k: v for k, v in s.items() if k != "log_history"}

    def stage_eval_grpo(self) -> dict[str, Any]:
        return self._evaluate(self.out / "grpo" / "final", "eval_grpo")

    def stage_report(self) -> dict[str, Any]:
        from canvasagent.training.report import write_report

        results = {s: _done(self.out / s) for s in STAGES if s != "report"}
        return write_report(self.out, results)

    # -- driver ------------------------------------------------------------------------------------
    def run(self, only: list[str] | None = None, on_stage: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "pipeline_config.json").write_text(json.dumps(asdict(self.cfg), indent=2))
        results: dict[str, Any] = {}
        for stage in STAGES:
            if only and stage not in only:
                continue
            if stage == "eval_base" and self.cfg.skip_base_eval:
                continue
            prev = _done(self.out / stage)
            if prev is not None and stage != "report":
                log.info("[pipeline] %s: done already, skipping", stage)
                results[stage] = prev
                continue
            log.info("[pipeline] %s: starting", stage)
            t0 = time.perf_counter()
            data = getattr(self, f"stage_{stage}")()
            data["seconds"] = round(time.perf_counter() - t0, 1)
            results[stage] = _mark(self.out / stage, data)
            log.info("[pipeline] %s: finished in %.1fs", stage, data["seconds"])
            if on_stage:
                on_stage(stage, data)
        return results


def run_pipeline(cfg: PipelineConfig, only: list[str] | None = None) -> dict[str, Any]:
    return Pipeline(cfg).run(only)
