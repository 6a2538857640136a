"""Whether an ablation grid has the qualitative shape of the paper's Table 5, read per held-out task.

The paper's claims, each one cell scoring above another on one score:

    SFT+RL > SFT only > RL only            (hybrid)
    SFT+RL > w/o outcome reward            (alignment: the outcome reward is what teaches it)
    SFT+RL > w/o process reward            (rule and trajectory: what the process reward teaches)

`check_shape(scores)` takes each cell's per-task scores ({cell: {task_id: scores}}, e.g. read from
the cells' evaluation reports) and returns one `ClaimCheck` per claim whose two cells were both
evaluated on the same tasks: the paired difference higher − lower (`metrics.paired_difference`),
whether it is positive (`holds`) and whether it is more than two standard errors above zero
(`beyond_2se`). A claim with a cell missing, or with cells evaluated on different tasks, is left out
rather than read from unpaired means. A tie does not hold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from canvasagent.evaluation.metrics import paired_difference


@dataclass(frozen=True)
class ShapeClaim:
    higher: str  # the cell the paper has scoring higher ...
    lower: str  # ... than this one
    column: str  # on this canonical score (hybrid, align, traj, rule)


TABLE5_CLAIMS: tuple[ShapeClaim, ...] = (
    ShapeClaim("SFT+RL", "SFT only", "hybrid"),
    ShapeClaim("SFT only", "RL only", "hybrid"),
    ShapeClaim("SFT+RL", "w/o outcome reward", "align"),
    ShapeClaim("SFT+RL", "w/o process reward", "rule"),
    ShapeClaim("SFT+RL", "w/o process reward", "traj"),
)


@dataclass(frozen=True)
class ClaimCheck:
    claim: ShapeClaim
    n: int  # held-out tasks paired
    mean_diff: float  # higher − lower, mean over tasks
    se: float
    holds: bool  # mean_diff > 0
    beyond_2se: bool  # mean_diff > 2 se (and > 0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.claim), **{k: v for k, v in asdict(self).items() if k != "claim"}}


def check_shape(scores: dict[str, dict[str, dict[str, float]]],
                claims: tuple[ShapeClaim, ...] = TABLE5_CLAIMS) -> list[ClaimCheck]:
    """One `ClaimCheck` per claim both of whose cells are in `scores` with the same task ids."""
    checks = []
    for claim in claims:
        hi, lo = scores.get(claim.higher), scores.get(claim.lower)
        if not hi or not lo or sorted(hi) != sorted(lo):
            continue
        ids = sorted(hi)
        d = paired_difference([lo[i] for i in ids], [hi[i] for i in ids], claim.column)
        checks.append(ClaimCheck(claim, d["n"], d["mean_diff"], d["se"], holds=d["mean_diff"] > 0,
                                 beyond_2se=d["mean_diff"] > 2 * d["se"]))  # se >= 0, so beyond implies holds
    return checks


def shape_rows(checks: list[ClaimCheck]) -> list[list[str]]:
    """Table rows: claim, score, higher − lower (mean ± se), holds, beyond 2 se."""
    return [[f"{c.claim.higher} > {c.claim.lower}", c.claim.column, f"{c.mean_diff:+.3f} ± {c.se:.3f}",
             "yes" if c.holds else "**no**", "yes" if c.beyond_2se else "no"] for c in checks]
