"""scripts/gpu_check.py's CPU-safe parts: the paper-shaped configs build and have the public sizes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("gpu_check", None)


def test_dry_run_shapes_match_the_published_model_sizes(gpu_check):
    shapes = gpu_check.dry_run()
    # Qwen3-VL-8B-Instruct: 8.77B parameters on its model card; FLUX.2-klein 4B: a ~4B transformer
    # and the Qwen3-4B text encoder (4.0B).
    assert abs(shapes["policy_params"] / 8.77e9 - 1) < 0.005
    assert 3.7e9 < shapes["flux_transformer_params"] < 4.1e9
    assert abs(shapes["flux_text_encoder_params"] / 4.02e9 - 1) < 0.01
    assert shapes["tokenizer_vocab"] < gpu_check.QWEN3VL_8B_TEXT["vocab_size"]  # tiny ids fit the real vocabulary


def test_policy_config_carries_the_tokenizers_vision_ids(gpu_check):
    from canvasagent.core.models.tiny import TinyQwen3VLSpec, build_tiny_tokenizer

    tok = build_tiny_tokenizer(TinyQwen3VLSpec())
    cfg = gpu_check.policy_config(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.text_config.num_hidden_layers == 36 and cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size


def test_without_a_gpu_the_full_check_refuses_clearly():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the full check would run")
    r = subprocess.run(["bash", str(SCRIPT.with_suffix(".sh"))], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def _run_script(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT.with_suffix(".sh")), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_smoke_runs_the_whole_check_at_toy_sizes(tmp_path):
    """The GPU check's own code path (build and save the policy, one GRPO step of the tiny tools and
    reward, two pipeline calls) at toy sizes: what a GPU session runs, so it finds a working check."""
    import json

    r = _run_script("--smoke", "--out", str(tmp_path), "--json", str(tmp_path / "report.json"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert r.stdout.rstrip().endswith(json.dumps(report, indent=2))  # printed last, after the trainer's log lines
    assert report["sizes"] == "toy (--smoke)" and "missing" not in report["versions"].values()
    flux, step = report["flux2_klein_call"], report["qwen3vl_8b_grpo_step"]
    assert flux["size"] == "64x64" and flux["first_call_s"] > 0 and flux["second_call_s"] > 0
    assert step["grpo_step_s"] > 0 and step["rollouts"] == 2
    memory = "peak_gpu_gib" if report["device"] != "cpu" else "peak_rss_gib"
    assert flux[memory] > 0 and step[memory] > 0
    config = json.loads((tmp_path / "policy_random" / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 2  # the toy policy, not the 8B one, was built


def test_wheels_for_a_gpu_image_are_pinned_by_constraints():
    """scripts/gpu_wheels.sh fetches each package at the version constraints.txt pins (the tested one)."""
    import re

    script = (SCRIPT.parent / "gpu_wheels.sh").read_text()
    packages = re.search(r'^PACKAGES="([^"]+)"', script, re.M).group(1).split()
    pinned = {line.split("==")[0].lower() for line in (SCRIPT.parents[1] / "constraints.txt").read_text().splitlines() if "==" in line}
    assert {"trl", "transformers", "diffusers", "datasets"} <= set(packages)
    assert set(packages) <= pinned
