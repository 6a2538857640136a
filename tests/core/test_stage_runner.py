"""run_stage: a stage in this process or in a fresh subprocess, with the job's peak RSS."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest

from canvasagent.stage_runner import PeakRSS, StageFailed, rss_mb, run_stage


def _hold(mb: int, seconds: float) -> dict:
    """Touch `mb` MB, hold it, report where it ran."""
    block = np.ones(mb * 2**20, dtype=np.uint8)
    time.sleep(seconds)
    logging.getLogger("stage").info("held %d MB", mb)
    return {"pid": os.getpid(), "sum": int(block[:10].sum()), "numpy": np.__file__}


def _fail(message: str) -> None:
    raise ValueError(message)


def test_isolated_stage_runs_in_another_process_and_its_memory_is_counted():
    before = rss_mb(children=True)["rss"]
    run = run_stage(_hold, 300, 1.5, isolate=True, sample_every_s=0.05)
    assert run.isolated and run.value["pid"] != os.getpid() and run.value["sum"] == 10
    assert run.value["numpy"] == np.__file__  # the same packages as this process
    # The subprocess's 300 MB are in the job's peak, and gone with it.
    assert run.peaks["peak_rss_mb"] >= before + 250
    assert rss_mb(children=True)["rss"] < before + 100
    local = run_stage(_hold, 1, 0.0)
    assert not local.isolated and local.value["pid"] == os.getpid()


def test_isolated_stage_failure_carries_its_traceback():
    with pytest.raises(StageFailed, match="ValueError: boom") as err:
        run_stage(_fail, "boom", isolate=True)
    assert "_fail" in err.value.remote_traceback


def test_isolated_stage_needs_a_picklable_callable():
    with pytest.raises(TypeError, match="picklable"):
        run_stage(lambda: None, isolate=True)


def test_peak_rss_sees_a_short_lived_allocation():
    before = rss_mb()["rss"]
    with PeakRSS(every_s=0.02) as rss:
        block = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MB, touched
        time.sleep(0.2)
        del block
    peaks = rss.peaks()
    assert peaks["peak_rss_mb"] >= before + 150
    assert peaks["peak_anon_mb"] >= 150
    # The peak stays whatever the allocator does with the freed block afterwards (returned to the
    # system alone; kept in a long-lived process such as the test suite).
    assert peaks["peak_rss_mb"] >= rss_mb()["rss"] - 5


SCRIPT = """
from canvasagent.stage_runner import run_stage

def stage(x):
    return {"twice": 2 * x}

if __name__ == "__main__":
    print(run_stage(stage, 21, isolate=True).value["twice"])
"""


def test_a_stage_defined_in_the_main_script_runs_isolated(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"  # printed once: the child did not rerun the script's main block
