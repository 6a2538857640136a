"""The pipeline records each stage's peak resident memory and the report lists it (the sampler
itself: tests/core/test_stage_runner.py)."""

from __future__ import annotations

import json

from canvasagent.training.report import write_report


def test_report_lists_peak_rss_per_stage(tmp_path):
    results = {"data": {"seconds": 1.0, "peak_rss_mb": 321.5}, "grpo": {"seconds": 2.0, "peak_rss_mb": 1234.0}}
    out = write_report(tmp_path, results)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Peak RSS of the pipeline (its process plus the stage subprocess) per stage (MB): data 321.5, grpo 1234.0" in md
    assert json.loads((tmp_path / "report" / "metrics.json").read_text())["peak_rss_mb"] == {"data": 321.5, "grpo": 1234.0}
    assert out["markdown"].endswith("report.md")
