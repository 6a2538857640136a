"""How every command line of the project turns bad user input into one line instead of a traceback.

`run_command(func, args)` runs a subcommand: an error becomes `error: ...` on stderr (one or two
lines, naming the valid choices where the error has them) and exit code 2; `--debug` on the
namespace re-raises instead, so the traceback is one flag away. `quiet_third_party_loggers()`
keeps the INFO chatter of HTTP clients, Ray and friends out of the user's terminal.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable

# Libraries whose INFO lines drown our own. Importing ray resets the "ray" logger to INFO, so its
# sub-packages are named as well: their own levels survive the import.
THIRD_PARTY_LOGGERS = (
    "httpx", "httpcore", "urllib3", "requests", "ray", "ray._private", "ray.serve", "ray.data", "ray.util",
    "ray.dashboard", "filelock", "fsspec",
    "asyncio", "PIL", "matplotlib", "datasets", "huggingface_hub", "transformers", "accelerate",
    "torch", "uvicorn", "uvicorn.access", "uvicorn.error", "h5py", "gradio", "websockets", "multipart",
)


def quiet_third_party_loggers(level: int = logging.WARNING) -> None:
    """Raise the threshold of the loggers in `THIRD_PARTY_LOGGERS` to `level`."""
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(level)


class ShortErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are two lines (the error, naming the valid choices
    where argparse has them, and where to find the options) instead of the full usage text.
    Subcommand parsers made from it inherit the behaviour."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}\n(see `{self.prog} -h` for the options)\n")


def add_debug_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="debug logging, and show tracebacks on errors")


_NO_CONFIG = re.compile(r"^no (\w+) config ")


def config_choices(kind: str) -> str:
    """The shipped config names of configs/<kind>/, comma-separated ('' when there are none)."""
    from toolserver.config import CONFIG_DIR

    return ", ".join(sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml")))


def one_line(e: BaseException) -> str:
    """The exception as `error: ...` text with whitespace collapsed; multi-line messages that
    are lists (a `PreflightError`) keep their lines."""
    problems = getattr(e, "problems", None)
    if problems:
        return "error: the run cannot start:\n" + "\n".join(f"  - {' '.join(str(p).split())}" for p in problems)
    text = " ".join(str(e).split())
    m = _NO_CONFIG.match(text) if isinstance(e, FileNotFoundError) else None
    if m and config_choices(m.group(1)):
        # A mistyped config name: name the valid ones instead of the paths that were tried.
        return f"error: {text.split(' (looked for', 1)[0]}; choose a YAML path or one of: {config_choices(m.group(1))}"
    if not _unexpected(e):
        return f"error: {text}" if text else f"error: {type(e).__name__}"
    return f"error: {type(e).__name__}: {text}" if text else f"error: {type(e).__name__}"


def _unexpected(e: BaseException) -> bool:
    """A built-in error other than a bad file or value (KeyError, TypeError, ...): likely a bug,
    so the message names the type and points at --debug. Errors of our own and of libraries
    carry messages written for users."""
    return type(e).__module__ == "builtins" and not isinstance(e, (OSError, ValueError))


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a subcommand; any error it did not report itself becomes `error: ...` on stderr and
    exit code 2 (`--debug` re-raises). Ctrl-C exits 130."""
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the command line's last line of defence: one line, not a traceback
        if getattr(args, "debug", False):
            raise
        print(one_line(e), file=sys.stderr)
        if _unexpected(e):
            print("(run again with --debug for the traceback)", file=sys.stderr)
        return 2
