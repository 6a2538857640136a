"""Check that the four packages' code is unchanged against a git revision, ignoring comments,
docstrings and layout: what a comment or docstring pass must show.

    python scripts/same_code.py 6ec955f

Compares, for every `.py` file under the packages that differs from REV, the AST with the
docstrings removed. Prints each file whose code changed, that is new or deleted, or that lost
or gained a `# type: ignore` / `# noqa` / `# pragma` marker; exits 1 if there is any. A file
that reads `__doc__` (argparse help) and whose module docstring changed is listed to check by hand.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = ("canvasagent", "toolserver", "canvascraft", "rewards")
_MARKER = re.compile(r"#\s*(type:\s*ignore|noqa|pragma)")


def code_fingerprint(source: str) -> str:
    """The AST of `source` without docstrings, as text: equal for sources that differ only in
    comments, docstrings and layout. Raises SyntaxError on invalid source."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def problems(old: str | None, new: str | None) -> list[str]:
    """What keeps `new` from being `old` with only comments, docstrings or layout changed."""
    if old is None or new is None:
        return ["new file" if old is None else "deleted"]
    out = []
    if code_fingerprint(old) != code_fingerprint(new):
        out.append("code changed")
    if len(_MARKER.findall(old)) != len(_MARKER.findall(new)):
        out.append("lint/type markers changed")
    if "__doc__" in new and ast.get_docstring(ast.parse(old)) != ast.get_docstring(ast.parse(new)):
        out.append("check by hand: the module docstring changed and the file reads __doc__")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision to compare with")
    ap.add_argument("--root", default=Path(__file__).resolve().parents[1], type=Path)
    args = ap.parse_args()
    git = ["git", "-C", str(args.root)]
    names = subprocess.run([*git, "diff", "--name-only", args.rev, "--", *PACKAGES],
                           capture_output=True, text=True, check=True).stdout.split()
    failed = 0
    for name in (n for n in names if n.endswith(".py")):
        path = args.root / name
        new = path.read_text(encoding="utf-8") if path.exists() else None
        shown = subprocess.run([*git, "show", f"{args.rev}:{name}"], capture_output=True, text=True)
        old = shown.stdout if shown.returncode == 0 else None
        for problem in problems(old, new):
            print(f"{name}: {problem}")
            failed += not problem.startswith("check by hand")
    print(f"{len(names)} files differ from {args.rev}; {failed} with changed code")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
