"""scripts/gpu_check.py's CPU-safe parts: the paper-shaped configs build and have the public sizes."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
