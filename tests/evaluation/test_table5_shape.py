"""check_shape: the paper's Table-5 claims read per held-out task from cells' scores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.evaluation.table5_shape import TABLE5_CLAIMS, ShapeClaim, check_shape, shape_rows

COLUMNS = ("hybrid", "align", "traj", "rule")


def cell(*per_task: dict[str, float]) -> dict[str, dict[str, float]]:
    return {f"t{i}": {c: s.get(c, 0.5) for c in COLUMNS} for i, s in enumerate(per_task)}


def paper_like() -> dict[str, dict[str, dict[str, float]]]:
    """Scores with the paper's shape, over three tasks."""
    full = cell({"hybrid": 0.80, "align": 0.6, "rule": 0.9, "traj": 0.9}, {"hybrid": 0.70, "align": 0.5, "rule": 0.8, "traj": 0.8},
                {"hybrid": 0.90, "align": 0.7, "rule": 1.0, "traj": 1.0})
    return {
        "SFT+RL": full,
        "SFT only": cell({"hybrid": 0.6}, {"hybrid": 0.55}, {"hybrid": 0.65}),
        "RL only": cell({"hybrid": 0.1}, {"hybrid": 0.05}, {"hybrid": 0.0}),
        "w/o outcome reward": cell({"align": 0.4}, {"align": 0.3}, {"align": 0.5}),
        "w/o process reward": cell({"rule": 0.7, "traj": 0.6}, {"rule": 0.6, "traj": 0.7}, {"rule": 0.8, "traj": 0.8}),
    }


def test_every_claim_holds_on_scores_with_the_papers_shape():
    checks = check_shape(paper_like())
    assert [c.claim for c in checks] == list(TABLE5_CLAIMS)
    assert all(c.holds and c.n == 3 for c in checks)
    by = {(c.claim.lower, c.claim.column): c for c in checks}
    assert by[("SFT only", "hybrid")].mean_diff == pytest.approx(0.2)
    assert by[("RL only", "hybrid")].mean_diff == pytest.approx(0.55)
    # rule: 0.2 on every task (se 0: beyond 2 se); traj: 0.3, 0.1, 0.2 (se 0.1 / sqrt 3)
    assert by[("w/o process reward", "rule")].se == pytest.approx(0.0) and by[("w/o process reward", "rule")].beyond_2se
    traj = by[("w/o process reward", "traj")]
    assert traj.mean_diff == pytest.approx(0.2) and traj.se == pytest.approx(0.1 / 3 ** 0.5) and traj.beyond_2se


def test_a_reversed_or_tied_claim_does_not_hold_and_noise_is_not_beyond_2se():
    scores = paper_like()
    scores["RL only"] = cell({"hybrid": 0.7}, {"hybrid": 0.65}, {"hybrid": 0.75})  # RL only 0.1 above SFT only
    scores["w/o process reward"] = {t: dict(s) for t, s in scores["SFT+RL"].items()}  # a tie on rule and traj
    scores["w/o outcome reward"] = cell({"align": 0.9}, {"align": 0.1}, {"align": 0.6})  # +0.067 mean, se 0.20
    by = {(c.claim.lower, c.claim.column): c for c in check_shape(scores)}
    assert not by[("RL only", "hybrid")].holds and by[("RL only", "hybrid")].mean_diff == pytest.approx(-0.1)
    assert not by[("w/o process reward", "rule")].holds and not by[("w/o process reward", "traj")].holds
    outcome = by[("w/o outcome reward", "align")]
    assert outcome.holds and not outcome.beyond_2se
    rows = {(r[0], r[1]): r for r in shape_rows(list(by.values()))}
    assert rows[("SFT only > RL only", "hybrid")][2:] == ["-0.100 ± 0.000", "**no**", "no"]


def test_a_claim_with_a_missing_cell_or_other_tasks_is_left_out():
    scores = paper_like()
    del scores["RL only"]
    scores["w/o outcome reward"] = {"other": scores["w/o outcome reward"]["t0"], **{k: v for k, v in scores["w/o outcome reward"].items() if k != "t0"}}
    claims = [(c.claim.higher, c.claim.lower) for c in check_shape(scores)]
    assert ("SFT only", "RL only") not in claims and ("SFT+RL", "w/o outcome reward") not in claims
    assert ("SFT+RL", "SFT only") in claims and ("SFT+RL", "w/o process reward") in claims


scores_st = st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(hi=scores_st, lo=scores_st)
def test_swapping_the_cells_negates_the_difference_and_at_most_one_way_holds(hi, lo):
    n = min(len(hi), len(lo))
    scores = {"A": {f"t{i}": {"hybrid": hi[i]} for i in range(n)}, "B": {f"t{i}": {"hybrid": lo[i]} for i in range(n)}}
    ab, = check_shape(scores, (ShapeClaim("A", "B", "hybrid"),))
    ba, = check_shape(scores, (ShapeClaim("B", "A", "hybrid"),))
    assert ab.mean_diff == pytest.approx(-ba.mean_diff, abs=1e-12) and ab.se == pytest.approx(ba.se)
    assert not (ab.holds and ba.holds)
    assert ab.holds == (ab.mean_diff > 0) and (not ab.beyond_2se or ab.holds)
