"""Where a benchmark's markdown report goes: standard output, and the `--results` file if given."""

from __future__ import annotations

from pathlib import Path


def emit(text: str, results: Path | None) -> None:
    """Print `text`; write it, with a final newline, to `results` (its folder made) unless None."""
    print(text)
    if results:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(text + "\n")
