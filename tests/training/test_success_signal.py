"""`benchmarks/chain_behaviour.success_signal` on hand-made GRPO rollout dumps."""

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "chain_behaviour", Path(__file__).resolve().parents[2] / "benchmarks" / "chain_behaviour.py")
chain_behaviour = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(chain_behaviour)


def _dump(run: Path, rows: list[tuple]) -> None:
    folder = run / "grpo" / "trajectories"
    folder.mkdir(parents=True)
    with (folder / "rollouts.jsonl").open("w") as f:
        for step, task, tools, passed, hybrid in rows:
            f.write(json.dumps({"step": step, "task_id": task, "tools": tools,
                                "scores": {"align/passed": passed, "hybrid": hybrid}}) + "\n")


def test_counts_only_groups_with_a_pass_and_a_failed_call(tmp_path):
    _dump(tmp_path / "a", [
        (0, "t1", ["Crop"], 1.0, 0.9), (0, "t1", ["Crop"], 0.0, 0.5), (0, "t1", ["Crop"], 0.0, 0.3),
        (0, "t2", ["Rotate"], 1.0, 0.8), (0, "t2", [], 0.0, 0.0),  # no call: not a failed call
        (1, "t1", ["Crop"], 0.0, 0.4), (1, "t1", ["Crop"], 0.0, 0.2),  # no pass: no signal
    ])
    _dump(tmp_path / "b", [(0, "t1", ["Rotate", "OCR"], 1.0, 1.0), (0, "t1", ["Rotate"], 0.0, 0.6)])
    [line] = chain_behaviour.success_signal(chain_behaviour.grpo_groups([tmp_path / "a", tmp_path / "b"]))
    assert "2 of 4 dumped" in line
    assert "Crop 1 (+0.500)" in line and "OCR+Rotate 1 (+0.400)" in line
    assert "Rotate 1" not in line.replace("OCR+Rotate", "")


def test_says_so_when_no_group_carries_a_success(tmp_path):
    _dump(tmp_path / "a", [(0, "t1", ["Crop"], 0.0, 0.4), (0, "t1", ["Crop"], 0.0, 0.2)])
    assert chain_behaviour.success_signal(chain_behaviour.grpo_groups([tmp_path / "a", tmp_path / "missing"])) == [
        "No dumped GRPO group (of 1) held both a rollout that passed every check and one that failed."]
