"""Build report: chain mix, R/L/D histogram, rejection reasons, trajectory lengths (JSON + PNG)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from canvasagent.core.plotting import figure
from canvascraft.build import load_manifest

log = logging.getLogger(__name__)

_SUMMED = ("slots", "attempts", "kept", "target_missed", "with_reference", "checks_dropped")


def _merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    for k, v in part.items():
        if isinstance(v, dict):
            d = into.setdefault(k, {})
            for kk, vv in v.items():
                d[kk] = d.get(kk, 0) + vv
        elif k in _SUMMED:
            into[k] = into.get(k, 0) + v


def aggregate(out: str | Path) -> dict[str, Any]:
    m = load_manifest(out)
    if m is None:
        raise FileNotFoundError(f"no manifest in {out}")
    by_split: dict[str, dict[str, Any]] = {}
    total: dict[str, Any] = {}
    for s in m["shards"].values():
        _merge(by_split.setdefault(s["split"], {}), s["stats"])
        _merge(total, s["stats"])
    rejected = sum(total.get("rejected", {}).values())
    return {
        "kind": m["kind"],
        "complete": m["complete"],
        "shards_done": len(m["shards"]),
        "rows": total.get("kept", 0),
        "attempts": total.get("attempts", 0),
        "keep_rate": round(total.get("kept", 0) / total["attempts"], 4) if total.get("attempts") else None,
        "rejected_total": rejected,
        # RL only: share of tasks whose computed R/L/D labels equal the drawn targets.
        "target_hit_rate": round(1 - total["target_missed"] / total["kept"], 4) if "target_missed" in total and total.get("kept") else None,
        "totals": total,
        "splits": by_split,
    }


def write_report(out: str | Path) -> tuple[Path, Path]:
    out = Path(out)
    report = aggregate(out)
    jpath = out / "stats.json"
    jpath.write_text(json.dumps(report, indent=1, sort_keys=True))
    ppath = out / "stats.png"
    plot(report, ppath)
    return jpath, ppath


def _bar(ax, counts: dict[str, int], title: str, top: int = 15) -> None:
    items = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    if not items:
        ax.set_title(f"{title} (none)")
        ax.axis("off")
        return
    labels, values = zip(*items)
    labels = tuple(lbl if len(lbl) <= 34 else lbl[:33] + "…" for lbl in labels)
    ax.barh(range(len(values)), values, color="#4477aa")
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)


def plot(report: dict[str, Any], path: str | Path) -> None:
    t = report["totals"]
    with figure(path, 2, 2, figsize=(11, 7), save_dpi=90) as (fig, axes):
        _bar(axes[0][0], t.get("chains", {}), "chain mix (kept)")
        skipped = {f"no backend: {k}": v for k, v in t.get("skipped_no_backend", {}).items()}
        skipped.update({f"no source image: {k}": v for k, v in t.get("skipped_no_source_image", {}).items()})
        _bar(axes[0][1], {**t.get("rejected", {}), **skipped}, "rejections / skipped draws")
        if report["kind"] == "rl":
            ax = axes[1][0]
            levels = ("easy", "medium", "hard")
            for i, axis in enumerate(("reasoning", "length", "diversity")):
                vals = [t.get(axis, {}).get(lv, 0) for lv in levels]
                ax.bar([i * 4 + j for j in range(3)], vals, color=["#66bb66", "#ddaa33", "#cc4444"])
            ax.set_xticks([1, 5, 9], ["R", "L", "D"])
            ax.set_title("R/L/D levels (easy/medium/hard)", fontsize=9)
            lengths = t.get("steps", {})
        else:
            _bar(axes[1][0], t.get("groups", {}), "chain groups")
            lengths = t.get("turns", {})
        ax = axes[1][1]
        ks = sorted(lengths, key=int)
        ax.bar([int(k) for k in ks], [lengths[k] for k in ks], color="#888888")
        ax.set_title("trajectory length (turns)" if report["kind"] == "sft" else "expected steps", fontsize=9)
        rate = f"R/L/D target hit rate {report['target_hit_rate']}" if report["kind"] == "rl" else f"keep rate {report['keep_rate']}"
        fig.suptitle(f"CanvasCraft {report['kind']}: {report['rows']} rows, {rate}")
