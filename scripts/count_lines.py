"""Count the lines of the four packages: physical lines, and lines of code (no blank lines,
comments or docstrings). The measure docs/ARCHITECTURE.md's "Size" section quotes.

    python scripts/count_lines.py            # totals
    python scripts/count_lines.py --files 20 # and the 20 largest files by lines of code
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

PACKAGES = ("canvasagent", "toolserver", "canvascraft", "rewards")
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source: str) -> int:
    """Lines holding a token that is neither a comment nor part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIPPED:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parents[1], type=Path)
    ap.add_argument("--files", type=int, default=0, help="also list this many largest files")
    args = ap.parse_args()
    rows = []
    for package in PACKAGES:
        for path in sorted((args.root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rows.append((code_lines(text), text.count("\n"), path.relative_to(args.root)))
    for code, physical, path in sorted(rows, reverse=True)[: args.files]:
        print(f"{code:6d} {physical:6d}  {path}")
    print(f"physical lines {sum(r[1] for r in rows):,}; lines of code {sum(r[0] for r in rows):,} ({len(rows)} files)")


if __name__ == "__main__":
    main()
