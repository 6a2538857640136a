"""`python -m canvascraft build-sft|build-rl|stats|convert` (see `--help` of each)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("canvascraft")


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _build_args(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--n", type=_count, help="row slots to build")
    p.add_argument("--out", required=True, help="output folder (re-running resumes it)")
    p.add_argument("--config", default=kind, help=f"build config in configs/canvascraft/ (default {kind}) or a YAML path")
    p.add_argument("--images", help="builtin | procedural | photos | DIR | saved dataset DIR | hf:NAME[:SPLIT]")
    p.add_argument("--writer", choices=("template", "llm"))
    p.add_argument("--llm-url", help="OpenAI-compatible base URL for --writer llm (…/v1)")
    p.add_argument("--llm-model")
    p.add_argument("--ray", action="store_true", help="run shards as Ray tasks (RAY_ADDRESS selects the cluster)")
    p.add_argument("--workers", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--shard-size", type=int)
    p.add_argument("--tools-config", help="configs/tools/<name>.yaml or a path")
    p.add_argument("--no-progress", action="store_true")
    if kind == "rl":
        p.add_argument("--eval-n", type=int, help="held-out eval tasks (built with the config's eval_seed)")
    else:
        p.add_argument("--allow-plumbing", action="store_const", const=True, help="keep outputs of random-weight backends (pipeline tests only)")
    p.set_defaults(func=cmd_build, kind=kind)


def cmd_build(args: argparse.Namespace) -> int:
    from canvascraft.build import load_build_config, run_build
    from canvascraft.stats import write_report

    overrides = dict(
        n=args.n, images=args.images, writer=args.writer, workers=args.workers, seed=args.seed,
        shard_size=args.shard_size, tools_config=args.tools_config,
    )
    if args.kind == "rl":
        overrides["eval_n"] = args.eval_n
    else:
        overrides["allow_plumbing"] = args.allow_plumbing
    cfg = load_build_config(args.kind, args.config, **overrides)
    if args.llm_url or args.llm_model:
        cfg.llm = {**cfg.llm, **({"base_url": args.llm_url} if args.llm_url else {}), **({"model": args.llm_model} if args.llm_model else {})}
    t0 = time.perf_counter()
    run_build(args.kind, cfg, args.out, use_ray=args.ray, progress=not args.no_progress)
    jpath, ppath = write_report(args.out)
    report = json.loads(jpath.read_text())
    report_line = {k: report[k] for k in ("rows", "attempts", "keep_rate", "rejected_total", "target_hit_rate") if report.get(k) is not None}
    print(f"built {args.kind} in {time.perf_counter() - t0:.1f} s: {report_line}; report {jpath}, {ppath}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from canvascraft.stats import write_report

    jpath, ppath = write_report(args.dir)
    print(jpath.read_text())
    print(f"figure: {ppath}")
    return 0


def _detect(path: Path) -> str:
    from canvasagent.core.formats.sharegpt import is_sharegpt, iter_records

    first = next(iter_records(path), None)
    if first is None:
        raise ValueError(f"{path} holds no records")
    return "sft" if is_sharegpt(first) else "rl"


def cmd_convert(args: argparse.Namespace) -> int:
    from canvascraft import formats
    from canvascraft.build import load_manifest, shard_files

    src, out = Path(args.input), Path(args.out)
    if src.is_dir():
        m = load_manifest(src)
        if m is None:
            raise SystemExit(f"{src} has no manifest.json (not a canvascraft build)")
        kind, rows = m["kind"], formats.read_rows(shard_files(src, split=args.split))
    else:
        kind = _detect(src)
        rows = formats.read_sharegpt(src) if kind == "sft" else formats.read_rl_json(src)
    if args.to == "hf":
        path = formats.write_parquet_atomic(rows, kind, out / f"{kind}.parquet")
    elif args.to == "sharegpt":
        if kind != "sft":
            raise SystemExit("ShareGPT holds SFT trajectories; convert an RL build with --to rl-json")
        path = formats.write_sharegpt(rows, out)
        info = formats.write_dataset_info(out, path.name, "canvascraft_sft" + (f"_{args.split}" if args.split else ""))
        print(f"LLaMA-Factory: {info} lists it (dataset_dir: {out})")
    else:
        if kind != "rl":
            raise SystemExit("RL JSON holds RL tasks; convert an SFT build with --to sharegpt")
        path = formats.write_rl_json(rows, out)
    print(f"wrote {len(rows)} {kind} rows to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from canvasagent.cli.errors import ShortErrorParser

    parser = ShortErrorParser(prog="canvascraft", description="CanvasCraft data pipeline")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="debug logging, and show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    _build_args(sub.add_parser("build-sft", help="build SFT trajectories by executing tool chains"), "sft")
    _build_args(sub.add_parser("build-rl", help="build RL task specs with R/L/D labels and checks"), "rl")
    p = sub.add_parser("stats", help="write stats.json and stats.png for a build folder")
    p.add_argument("dir")
    p.set_defaults(func=cmd_stats)
    p = sub.add_parser("convert", help="build folder -> public ShareGPT / RL JSON / HF parquet; public files -> HF parquet")
    p.add_argument("--to", required=True, choices=("sharegpt", "rl-json", "hf"))
    p.add_argument("--input", required=True, help="a build folder, or a public .json/.jsonl file")
    p.add_argument("--out", required=True)
    p.add_argument("--split", help="only this split of a build (train | eval)")
    p.set_defaults(func=cmd_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose or args.debug else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from canvasagent.cli.errors import quiet_third_party_loggers, run_command

    if not (args.verbose or args.debug):
        quiet_third_party_loggers()
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
