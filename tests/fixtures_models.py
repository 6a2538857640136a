"""Reusable pytest fixture: one tiny offline Qwen3-VL checkpoint per test session.

Use from a conftest (or a test module)::

    from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: F401  (registers the fixture)

or call :func:`get_tiny_model_dir` from your own fixture.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never need the network; set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_SEED = 0
_MARKER = "canvasagent_tiny.json"  # written last by the builder: its presence means a complete build


def get_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, *, seed: int = TINY_SEED) -> Path:
    """Build (once per session and seed) the tiny Qwen3-VL checkpoint and return its directory."""
    from canvasagent.core.models.tiny import build_tiny_qwen3vl

    out = tmp_path_factory.getbasetemp() / f"tiny_qwen3vl_seed{seed}"
    if not (out / _MARKER).exists():
        build_tiny_qwen3vl(out, seed=seed)
    return out


@pytest.fixture(scope="session")
def tiny_qwen3vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a session-cached tiny Qwen3-VL checkpoint (seed 0). Treat it as read-only."""
    return get_tiny_model_dir(tmp_path_factory)
