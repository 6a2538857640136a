"""run_stage: a stage in this process or in a fresh subprocess, with the job's peak RSS; StagedRun:
done stages skipped with their recorded result, interrupted ones rerun."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canvasagent.stage_runner import PeakRSS, StagedRun, StageFailed, StaleStage, rss_mb, run_stage


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


def test_isolated_stage_runs_this_checkout_whatever_the_working_directory(tmp_path, monkeypatch):
    shadow = tmp_path / "canvasagent"  # another checkout's package, in the working directory
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the other checkout')\n")
    monkeypatch.chdir(tmp_path)
    assert run_stage(_hold, 1, 0.0, isolate=True).value["sum"] == 10


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
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"  # printed once: the child did not rerun the script's main block


def _count(path: str, value: float) -> dict:
    """A stage that counts its calls in `path` and returns numpy numbers."""
    with open(path, "a") as fh:
        fh.write("x")
    return {"value": np.float32(value), "n": np.int64(3), "where": Path(path).parent}


def test_a_done_stage_is_skipped_and_its_recorded_result_returned(tmp_path):
    calls = tmp_path / "calls"
    stages = StagedRun(tmp_path / "run")
    first = stages.run("train/a", _count, str(calls), 0.5, isolate=True)
    assert first["value"] == 0.5 and first["seconds"] >= 0 and first["peak_rss_mb"] > 0
    record = json.loads((tmp_path / "run" / "train" / "a" / "done.json").read_text())
    # Numbers stay numbers, paths become text.
    assert record == {**first, "value": 0.5, "n": 3, "where": str(tmp_path)}
    again = StagedRun(tmp_path / "run").run("train/a", _count, str(calls), 0.9)
    assert again == record and calls.read_text() == "x"  # not called again
    assert StagedRun(tmp_path / "run").run("train/a", _count, str(calls), 0.9, rerun=True)["value"] == pytest.approx(0.9)
    assert calls.read_text() == "xx"


def test_a_record_written_by_the_earlier_stage_code_is_understood(tmp_path):
    # As the pipeline and the ablation wrote them: the stage's value, its time and peaks, any notes.
    old = {"final": "/x/sft/final", "global_step": 2, "seconds": 12.5, "peak_rss_mb": 600.1, "peak_anon_mb": 400.0, "note": "reused"}
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "done.json").write_text(json.dumps(old, indent=2))
    assert StagedRun(tmp_path).run("sft", _fail, "must not run") == old
    # A torn record (not JSON) counts as not done.
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "done.json").write_text('{"final": "/x/gr')
    assert StagedRun(tmp_path).done("grpo") is None


def test_a_stage_begun_under_other_inputs_is_refused_done_or_interrupted(tmp_path):
    calls = tmp_path / "calls"
    stages = StagedRun(tmp_path / "run")
    with pytest.raises(ValueError, match="killed"):  # interrupted: inputs kept, no record
        stages.run("eval", _fail, "killed", inputs={"max_new_tokens": 96, "samples": 4})
    with pytest.raises(StaleStage, match=r"run/eval holds work done under other inputs.*max_new_tokens: 96 there, 384 now\)"):
        stages.run("eval", _count, str(calls), 0.5, inputs={"max_new_tokens": 384, "samples": 4})
    assert not calls.exists()
    stages.run("eval", _count, str(calls), 0.5, inputs={"samples": 4, "max_new_tokens": 96})  # key order is not a difference
    done = stages.done("eval")
    with pytest.raises(StaleStage, match=r"samples: 4 there, None now; temperature: None there, 1.0 now"):
        stages.run("eval", _count, str(calls), 0.9, inputs={"max_new_tokens": 96, "temperature": 1.0})
    assert stages.run("eval", _count, str(calls), 0.9, inputs={"max_new_tokens": 96, "samples": 4}) == done
    assert calls.read_text() == "x"
    # rerun replaces the inputs; a stage named without inputs is never checked.
    assert stages.run("eval", _count, str(calls), 0.7, inputs={"max_new_tokens": 384}, rerun=True)["value"] == pytest.approx(0.7)
    assert stages.stale("eval", {"max_new_tokens": 384}) is None and stages.run("eval", _fail, "must not run") == stages.done("eval")
    # A torn inputs file (killed while written) holds nothing: it is written again.
    (tmp_path / "run" / "torn").mkdir()
    (tmp_path / "run" / "torn" / "inputs.json").write_text('{"max_new_')
    stages.run("torn", _count, str(calls), 0.1, inputs={"max_new_tokens": 8})
    assert json.loads((tmp_path / "run" / "torn" / "inputs.json").read_text()) == {"max_new_tokens": 8}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.dictionaries(st.text(max_size=8), _JSON, max_size=4), second=st.dictionaries(st.text(max_size=8), _JSON, max_size=4))
def test_inputs_are_refused_exactly_when_they_read_back_different(tmp_path_factory, first, second):
    stages = StagedRun(tmp_path_factory.mktemp("run"))
    stages.run("s", lambda: {"ok": 1}, inputs=first)
    differs = json.loads(json.dumps(first)) != json.loads(json.dumps(second))
    assert (stages.stale("s", second) is not None) == differs
    if differs:
        with pytest.raises(StaleStage):
            stages.run("s", lambda: {"ok": 2}, inputs=second)
    assert stages.run("s", lambda: {"ok": 3}, inputs=first)["ok"] == 1


def test_a_stage_that_raised_leaves_no_record_and_runs_again(tmp_path):
    stages = StagedRun(tmp_path)
    with pytest.raises(ValueError, match="first try"):
        stages.run("eval", _fail, "first try")
    assert stages.done("eval") is None and not (tmp_path / "eval" / "done.json").exists()
    assert stages.run("eval", _count, str(tmp_path / "calls"), 1.0)["value"] == 1.0


KILLED = """
import sys, time
from canvasagent.stage_runner import StagedRun

