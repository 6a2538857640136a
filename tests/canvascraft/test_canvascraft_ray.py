"""`--ray` runs the same shard tasks as Ray tasks and yields the same rows as a local build."""

from __future__ import annotations

from pathlib import Path

import pytest

from canvascraft import formats
from canvascraft.build import load_build_config, run_build, shard_files

PURE_TOOLS = str(Path(__file__).with_name("pure_tools.yaml"))


@pytest.mark.ray
@pytest.mark.slow
def test_ray_build_equals_local_build(tmp_path):
    import ray  # a declared dependency: missing, it is an error, not a skip
    cfg = load_build_config("sft", n=4, shard_size=2, workers=1, tools_config=PURE_TOOLS, seed=5)
    run_build("sft", cfg, tmp_path / "local", progress=False)
    try:
        run_build("sft", cfg, tmp_path / "ray", use_ray=True, progress=False)
    finally:
        ray.shutdown()
    local = formats.read_rows(shard_files(tmp_path / "local"))
    assert formats.read_rows(shard_files(tmp_path / "ray")) == local and len(local) == 4
