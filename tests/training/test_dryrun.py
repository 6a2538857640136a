"""Every shipped training config validates with --dry-run (everything but the weights), and its
preflight lists exactly what this machine lacks for it."""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest

from toolserver.config import CONFIG_DIR
from canvasagent.train import main
from canvasagent.training import dry_run
from canvasagent.training.config import TrainConfig

CONFIGS = sorted(p.stem for p in (CONFIG_DIR / "train").glob("*.yaml"))


def _missing_here(cfg: TrainConfig) -> set[str]:
    """The subjects the preflight must name for `cfg` on this machine, worked out independently."""
    want: set[str] = set()
    if cfg.data.format not in ("scripted", "easel") and not cfg.resolve(cfg.data.path).exists():
        want.add("data.path")
    if cfg.kind == "grpo" and cfg.run.init_from:
        if not cfg.resolve(cfg.run.init_from).exists():
            want.add("run.init_from")
    elif cfg.model.name_or_path != "tiny" and os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(cfg.model.name_or_path, "config.json"), str):
            want.add("model.name_or_path")
    mods = {"deepspeed": bool(cfg.run.deepspeed), "flash_attn": cfg.model.attn_implementation == "flash_attention_2",
            "tensorboard": "tensorboard" in cfg.run.report_to}
    want |= {f"the {m} package" for m, asked in mods.items() if asked and importlib.util.find_spec(m) is None}
    if cfg.kind == "grpo" and cfg.grpo.judge == "http" and cfg.data.format != "easel":
        want.add("judge at")
    if cfg.kind == "grpo" and cfg.tools.config.startswith("remote") and cfg.data.format != "easel":
        want.add("toolserver")
    return want


@pytest.mark.parametrize("name", CONFIGS)
def test_config_dry_run(name, tmp_path, monkeypatch):
    with socket.socket() as s:  # services at a port nothing listens on, whatever runs on this machine
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("CANVASAGENT_JUDGE_BASE_URL", f"http://127.0.0.1:{dead}/v1")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{dead}")
    cfg = TrainConfig.load(name, {"run.output_dir": str(tmp_path)})
    report = dry_run(cfg)
    want = _missing_here(cfg)
    assert report["ok"] is (not want)
    assert {w for w in want if any(w in p for p in report["problems"])} == want and len(report["problems"]) == len(want)
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
    argv = ["grpo", "--config", "configs/train/grpo_tiny_cpu.yaml", "--dry-run", "--output-dir", str(tmp_path)]
    assert main(argv + ["--set", "run.init_from=null"]) == 0
    assert '"ok": true' in capsys.readouterr().out
    # The config's default starts from the SFT checkpoint, which must exist first.
    assert main(argv + ["--set", f"run.init_from={tmp_path / 'sft_tiny' / 'final'}"]) == 1
    assert "run.init_from" in capsys.readouterr().err


def test_unknown_keys_fail_loudly():
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.load("sft_tiny_cpu", {"optim.lerning_rate": 1.0})
    with pytest.raises(ValueError, match="multiple of grpo.num_generations"):
        TrainConfig.load("grpo_tiny_cpu", {"optim.per_device_train_batch_size": 6})
