"""Chaos: a build's pool worker is SIGKILLed (as the OOM killer does) mid-shard.

The build must not hang: the dead worker's shards are rebuilt in a fresh pool, or, when one
keeps killing its worker, the build stops with a clear error and a rerun resumes it. Either
way the final rows equal an uninterrupted build's: none lost, none duplicated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import canvascraft.sft as sft_mod
from canvascraft import formats
from canvascraft.build import (
    BuildWorkerDied,
    load_build_config,
    load_manifest,
    run_build,
    shard_files,
)

PURE_TOOLS = str(Path(__file__).with_name("pure_tools.yaml"))
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)  # a hang is the bug under test: fail, do not wait forever


def _cfg(**kw):
    base = {"n": 8, "seed": 11, "shard_size": 2, "workers": 2, "tools_config": PURE_TOOLS}
    base.update(kw)
    return load_build_config("sft", **base)


def _rows(out: Path) -> dict[str, dict]:
    rows = formats.read_rows(shard_files(out))
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate rows"
    return {r["id"]: r for r in rows}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("ref")
    run_build("sft", _cfg(workers=1), out, progress=False)
    return _rows(out)


def _killer(marker_dir: Path, index: int, times: int):
    """A shard function that SIGKILLs its own worker process on shard `index`, `times` times
    (marker files count the deaths across processes), and builds normally otherwise."""
    real = sft_mod.build_sft_shard

    def shard(cfg, job):
        if job.index == index:
            n = len(list(marker_dir.glob("death-*")))
            if n < times:
                (marker_dir / f"death-{n}").touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return real(cfg, job)

    return shard


def test_killed_worker_shard_is_rebuilt_and_nothing_is_lost(tmp_path, monkeypatch, reference, caplog):
    # The pool forks, so its workers inherit the patched shard function.
    monkeypatch.setattr(sft_mod, "build_sft_shard", _killer(tmp_path, index=1, times=2))
    m = run_build("sft", _cfg(), tmp_path / "out", progress=False)
    assert len(list(tmp_path.glob("death-*"))) == 2  # the worker really died twice
    assert m["complete"] and len(m["shards"]) == 4
    assert _rows(tmp_path / "out") == reference
    assert "worker process died" in caplog.text and "train-00001" in caplog.text


def test_a_shard_that_always_kills_its_worker_stops_the_build_then_a_rerun_resumes(tmp_path, monkeypatch, reference):
    monkeypatch.setattr(sft_mod, "build_sft_shard", _killer(tmp_path, index=2, times=99))
    with pytest.raises(BuildWorkerDied, match=r"died 2 times .*train-00002.*rerun to resume"):
        run_build("sft", _cfg(worker_restarts=1), tmp_path / "out", progress=False)
    m = load_manifest(tmp_path / "out")
    assert not m["complete"] and "train-00002" not in m["shards"]
    monkeypatch.undo()
    m = run_build("sft", _cfg(), tmp_path / "out", progress=False)  # worker_restarts is not part of the config hash
    assert m["complete"]
    assert _rows(tmp_path / "out") == reference


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    kids = []
    for c in map(int, text.split()):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            kids.append(c)
    return kids


def test_cli_build_survives_an_external_sigkill_of_a_pool_worker(tmp_path, reference):
    """The real thing: another process kills a worker of `python -m canvascraft build-sft`."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "canvascraft", "build-sft", "--n", "8", "--seed", "11", "--shard-size", "2",
         "--workers", "2", "--tools-config", PURE_TOOLS, "--out", str(out), "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline and proc.poll() is None:
            kids = _children(proc.pid)
            if len(kids) >= 2:
                victim = kids[0]
            else:
                time.sleep(0.05)
        assert victim is not None, "the build never started its pool"
        os.kill(victim, signal.SIGKILL)
        log, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log
    assert "worker process died" in log  # the kill hit the pool, and the pool was rebuilt
    assert load_manifest(out)["complete"]
    assert _rows(out) == reference
