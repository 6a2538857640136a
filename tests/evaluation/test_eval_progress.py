"""`canvasagent eval` leaves progress lines and a final summary line in the logs, where the
transient progress bar leaves nothing."""

from __future__ import annotations

import logging

from canvasagent.cli import main as cli_main
from canvasagent.evaluation import api as eval_api
from tests.evaluation.conftest import fake_score


def test_eval_logs_progress_and_a_summary_line(eval_split, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(eval_api, "make_scorer", lambda *a, **k: fake_score)
    out = tmp_path / "eval"
    with caplog.at_level(logging.INFO, logger="canvasagent.eval"):
        assert cli_main(["eval", "--policy", "scripted:expected", "--tasks", str(eval_split), "--out", str(out), "--workers", "1"]) == 0
    msgs = [r.getMessage() for r in caplog.records if r.name == "canvasagent.eval"]
    # Under pytest stderr is not a terminal: no bar is drawn, so the log carries the progress.
    assert [m.split(" tasks")[0] for m in msgs] == ["eval: 1/3", "eval: 2/3", "eval: 3/3"]
    assert msgs[-1].startswith("eval: 3/3 tasks done in ") and msgs[-1].endswith(f"(0 with errors); report {out / 'report.md'}")
