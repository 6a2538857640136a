"""`canvasagent reward TRAJ [--preset NAME] [--judge offline|http|local] [--json]` and `--batch DIR`.

One trajectory: prints the hybrid breakdown (`hybrid`, its components, every sub-term).
A batch: scores every `trajectory.json` under DIR and writes `rewards.csv` (one row per
trajectory, one column per term) and `rewards.png` (bar chart of the component means).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from pathlib import Path

from canvasagent.core.plotting import figure

log = logging.getLogger(__name__)

_CHART_KEYS = ("hybrid", "align", "aes", "traj", "rule", "rule/format", "rule/action", "rule/p_eff")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reward", help="score trajectories with the hybrid reward and print every term")
    p.add_argument("traj", nargs="?", help="trajectory.json or its directory")
    p.add_argument("--batch", metavar="DIR", help="score every trajectory.json under DIR; write CSV + PNG")
    p.add_argument("--out", metavar="DIR", help="where --batch writes rewards.csv/.png (default: DIR)")
    p.add_argument("--preset", default="paper", help="configs/reward/<NAME>.yaml or a YAML path (default: paper)")
    p.add_argument("--judge", choices=("offline", "http", "local"), help="override the preset's judge kind")
    p.add_argument("--judge-model", help="HTTP model name, or local checkpoint path/hub id")
    p.add_argument("--judge-url", help="OpenAI-compatible base URL for --judge http")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_reward)


class _PresetError(Exception):
    pass


def _hybrid(args: argparse.Namespace):
    import yaml

    from rewards.config import RewardConfig
    from rewards.hybrid import HybridReward

    try:
        cfg = RewardConfig.load(args.preset)
    except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
        raise _PresetError(f"error: cannot load reward preset {args.preset}: {' '.join(str(e).split())}") from e
    if args.judge:
        cfg.judges.kind = args.judge
    if args.judge_model:
        cfg.judges.http.model = args.judge_model
        cfg.judges.local.model = args.judge_model
    if args.judge_url:
        cfg.judges.http.base_url = args.judge_url
    return HybridReward(cfg)


def _print_table(flat: dict[str, float], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from rewards.hybrid import COMPONENTS

    table = Table(title=title, show_lines=False)
    table.add_column("term")
    table.add_column("value", justify="right")
    order = ["hybrid", *COMPONENTS]
    for k in order + sorted(k for k in flat if k not in order):
        if k in flat:
            style = "bold" if k in order else None
            table.add_row(k, f"{flat[k]:.4f}", style=style)
    Console().print(table)


def _single(args: argparse.Namespace) -> int:
    from canvasagent.core.trajectory import Trajectory

    try:
        traj = Trajectory.load(args.traj)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot load {args.traj}: {e}", file=sys.stderr)
        return 2
    h = _hybrid(args)
    try:
        flat = h.score(traj)
    finally:
        h.close()
    if args.json:
        print(json.dumps(flat, indent=2, sort_keys=True))
    else:
        _print_table(flat, f"{traj.task.id} ({h.cfg.name}, {h.cfg.judges.kind} judges)")
    return 0


def write_batch(rows: list[tuple[str, dict[str, float]]], out: Path, title: str = "") -> tuple[Path, Path]:
    """Write rewards.csv and rewards.png (component means) for scored trajectories."""
    out.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for _, flat in rows:
        keys.extend(k for k in flat if k not in keys)
    head = [k for k in _CHART_KEYS if k in keys] + sorted(k for k in keys if k not in _CHART_KEYS)
    csv_path = out / "rewards.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["trajectory", *head])
        for name, flat in rows:
            w.writerow([name, *(f"{flat[k]:.6g}" if k in flat else "" for k in head)])
    names = [k for k in _CHART_KEYS if k in keys]
    means = [sum(f.get(k, 0.0) for _, f in rows) / max(1, len(rows)) for k in names]
    png_path = out / "rewards.png"
    with figure(png_path, figsize=(8, 3.5), save_dpi=120) as (fig, ax):
        bars = ax.bar(names, means, color=["#444"] + ["#4c72b0"] * 4 + ["#8fa8d8"] * 3)
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("mean")
        ax.set_title(title or f"reward components (n={len(rows)})")
        ax.tick_params(axis="x", labelrotation=20)
    return csv_path, png_path


def _batch(args: argparse.Namespace) -> int:
    from canvasagent.core.trajectory import Trajectory

    root = Path(args.batch)
    paths = sorted(root.rglob("trajectory.json"))
    if not paths:
        print(f"error: no trajectory.json under {root}", file=sys.stderr)
        return 2
    trajs, names = [], []
    for p in paths:
        try:
            trajs.append(Trajectory.load(p))
            names.append(str(p.parent.relative_to(root)) or ".")
        except (OSError, ValueError, KeyError) as e:
            log.warning("skipping %s: %s", p, e)
    if not trajs:
        print(f"error: none of the {len(paths)} trajectory.json under {root} could be loaded", file=sys.stderr)
        return 2
    h = _hybrid(args)
    try:
        flats = h.score_many(trajs)
    finally:
        h.close()
    rows = list(zip(names, flats))
    csv_path, png_path = write_batch(rows, Path(args.out) if args.out else root, f"{h.cfg.name} ({h.cfg.judges.kind} judges), n={len(rows)}")
    means = {k: sum(f.get(k, 0.0) for f in flats) / len(flats) for k in _CHART_KEYS if any(k in f for f in flats)}
    if args.json:
        print(json.dumps({"n": len(rows), "csv": str(csv_path), "png": str(png_path), "means": means}, indent=2))
    else:
        print(f"scored {len(rows)} trajectories -> {csv_path}, {png_path}")
        print("  ".join(f"{k}={v:.3f}" for k, v in means.items()))
    return 0


def cmd_reward(args: argparse.Namespace) -> int:
    if bool(args.traj) == bool(args.batch):
        print("error: give one trajectory or --batch DIR", file=sys.stderr)
        return 2
    try:
        return _batch(args) if args.batch else _single(args)
    except _PresetError as e:
        print(e, file=sys.stderr)
        return 2
