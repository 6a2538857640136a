"""The pipeline records each stage's peak resident memory and the report lists it."""

from __future__ import annotations

import json

import numpy as np

from canvasagent.pipeline import _PeakRSS, _rss_mb
from canvasagent.training.report import write_report


def test_peak_rss_sees_a_short_lived_allocation():
    before = _rss_mb()["rss"]
    with _PeakRSS(every_s=0.02) as rss:
        block = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MB, touched
        import time

        time.sleep(0.2)
        del block
    peaks = rss.peaks()
    assert peaks["peak_rss_mb"] >= before + 150
    assert peaks["peak_anon_mb"] >= 150
    # The peak stays whatever the allocator does with the freed block afterwards (returned to the
    # system alone; kept in a long-lived process such as the test suite).
    assert peaks["peak_rss_mb"] >= _rss_mb()["rss"] - 5


def test_report_lists_peak_rss_per_stage(tmp_path):
    results = {"data": {"seconds": 1.0, "peak_rss_mb": 321.5}, "grpo": {"seconds": 2.0, "peak_rss_mb": 1234.0}}
    out = write_report(tmp_path, results)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Peak RSS of the pipeline process per stage (MB): data 321.5, grpo 1234.0" in md
    assert json.loads((tmp_path / "report" / "metrics.json").read_text())["peak_rss_mb"] == {"data": 321.5, "grpo": 1234.0}
    assert out["markdown"].endswith("report.md")
