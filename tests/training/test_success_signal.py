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


# --- parameter precision apart for stated and inferred values -------------------------------------

from hypothesis import given, strategies as st  # noqa: E402

_words = st.text(alphabet="abcdefghij0123456789 ,;:.!?-[]'", max_size=40)


# (the reference's value, how the instruction writes it)
_WRITTEN = [(45, "45"), (90, "90"), (90.0, "90"), ("180", "180"), ("[280, 190, 770, 520]", "[280, 190, 770, 520]"),
            ([0, 0, 500, 500], "[0, 0, 500, 500]")]


@given(_words, _words, st.sampled_from(_WRITTEN))
def test_a_number_or_box_written_whole_is_stated(before, after, pair):
    value, shown = pair
    assert chain_behaviour.stated(value, f"{before} {shown} {after}")


@given(_words, _words, st.sampled_from(["Grand Opening", "SUMMER SALE", "text", "bottom-right"]))
def test_a_string_is_stated_only_in_quotes(before, after, value):
    for quoted in (f"'{value}'", f'"{value}"', f"\u2018{value}\u2019"):
        assert chain_behaviour.stated(value, f"{before} {quoted} {after}")
    assert not chain_behaviour.stated(value, f"{before} {value} {after}")


@given(st.integers(1, 9), st.integers(0, 9), st.sampled_from([45, 90, 180]))
def test_an_angle_inside_another_number_or_absent_is_inferred(lead, tail, angle):
    for text in (f"keep the area [{lead}{angle}, 10, {angle}{tail}, 500]", f"rotate by {angle}.{tail + 1} degrees",
                 f"rotate by -{angle} degrees", "make the picture upright"):
        assert not chain_behaviour.stated(angle, text), text
    assert not chain_behaviour.stated("[0, 0, 1000, 500]", "focus the picture on the top half")
    assert not chain_behaviour.stated(True, "rotate by 1 degree")


def test_precision_splits_stated_from_inferred_values():
    record = {"task": {"instruction": "rotate it by 90 degrees, then zoom in on the top half",
                       "meta": {"reference_calls": [
                           {"name": "Rotate", "arguments": {"image": "img_1", "angle": 90}},
                           {"name": "Crop", "arguments": {"image": "Rotate_0", "bbox": "[0, 0, 1000, 500]"}}]}},
              "assets": [{"id": "img_1", "provenance": {}}],
              "turns": [{"call": {"name": "Rotate", "arguments": {"image": "img_1", "angle": 90}}, "status": "ok", "output_id": "Rotate_0"},
                        {"call": {"name": "Crop", "arguments": {"image": "Rotate_0", "bbox": "[0, 0, 500, 500]"}}, "status": "ok", "output_id": "Crop_0"}]}
    assert chain_behaviour.precision(record) == {"Rotate.angle": (1, 1), "Crop.bbox": (0, 1)}
    assert chain_behaviour.precision(record, by_statement=True) == {"Rotate.angle (stated)": (1, 1), "Crop.bbox (inferred)": (0, 1)}