def stage(calls, seconds):
    open(calls, "a").write("x")
    time.sleep(seconds)
    return {"slept": seconds}

if __name__ == "__main__":
    root, seconds = sys.argv[1], float(sys.argv[2])
    stages = StagedRun(root)
    first = stages.run("first", stage, root + "/first_calls", 0.0, isolate=True)
    second = stages.run("second", stage, root + "/second_calls", seconds, isolate=True)
    print(first["slept"], second["slept"])
"""


def test_a_run_killed_mid_stage_reruns_that_stage_only(tmp_path):
    script, root = tmp_path / "job.py", tmp_path / "run"
    script.write_text(KILLED)
    root.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(root), "600"], start_new_session=True)
    deadline = time.time() + 120
    while not (root / "second_calls").exists() and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the job and its stage subprocess, mid-stage
    proc.wait()
    assert (root / "first" / "done.json").exists() and not (root / "second" / "done.json").exists()
    done = subprocess.run([sys.executable, str(script), str(root), "0"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.0", "0.0"]
    assert (root / "first_calls").read_text() == "x" and (root / "second_calls").read_text() == "xx"


ORPHAN = """
import os, sys, time
from canvasagent.stage_runner import run_stage

def stage(pid_file):
    open(pid_file, "w").write(str(os.getpid()))
    time.sleep(600)

if __name__ == "__main__":
    run_stage(stage, sys.argv[1], isolate=True)
"""


def test_a_stage_ends_when_the_job_that_started_it_is_killed(tmp_path):
    script, pid_file = tmp_path / "job.py", tmp_path / "stage.pid"
    script.write_text(ORPHAN)
    proc = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    stage_pid = int(pid_file.read_text())
    proc.kill()  # SIGKILL: the job cannot end its stage itself
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(stage_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(stage_pid, signal.SIGKILL)
        pytest.fail("the stage subprocess outlived its job")
