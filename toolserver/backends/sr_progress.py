"""Progress lines of a long SR call, and a follower process for native backends.

`progress_line` formats one line: tiles done, elapsed time, time left. Native SR (ncnn) prints
its per-tile percentages while holding the GIL, so no thread of the caller can report them;
`python sr_progress.py FILE NAME TILES EVERY_S START` runs beside the call instead, following
the file the native output is captured in and writing a progress line to its stderr at most
every EVERY_S seconds (elapsed time from START, a `time.time()`) until terminated. This file
imports only the standard library, so the follower starts fast.
"""

from __future__ import annotations

import os
import re
import sys
import time

PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s*$")


def progress_line(name: str, fraction: float, tiles: int, elapsed: float) -> str:
    """`name: tile i/n (p%), E s elapsed, about L s left` (no tile count for an untiled call)."""
    left = elapsed * (1 - fraction) / fraction
    done = f"tile {round(fraction * tiles)}/{tiles}" if tiles > 1 else "progress"
    return f"{name}: {done} ({100 * fraction:.0f}%), {elapsed:.0f} s elapsed, about {left:.0f} s left"


def follow(path: str, name: str, tiles: int, every_s: float, start: float | None = None, poll_s: float = 0.2) -> None:
    """Report the percentages appended to `path` until killed, or until the process that
    started it is gone (an orphaned follower must not poll forever)."""
    t0 = time.time() if start is None else start
    last = float("-inf")
    parent = os.getppid()
    with open(path, "rb") as f:
        buf = b""
        while True:
            chunk = f.read()
            if not chunk:
                if os.getppid() != parent:
                    return
                time.sleep(poll_s)
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                m = PERCENT.match(raw.decode(errors="replace"))
                now = time.time()
                if not m or now - last < every_s:
                    continue
                # ncnn prints a tile's percentage as it starts it: the value is the share done.
                fraction = float(m.group(1)) / 100
                if fraction > 0:
                    last = now
                    sys.stderr.write(progress_line(name, fraction, tiles, now - t0) + "\n")
                    sys.stderr.flush()


if __name__ == "__main__":
    follow(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
