"""`canvasagent easel ...`: score, paint, draw (you paint), bench and data for the EASEL brush environment."""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def _load_image(path: str) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0


def cmd_score(args: argparse.Namespace) -> int:
    from canvasagent.easel import metrics
    ref, canvas = _load_image(args.ref), _load_image(args.canvas)
    if ref.shape != canvas.shape:
        import cv2
        canvas = cv2.resize(canvas, (ref.shape[1], ref.shape[0]), interpolation=cv2.INTER_AREA)
    sim = metrics.similarity(ref, canvas)
    if args.json:
        print(json.dumps(sim.as_dict()))
    else:
        print(f"S={sim.s:.4f}  SSIM={sim.ssim:.4f}  L1={sim.l1:.4f}  EdgeIoU={sim.edge_iou:.4f}")
    return 0


def cmd_paint(args: argparse.Namespace) -> int:
    from PIL import Image

    from canvasagent.easel import bench, render
    from canvasagent.easel.canvas import CanvasSession
    from canvasagent.easel.painter import paint
    from canvasagent.interactive.paint import centre_square  # deferred, as the others: easel imports torch
    cfg = bench.load_config(args.config).painter
    if args.seed is not None:
        cfg = replace(cfg, seed=args.seed)
    ref = _load_image(args.ref)
    if args.size:
        ref = centre_square(ref, args.size)
    if ref.shape[0] != ref.shape[1]:
        raise SystemExit("reference must be square (use --size N to centre-crop and resize)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = paint(ref, args.budget, cfg)
    sess = CanvasSession(render.blank_canvas(ref.shape[0]), args.budget, reference=ref)
    with open(out / "strokes.jsonl", "w") as f:
        for p in res.strokes:
            r = sess.brush_stroke(p)
            f.write(json.dumps({"step": r.steps_used, "name": "brush_stroke",
                                "arguments": render.params_to_dict(p), "s": r.s}) + "\n")
    sess.submit()
    Image.fromarray(render.to_uint8(sess.canvas)).save(out / "canvas.png")
    Image.fromarray(render.to_uint8(ref)).save(out / "reference.png")
    bench.plot_single_curve(sess.s_curve, out / "s_curve.png", title=Path(args.ref).name)
    d = sess.diagnostics()
    (out / "summary.json").write_text(json.dumps({"seconds": res.seconds, **d.as_dict()}, indent=2))
    print(f"final S={d.final:.4f} best={d.best:.4f} AUC={d.auc:.4f} in {res.seconds:.1f}s -> {out}")
    return 0


RECON_POLICIES = ("painter", "blank", "mean-fill", "dominant-fill")
SEMANTIC_POLICIES = ("blank", "random", "heuristic")


def _check_policy(policy: str, suite: str) -> None:
    if policy.startswith("agent:") and len(policy) > len("agent:"):
        return
    allowed = RECON_POLICIES if suite == "reconstruction" else SEMANTIC_POLICIES
    if policy not in allowed:
        raise SystemExit(f"--policy for the {suite} suite must be one of {', '.join(allowed)} or agent:SPEC")


def cmd_draw(args: argparse.Namespace) -> int:
    from canvasagent.interactive.paint import run_paint  # deferred, as the others: easel imports torch

    return run_paint(args.ref, args.size, args.budget, args.out)


def cmd_bench(args: argparse.Namespace) -> int:
    from canvasagent.easel import bench
    _check_policy(args.policy, args.suite)
    cfg = bench.load_config(args.config)
    over = {}
    if args.n_per_category is not None:
        over["n_per_category"] = args.n_per_category
    if args.workers is not None:
        over["workers"] = args.workers
    if args.budgets:
        over["budgets"] = tuple(b if b == "aligned" else int(b) for b in args.budgets.split(","))
    if args.natural_dir:
        over["natural_dir"] = args.natural_dir
    if args.categories:
        over["categories"] = tuple(args.categories.split(","))
    if args.ray:
        over["ray"] = True
    cfg = replace(cfg, **over)
    seeds = tuple(range(args.seeds))
    if args.policy.startswith("agent:"):
        from canvasagent.easel import agent, tasks
        acfg = agent.AgentConfig(budget=args.agent_budget, coords=args.coords, image_budget=args.image_budget)
        spec = args.policy[len("agent:"):]
        if args.suite == "semantic":
            from canvasagent.easel import semantic
            print(semantic.format_table(agent.run_semantic(spec, seeds, acfg, args.out)))
        else:
            suite = tasks.reconstruction_suite(cfg.n_per_category, cfg.seed, cfg.categories, cfg.natural_dir)
            print(bench.format_table(agent.run_reconstruction(spec, suite, acfg, args.out)))
        return 0
    if args.suite == "semantic":
        from canvasagent.easel import semantic
        print(semantic.format_table(semantic.run([args.policy], seeds, args.out)))
        return 0
    results = bench.run(args.policy, cfg, args.out)
    print(bench.format_table(results))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from canvasagent.easel import bench, data
    from canvasagent.interactive.paint import centre_square  # deferred, as the others: easel imports torch
    refs = []
    for p in args.refs:
        path = Path(p)
        files = sorted(f for f in path.iterdir() if f.suffix.lower() in (".png", ".jpg", ".jpeg")) if path.is_dir() else [path]
        for f in files:
            refs.append((f.stem, centre_square(_load_image(str(f)), args.size)))
    if not refs:
        raise SystemExit("no reference images found")
    cfg = bench.load_config(args.config).painter
    counts = data.build_dataset(refs, args.out, n_strokes=args.strokes, painter_cfg=cfg, workers=args.workers,
                                parquet=not args.no_parquet, ray=args.ray)
    print(json.dumps(counts))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("easel", help="EASEL brush environment: score, paint, draw, bench, data")
    sub = p.add_subparsers(dest="easel_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    s = sub.add_parser("score", help="similarity S of a canvas against a reference")
    s.add_argument("ref")
    s.add_argument("canvas")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_score)

    s = sub.add_parser("paint", help="paint a reference with the stroke painter")
    s.add_argument("ref")
    s.add_argument("--budget", type=int, default=128)
    s.add_argument("--out", required=True)
    s.add_argument("--size", type=int, default=None, help="centre-crop and resize to N x N first")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--config", default=None, help="EASEL yaml (default configs/easel/default.yaml)")
    s.set_defaults(func=cmd_paint)

    s = sub.add_parser("draw", help="paint a reference yourself, stroke by stroke (S after every stroke; undo, submit)")
    s.add_argument("ref", help="an image file or a scikit-image sample: astronaut, chelsea, coffee, rocket")
    s.add_argument("--budget", type=int, default=20, help="steps: every stroke and undo costs one")
    s.add_argument("--size", type=int, default=128, help="canvas side in pixels")
    s.add_argument("--out", default=None, help="folder for canvas.png, s_curve.png, strokes.jsonl (default runs/paint-<time>)")
    s.set_defaults(func=cmd_draw)

    s = sub.add_parser("bench", help="reconstruction (Table 3 style) or semantic-task benchmark")
    s.add_argument("--policy", required=True,
                   help="reconstruction: painter|blank|mean-fill|dominant-fill; semantic: blank|random|heuristic; "
                        "either: agent:SPEC (a policy spec such as hf:PATH, openai:MODEL@URL, replay:PATH, "
                        "scripted:NAME, or easel:blank|random|heuristic)")
    s.add_argument("--suite", choices=["reconstruction", "semantic"], default="reconstruction")
    s.add_argument("--seeds", type=int, default=1, help="semantic suite: seeds 0..N-1 per task")
    s.add_argument("--agent-budget", type=int, default=None,
                   help="agent:SPEC only: override every task's step budget (smoke runs)")
    s.add_argument("--coords", choices=["unit", "int1000"], default="unit",
                   help="agent:SPEC only: int1000 rescales 0-1000 path coordinates (EASEL-Data checkpoints)")
    s.add_argument("--image-budget", type=int, default=None,
                   help="agent:SPEC only: show the policy the last N canvas images (default: all, as GRPO's image_budget)")
    s.add_argument("--ray", action="store_true", help="painter: paint images as Ray tasks")
    s.add_argument("--out", required=True)
    s.add_argument("--n-per-category", type=int, default=None)
    s.add_argument("--workers", type=int, default=None)
    s.add_argument("--budgets", default=None, help="comma list: aligned,250")
    s.add_argument("--categories", default=None, help="comma list of categories")
    s.add_argument("--natural-dir", default=None)
    s.add_argument("--config", default=None)
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("data", help="build EASEL-Data (C1/C2 next-stroke SFT samples)")
    s.add_argument("--refs", nargs="+", required=True, help="image files or folders")
    s.add_argument("--out", required=True)
    s.add_argument("--strokes", type=int, default=250)
    s.add_argument("--size", type=int, default=128)
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--ray", action="store_true", help="paint images as Ray tasks instead of local processes")
    s.add_argument("--no-parquet", action="store_true")
    s.add_argument("--config", default=None)
    s.set_defaults(func=cmd_data)
