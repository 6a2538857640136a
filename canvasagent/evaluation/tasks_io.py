"""Read an evaluation split from disk into `Task`s.

Accepted layouts (the first that matches wins):
- a directory with `tasks.jsonl`, `eval.jsonl` or `test.jsonl`, or a `.jsonl`/`.json` file;
- a directory of task folders, each with a `task.json`.

Accepted records: ours (`Task.to_dict()` plus `"images": [paths]`), and the public CanvasCraft-RL
record `{"path": [tools], "image": [paths], "prompt": text, "extra_info": {"id", ...}}`.
Image paths are relative to the file that names them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from canvasagent.imageio import open_image
from canvasagent.tasks import Task

log = logging.getLogger(__name__)

SPLIT_FILES = ("tasks.jsonl", "eval.jsonl", "test.jsonl", "tasks.json", "eval.json")


class TaskLoadError(ValueError):
    pass


def _images(paths: Any, base: Path) -> list:
    if isinstance(paths, str):
        paths = [paths]
    out = []
    for p in paths or []:
        path = Path(p)
        if not path.is_absolute():
            path = base / path
        out.append(open_image(path))
    return out


def task_from_record(rec: dict[str, Any], base: Path, index: int = 0) -> Task:
    if "prompt" in rec and "instruction" not in rec:  # public CanvasCraft-RL record
        extra = rec.get("extra_info") or {}
        return Task(
            instruction=rec["prompt"],
            images=_images(rec.get("image") or rec.get("images"), base),
            id=str(extra.get("id", rec.get("id", f"task_{index:05d}"))),
            expected_tools=list(rec.get("path") or []),
            meta={k: v for k, v in extra.items() if k != "id"},
        )
    d = dict(rec)
    d.setdefault("id", f"task_{index:05d}")
    return Task.from_dict(d, _images(d.get("images") or d.get("image_paths"), base))


def _read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        recs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskLoadError(f"{path}:{n}: not JSON ({e})") from e
        return recs
    data = json.loads(text)
    return data if isinstance(data, list) else data.get("tasks", [data])


def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    p = Path(path)
    if not p.exists():
        raise TaskLoadError(f"task split {p} does not exist")
    files: list[Path] = []
    if p.is_file():
        files = [p]
    else:
        files = [p / name for name in SPLIT_FILES if (p / name).exists()][:1]
        if not files:
            files = sorted(p.glob("*/task.json"))
    if not files:
        raise TaskLoadError(f"no tasks in {p}: expected one of {', '.join(SPLIT_FILES)} or */task.json")
    tasks: list[Task] = []
    for f in files:
        for rec in _read_records(f):
            tasks.append(task_from_record(rec, f.parent, len(tasks)))
            if limit and len(tasks) >= limit:
                return tasks
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskLoadError(f"{p}: task ids are not unique (resume and replay key on them)")
    return tasks


def write_tasks(tasks: list[Task], out_dir: str | Path) -> Path:
    """Write tasks as `tasks.jsonl` + images (used by tests and the agent's probe sets)."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for t in tasks:
        rec = t.to_dict()
        paths = []
        for i, img in enumerate(t.images, 1):
            rel = f"images/{t.id}_{i}.png"
            img.save(out / rel)
            paths.append(rel)
        rec["images"] = paths
        lines.append(json.dumps(rec, ensure_ascii=False))
    path = out / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
