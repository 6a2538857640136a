"""`canvasagent` command line: one entry point, subcommands discovered from `*_cmd.py` modules.

Each module in this package named `<something>_cmd.py` exposes `register(subparsers)` and sets
`func=` on its parsers; `func(args)` returns the exit code. Discovery keeps this file free of a
second list of commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from rich.logging import RichHandler

from canvasagent.cli.errors import (
    ShortErrorParser,
    add_debug_arg,
    quiet_third_party_loggers,
    run_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = ShortErrorParser(prog="canvasagent", description="CanvasAgent: visual tool-use agents")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_debug_arg(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith("_cmd")):
        importlib.import_module(f"{__name__}.{mod}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose or args.debug else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, rich_tracebacks=False, console=None)],
    )
    if not (args.verbose or args.debug):
        quiet_third_party_loggers()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
