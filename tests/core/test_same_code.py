"""`scripts/same_code.py` tells a comment/docstring/layout edit from a code edit, on real
project files and on a real git repository."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "same_code.py"


def _load():
    spec = importlib.util.spec_from_file_location("same_code", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


same_code = _load()
SOURCE = (ROOT / "canvasagent" / "core" / "protocol.py").read_text(encoding="utf-8")


def test_comments_docstrings_and_layout_do_not_count():
    edited = SOURCE.replace('"""', '"""Reworded. ', 1) + "\n\n# a trailing comment\n"
    edited = edited.replace("\n\n\ndef ", "\n\n\n# why this helper exists\ndef ", 3)
    assert edited != SOURCE
    assert same_code.problems(SOURCE, edited) == []


def test_a_code_edit_is_caught():
    assert "return " in SOURCE
    assert same_code.problems(SOURCE, SOURCE.replace("return ", "return  not ", 1)) == ["code changed"]
    # Removing the only docstring of a body changes the AST shape (an empty body is invalid).
    assert same_code.problems("def f():\n    'doc'\n    return 1\n", "def f():\n    return 2\n") == ["code changed"]


def test_markers_new_and_deleted_files_are_caught():
    assert same_code.problems("x = f()  # type: ignore\n", "x = f()\n") == ["lint/type markers changed"]
    assert same_code.problems(None, "x = 1\n") == ["new file"]
    assert same_code.problems("x = 1\n", None) == ["deleted"]


def test_cli_on_a_git_repository(tmp_path):
    pkg = tmp_path / "rewards"
    pkg.mkdir()
    (pkg / "m.py").write_text('"""Doc."""\n\nX = 1\n')
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    run = lambda: subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--root", str(tmp_path)],
                                 capture_output=True, text=True)
    (pkg / "m.py").write_text('"""Another doc."""\n\n# why\nX = 1\n')
    ok = run()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (pkg / "m.py").write_text('"""Doc."""\n\nX = 2\n')
    bad = run()
    assert bad.returncode == 1 and "rewards/m.py: code changed" in bad.stdout
