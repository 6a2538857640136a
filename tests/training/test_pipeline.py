"""The main-job command end to end with minimal budgets (the real budgets run in benchmarks/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from canvasagent.cli import main
from toolserver.client import make_toolbox
from canvasagent.pipeline import PipelineConfig
from canvascraft.chains import ChainSet

DEFAULT_YAML = Path(__file__).parents[2] / "configs" / "pipeline" / "default.yaml"


def _tiny_argv(out, config=None) -> list[str]:
    return ["pipeline", "--out", str(out), "--n-eval", "2", *(["--config", str(config)] if config else []),
            "--sft-set", "optim.max_steps=2", "--sft-set", "data.n_train=4", "--sft-set", "run.save_steps=0", "--sft-set", "run.logging_steps=1",
            "--grpo-set", "optim.max_steps=1", "--grpo-set", "data.n_train=2", "--grpo-set", "run.save_steps=0",
            "--grpo-set", "grpo.max_completion_length=64", "--grpo-set", "grpo.max_turns=2", "--n-eval-base", "1"]


def test_default_config_is_the_mixed_main_job():
    cfg = PipelineConfig.load()
    assert cfg.data == "mixed" and cfg.sources == ("scripted", "canvascraft")
    # The YAML and the dataclass defaults (used by benchmarks) describe the same job.
    assert cfg == PipelineConfig()
    with pytest.raises(ValueError, match="unknown pipeline data"):
        PipelineConfig.load(data="easel")


@pytest.mark.slow
def test_pipeline_mixed_builds_canvascraft_trains_on_both_and_reports_per_source(tmp_path, capsys):
    # The default config with a CanvasCraft build small enough for a test: single-tool chains
    # over a pure tool and a real offline model tool (OCR).
    cfg = yaml.safe_load(DEFAULT_YAML.read_text())
    cfg.update(cc_sft_n=3, cc_rl_n=2, cc_eval_n=2, cc_mix={"single": 0, "hard": 0, "Flip": 1, "OCR": 1})
    (tmp_path / "pipe.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "main"
    argv = _tiny_argv(out, tmp_path / "pipe.yaml")
    assert main(argv) == 0
    for stage in ("data", "eval_base", "sft", "eval_sft", "grpo", "eval_grpo", "report"):
        assert (out / stage / "done.json").exists(), stage
    data = json.loads((out / "data" / "done.json").read_text())
    assert data["sources"] == ["scripted", "canvascraft"] and data["n_eval"] == {"scripted": 2, "canvascraft": 2}
    assert set(data["eval_chains"]["canvascraft"]) <= {"Flip", "OCR"}
    # Both sources reach training: the CanvasCraft rows plus the scripted ones.
    from canvasagent.training.config import TrainConfig
    from canvasagent.training.data import grpo_rows

    grpo_cfg = TrainConfig.load("grpo_tiny_cpu", {"data.format": "mixed", "data.path": str(out / "data/canvascraft/rl"), "data.n_train": 2})
    tasks = [json.loads(r["task"]) for r in grpo_rows(grpo_cfg, lambda: make_toolbox("offline"))]
    assert len(tasks) == 4 and sum(t["id"].startswith("rl-train") for t in tasks) == 2
    ev = json.loads((out / "eval_sft" / "done.json").read_text())
    assert ev["metrics"]["n_tasks"] == 4 and {s: m["metrics"]["n_tasks"] for s, m in ev["by_source"].items()} == {"scripted": 2, "canvascraft": 2}
    metrics = json.loads((out / "report" / "metrics.json").read_text())["metrics"]
    for stage in ("after SFT", "after GRPO"):
        for suffix in ("", " [sampled]"):
            assert {f"{stage}{suffix}", f"{stage}{suffix}: scripted", f"{stage}{suffix}: canvascraft"} <= set(metrics)
    assert "before SFT (base): canvascraft" in metrics
    report = (out / "report" / "report.md").read_text()
    assert "after GRPO: canvascraft" in report
    assert (out / "report" / "sft_curves.png").exists() and (out / "report" / "grpo_curves.png").exists()
    capsys.readouterr()
    # A rerun skips every finished stage (and only redraws the report).
    assert main(argv) == 0
    assert json.loads((out / "sft" / "done.json").read_text())["global_step"] == 2


@pytest.mark.slow
def test_pipeline_scripted_only_runs(tmp_path):
    out = tmp_path / "main"
    assert main(_tiny_argv(out) + ["--data", "scripted"]) == 0
    metrics = json.loads((out / "report" / "metrics.json").read_text())["metrics"]
    # One source: no per-source rows.
    assert {"before SFT (base)", "after SFT", "after GRPO", "before SFT (base) [sampled]", "after SFT [sampled]",
            "after GRPO [sampled]"} == set(metrics)


def test_cli_overrides_merge_over_the_config_files():
    # `--grpo-set optim.learning_rate=...` must not drop the file's tools config or model size.
    cfg = PipelineConfig.load("testbed", grpo_overrides={"optim.learning_rate": 5e-5}, sft_overrides={"optim.max_steps": 10})
    assert cfg.grpo_overrides == {"tools.config": "offline_small", "model.tiny_size": "s", "optim.per_device_train_batch_size": 4,
                                  "optim.gradient_accumulation_steps": 4, "optim.learning_rate": 5e-5}
    assert cfg.sft_overrides["optim.max_steps"] == 10 and cfg.sft_overrides["model.tiny_size"] == "s"
    default = PipelineConfig.load(grpo_overrides={"tools.config": "offline"})
    assert default.grpo_overrides == {"tools.config": "offline", "optim.per_device_train_batch_size": 4,
                                      "optim.gradient_accumulation_steps": 4} and default.sft_overrides == {"tools.config": "offline_small"}


def test_held_out_tasks_are_read_once_and_their_toolbox_is_closed(tmp_path, monkeypatch):
    """`Pipeline.eval_tasks` is asked for by every evaluation stage and every ablation cell; the
    tasks are drawn once per pipeline, and the toolbox that attached their references is closed."""
    import canvasagent.training.common as common
    from canvasagent.pipeline import Pipeline
    from canvasagent.training.sources import Scripted

    real_factory, real_eval = common.toolbox_factory, Scripted.eval_tasks
    made, closed, draws = [], [], []

    def factory(cfg):
        make = real_factory(cfg)

        def build():
            tb = make()
            close = tb.close
            tb.close = lambda: (closed.append(tb), close())[1]
            made.append(tb)
            return tb
        return build

    def eval_tasks(self, *a, **kw):
        draws.append(1)
        return real_eval(self, *a, **kw)

    monkeypatch.setattr(common, "toolbox_factory", factory)
    monkeypatch.setattr(Scripted, "eval_tasks", eval_tasks)
    pipe = Pipeline(PipelineConfig.load(data="scripted", n_eval=2, out=str(tmp_path / "p")))
    first, sources = pipe.eval_tasks()
    again, _ = pipe.eval_tasks(limit=1)
    assert sources == ["scripted", "scripted"] and [t.id for t in again] == [first[0].id]
    assert len(draws) == 1
    assert len(made) == 1 and closed == made


def test_evaluation_is_scored_by_eval_preset_while_grpo_trains_on_its_own(tmp_path, monkeypatch):
    """testbed_try_chains trains GRPO on paper-try-chains and evaluates every stage with paper."""
    from canvasagent.pipeline import Pipeline

    seen = []

    def evaluate_checkpoint(model_dir, tasks, scorer, *a, **kw):
        seen.append(scorer.source)
        return {}

    monkeypatch.setattr("canvasagent.training.evaluate.evaluate_checkpoint", evaluate_checkpoint)
    cfg = PipelineConfig.load("testbed_try_chains", out=str(tmp_path / "p"), data="scripted", n_eval=1)
    pipe = Pipeline(cfg)
    assert pipe.grpo.grpo.reward_preset == "paper-try-chains" and cfg.eval_preset == "paper"
    pipe._evaluate(tmp_path / "ckpt", "eval_sft")
    cfg.eval_preset = None
    Pipeline(cfg)._evaluate(tmp_path / "ckpt", "eval_sft")
    assert seen == ["rewards:paper", "rewards:paper-try-chains"]


def test_a_config_extends_another_and_a_cycle_is_refused(tmp_path):
    """`extends`: the base's fields, the file's over them; override maps merge key by key."""
    base = PipelineConfig.load("testbed_more_chains")
    variant = PipelineConfig.load("testbed_try_chains")
    assert variant.grpo_overrides == {**base.grpo_overrides, "grpo.reward_preset": "paper-try-chains"}
    assert variant.sft_overrides == base.sft_overrides and variant.cc_mix == base.cc_mix and variant.cc_rl_n == 128
    flow = PipelineConfig.load("testbed_try_chains_flow")  # two levels of extends
    assert flow.grpo_overrides == {**base.grpo_overrides, "grpo.reward_preset": "paper-try-chains-flow"}
    assert flow.eval_preset == "paper" and flow.cc_mix == base.cc_mix
    assert PipelineConfig.load("testbed").cc_rl_n == 64 and PipelineConfig.load("testbed").cc_mix["offline"] == 0.1
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"extends": str(b), "seed": 1}))
    b.write_text(yaml.safe_dump({"extends": str(a)}))
    with pytest.raises(ValueError, match="extends itself"):
        PipelineConfig.load(a)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs" / "pipeline").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_pipeline_config_loads_and_validates(path):
    """A pipeline config in configs/pipeline/ that fails to load, names an unknown source or has
    a mix key that names no chain or group is found here, not when its run builds data."""
    cfg = PipelineConfig.load(path.stem)
    cfg.validate()
    assert cfg.sources and cfg.n_eval_base >= 0
    chains = ChainSet.load(cfg.cc_chains)
    for mix in (cfg.cc_mix, cfg.cc_rl_mix):
        chains.with_weights(mix)


def test_the_precision_testbed_adds_one_call_tasks_to_grpo_and_eval_only():
    """testbed_precision keeps testbed_sft1024_chains' SFT set and adds single Crop, Rotate and
    Overlay tasks to the GRPO and held-out mix, never SR."""
    base, prec = PipelineConfig.load("testbed_sft1024_chains"), PipelineConfig.load("testbed_precision")
    assert prec.cc_mix == base.cc_mix and prec.cc_sft_n == base.cc_sft_n == 1024
    assert all(prec.cc_rl_mix[k] == 1 for k in ("offline", "offline_single", "Rotate", "Overlay"))
    assert prec.cc_mix["SR"] == prec.cc_rl_mix["Crop+SR"] == prec.cc_rl_mix["Rotate+Crop+SR"] == 0


def test_cc_eval_seed_gives_each_seed_its_own_held_out_split(tmp_path):
    """Without `cc_eval_seed` every pipeline seed is evaluated on the build's eval_seed split; with
    it, seed s gets the split drawn with cc_eval_seed + s (real builds, one tiny task each)."""
    from canvasagent.pipeline import Pipeline

    def eval_ids(seed, eval_seed):
        cfg = PipelineConfig.load("testbed", out=str(tmp_path / f"s{seed}-{eval_seed}"), seed=seed, cc_sft_n=1, cc_rl_n=1,
                                  cc_eval_n=2, cc_eval_seed=eval_seed, cc_mix={"single": 0, "hard": 0, "offline": 0, "Flip": 1})
        assert cfg.sources == ("canvascraft",)
        pipe = Pipeline(cfg)
        pipe.stage_data()
        return [t.id for t in pipe.eval_tasks()[0]]

    shared = eval_ids(0, None)
    assert len(shared) == 2 and all(i.startswith("rl-eval-1234567-") for i in shared)
    own0, own1 = eval_ids(0, 500), eval_ids(1, 500)
    assert all(i.startswith("rl-eval-500-") for i in own0) and all(i.startswith("rl-eval-501-") for i in own1)


def test_evaluated_replies_are_as_long_as_grpo_rollout_replies_unless_set():
    """`eval_max_new_tokens: null` lets an evaluated reply run to the GRPO run's
    max_completion_length; an int sets the limit itself."""
    from canvasagent.pipeline import Pipeline

    follows = Pipeline(PipelineConfig.load("testbed_precision_sft800_rl360_heldout96_len384"))
    assert follows.cfg.eval_max_new_tokens is None
    assert follows.eval_max_new_tokens == follows.grpo.grpo.max_completion_length == 384
    fixed = Pipeline(PipelineConfig.load("testbed_precision_sft800_rl360_heldout96"))
    assert fixed.eval_max_new_tokens == 96
    override = Pipeline(PipelineConfig.load("testbed_precision_sft800_rl360_heldout96_len384", eval_max_new_tokens=64))
    assert override.eval_max_new_tokens == 64
    with pytest.raises(ValueError, match="eval_max_new_tokens must be at least 1"):
        PipelineConfig.load("testbed_precision_sft800_rl360_heldout96_len384", eval_max_new_tokens=0)


def test_an_evaluation_begun_with_another_reply_limit_is_refused_finished_or_not(tmp_path):
    """An eval stage begun at 96 tokens is neither paired with stages of a 384-token config when
    done nor finished at 384 when interrupted: resuming names the stage and both limits. The same
    config resumes it; a record from before stages kept their inputs passes."""
    from canvasagent.pipeline import Pipeline
    from canvasagent.stage_runner import StaleStage

    at96 = Pipeline(PipelineConfig.load("testbed_precision_sft800_rl360_heldout96", out=str(tmp_path)))
    at384 = PipelineConfig.load("testbed_precision_sft800_rl360_heldout96_len384", out=str(tmp_path))
    stage = tmp_path / "eval_sft"
    stage.mkdir()
    (stage / "inputs.json").write_text(json.dumps(at96.eval_inputs("eval_sft")))  # as the stage left it when killed
    with pytest.raises(StaleStage, match=r"eval_sft holds work done under other inputs.*max_new_tokens: 96 there, 384 now"):
        Pipeline(at384).run(only=["eval_sft"])
    (stage / "done.json").write_text(json.dumps({"max_new_tokens": 96, "per_task": []}))
    with pytest.raises(StaleStage, match="max_new_tokens: 96 there, 384 now"):
        Pipeline(at384).run(only=["eval_sft"])
    assert at96.run(only=["eval_sft"])["eval_sft"] == {"max_new_tokens": 96, "per_task": []}
    (stage / "inputs.json").unlink()
    assert Pipeline(at384).run(only=["eval_sft"])["eval_sft"] == {"max_new_tokens": 96, "per_task": []}


@pytest.mark.parametrize("preset", [None, "1"])
def test_the_job_uses_every_usable_core_unless_threads_are_set(preset, tmp_path, monkeypatch):
    import os

    import canvasagent.pipeline as pipeline_mod
    from canvasagent.cli.pipeline_cmd import usable_cpus

    if preset is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", preset)
    seen = {}
    monkeypatch.setattr(pipeline_mod, "run_pipeline", lambda cfg, stages: seen.setdefault("threads", os.environ["OMP_NUM_THREADS"]) and {})
    assert main(["pipeline", "--out", str(tmp_path / "run")]) == 0
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    assert seen["threads"] == (str(usable_cpus()) if preset is None else preset)
