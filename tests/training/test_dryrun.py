"""Every shipped training config validates with --dry-run (everything but the weights)."""

from __future__ import annotations

import pytest

from canvasagent.config import CONFIG_DIR
from canvasagent.train import main
from canvasagent.training import dry_run
from canvasagent.training.config import TrainConfig

CONFIGS = sorted(p.stem for p in (CONFIG_DIR / "train").glob("*.yaml"))


@pytest.mark.parametrize("name", CONFIGS)
def test_config_dry_run(name, tmp_path):
    cfg = TrainConfig.load(name, {"run.output_dir": str(tmp_path)})
    report = dry_run(cfg)
    assert report["ok"]
    assert report["tools"] and report["tools"] == report["tool_schemas"]
    if "qwen3vl_8b" in name:
        assert report["launcher"]["accelerate"]["num_processes"] == 6
        assert report["launcher"]["deepspeed"]["zero_stage"] in (2, 3)
    if cfg.kind == "grpo" and cfg.data.format == "easel":
        # The dry run reports the scorer training logs: S of the final canvas plus rule terms.
        assert report["reward"]["components"][0] == "easel_s" and report["data"]["rows"] > 0
        assert dict(zip(report["reward"]["components"], report["reward"]["weights"])) == {
            **{k: 0.0 for k in report["reward"]["components"]}, **cfg.easel.reward_weights}
    elif cfg.kind == "grpo":
        assert sum(report["reward"]["weights"]) == pytest.approx(1.0)


def test_paper_grpo_setup():
    cfg = TrainConfig.load("grpo_qwen3vl_8b")
    assert cfg.model.name_or_path == "Qwen/Qwen3-VL-8B-Instruct"
    assert (cfg.grpo.num_generations, cfg.optim.learning_rate, cfg.grpo.beta, cfg.grpo.max_turns) == (8, 1e-6, 0.001, 12)
    assert cfg.tools.config == "remote_ray" and cfg.run.num_processes == 6


def test_cli_dry_run(capsys, tmp_path):
    assert main(["grpo", "--config", "configs/train/grpo_tiny_cpu.yaml", "--dry-run", "--output-dir", str(tmp_path)]) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_unknown_keys_fail_loudly():
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.load("sft_tiny_cpu", {"optim.lerning_rate": 1.0})
    with pytest.raises(ValueError, match="multiple of grpo.num_generations"):
        TrainConfig.load("grpo_tiny_cpu", {"optim.per_device_train_batch_size": 6})
