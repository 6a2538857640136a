"""How every command line of the project turns bad user input into one line instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a subcommand; a missing or unreadable file, a malformed config or JSON, or a bad value
    the command did not report itself becomes `error: ...` and exit code 2 (`-v` re-raises, so
    the traceback is one flag away)."""
    import yaml

    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, yaml.YAMLError) as e:
        if getattr(args, "verbose", False):
            raise
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
