"""`canvasagent reward` on saved trajectories: one breakdown, and a batch to CSV + PNG."""

from __future__ import annotations

import csv
import json

from canvasagent.cli import main
from tests.rewards.helpers import DONE, R, run


def _save(tmp_path):
    a = run([R("f", "Flip", {"image": "img_1"}), DONE], expected=["Flip"], checks=[{"type": "differs_from"}])
    b = run([R("x", "Nope", {}), DONE], expected=["Crop"])
    a.save(tmp_path / "runs" / "a")
    b.save(tmp_path / "runs" / "b")
    return tmp_path / "runs"


def test_single_json(tmp_path, capsys):
    root = _save(tmp_path)
    assert main(["reward", str(root / "a"), "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert flat["hybrid"] == flat["hybrid"] and 0 <= flat["hybrid"] <= 1
    assert "rule/p_eff/miss" in flat and "aes/sharpness" in flat
    assert main(["reward", str(root / "a" / "trajectory.json"), "--preset", "no-process"]) == 0
    assert "hybrid" in capsys.readouterr().out


def test_batch_writes_csv_and_png(tmp_path, capsys):
    root = _save(tmp_path)
    assert main(["reward", "--batch", str(root), "--out", str(tmp_path / "report"), "--preset", "public-code"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "report" / "rewards.csv")))
    assert [r["trajectory"] for r in rows] == ["a", "b"]
    assert float(rows[0]["hybrid"]) > float(rows[1]["hybrid"])
    assert (tmp_path / "report" / "rewards.png").stat().st_size > 1000


def test_bad_arguments(tmp_path, capsys):
    assert main(["reward"]) == 2
    assert main(["reward", str(tmp_path / "missing")]) == 2
    assert main(["reward", "--batch", str(tmp_path)]) == 2
