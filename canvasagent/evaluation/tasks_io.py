"""Read an evaluation split from disk into `Task`s.

Accepted layouts (the first that matches wins):
- a CanvasCraft RL build directory (its manifest names the shards; the held-out `eval` split is read);
- a directory with `tasks.jsonl`, `eval.jsonl` or `test.jsonl`, or a `.jsonl`/`.json` file;
- a directory of task folders, each with a `task.json`.

Accepted records: ours (`Task.to_dict()` plus `"images": [paths]`), and the public CanvasCraft-RL
record `{"path": [tools], "image": [paths], "prompt": text, "extra_info": {"id", ...}}`.
Image paths (inputs and reference images) are relative to the file that names them and must
resolve inside the allowed roots (default: that file's folder); any other path is refused with
`TaskLoadError` before it is opened.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

from canvascraft.build import MANIFEST, read_tasks

from canvasagent.core.formats.sharegpt import loads_or_raise
from canvasagent.core.imageio import ImageLoadError, open_image, resolve_path
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import safe_file_name, save_image

log = logging.getLogger(__name__)

SPLIT_FILES = ("tasks.jsonl", "eval.jsonl", "test.jsonl", "tasks.json", "eval.json", "rl.json")


class TaskLoadError(ValueError):
    pass


def _confined(p: Any, base: Path, roots: list[Path] | None) -> Path:
    """`p` resolved against `base`; refused unless it lies inside `roots` (default: `base`)."""
    if not isinstance(p, str) or not p:
        raise TaskLoadError(f"an image path must be a non-empty string, got {p!r:.80}")
    try:
        return resolve_path(p, allowed_roots=[base] if roots is None else roots, base=base)
    except ImageLoadError as e:
        raise TaskLoadError(str(e)) from None


def _images(paths: Any, base: Path, roots: list[Path] | None = None) -> list:
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, (list, type(None))):
        raise TaskLoadError(f"images must be a path or a list of paths, got {type(paths).__name__}")
    return [open_image(_confined(p, base, roots)) for p in paths or []]


LABEL_AXES = ("reasoning", "length", "diversity")  # the paper's R/L/D axes


def task_from_record(rec: dict[str, Any], base: Path, index: int = 0, allowed_roots: Iterable[str | Path] | None = None) -> Task:
    """One record as a `Task`; image paths resolve against `base` and must stay inside
    `allowed_roots` (default: `base`). A record of the wrong shape raises `TaskLoadError`."""
    if not isinstance(rec, dict):
        raise TaskLoadError(f"task {index}: expected an object, got {type(rec).__name__}")
    try:
        task = _task_from_record(rec, base, index, None if allowed_roots is None else [Path(r) for r in allowed_roots])
        if not isinstance(task.instruction, str) or not isinstance(task.id, str):
            raise TaskLoadError(f"task {index}: the instruction and the id must be strings")
        return task
    except (TaskLoadError, ImageLoadError):
        raise
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError, RecursionError) as e:
        raise TaskLoadError(f"task {index}: malformed record ({type(e).__name__}: {str(e)[:200]})") from None


def _task_from_record(rec: dict[str, Any], base: Path, index: int, roots: list[Path] | None) -> Task:
    if "prompt" in rec and "instruction" not in rec:  # public CanvasCraft-RL record (ours adds checks/labels)
        extra = dict(rec.get("extra_info") or {})
        checks = extra.pop("checks", None) or []
        if isinstance(checks, str):
            checks = json.loads(checks)
        labels = {ax: str(extra.pop(ax)) for ax in LABEL_AXES if extra.get(ax) is not None}
        ref = extra.pop("reference_image", None)
        if ref:
            extra["reference_images"] = [str(_confined(ref, base, roots))]
        return Task(
            instruction=rec["prompt"],
            images=_images(rec.get("image") or rec.get("images"), base, roots),
            id=str(extra.pop("id", rec.get("id", f"task_{index:05d}"))),
            expected_tools=list(rec.get("path") or []),
            checks=list(checks),
            labels=labels,
            meta=extra,
        )
    d = dict(rec)
    d.setdefault("id", f"task_{index:05d}")
    meta = dict(d.get("meta") or {})
    if meta.get("reference_images"):  # paths relative to the split, for the reference_similarity check
        meta["reference_images"] = [str(_confined(r, base, roots)) for r in meta["reference_images"]]
        d["meta"] = meta
    return Task.from_dict(d, _images(d.get("images") or d.get("image_paths"), base, roots))


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskLoadError(f"{path}: not UTF-8 text ({e})") from None
    if path.suffix == ".jsonl":
        recs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                recs.append(loads_or_raise(line, f"{path}:{n}", TaskLoadError))
                if not isinstance(recs[-1], dict):
                    raise TaskLoadError(f"{path}:{n}: expected a task object, got {type(recs[-1]).__name__}")
        return recs
    data = loads_or_raise(text, str(path), TaskLoadError)
    recs = data if isinstance(data, list) else data.get("tasks", [data]) if isinstance(data, dict) else None
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        raise TaskLoadError(f"{path}: expected a task object, a list of them or {{\"tasks\": [...]}}")
    return recs


def _canvascraft_tasks(p: Path, split: str) -> list[Task] | None:
    """Tasks of a CanvasCraft RL build directory, or None when `p` is not one."""
    if not (p / MANIFEST).is_file():
        return None
    try:
        return read_tasks(p, split)
    except ValueError as e:  # an SFT build, or no `split` shards
        raise TaskLoadError(str(e)) from None


def load_tasks(
    path: str | Path, limit: int | None = None, split: str = "eval", allowed_roots: Iterable[str | Path] | None = None
) -> list[Task]:
    """Tasks of a split (see the module docstring); image paths must stay inside `allowed_roots`."""
    p = Path(path)
    if not p.exists():
        raise TaskLoadError(f"task split {p} does not exist")
    built = _canvascraft_tasks(p, split)
    if built is not None:
        return built[:limit] if limit else built
    if p.is_file():
        files = [p]
    else:
        files = [p / name for name in SPLIT_FILES if (p / name).exists()][:1] or sorted(p.glob("*/task.json"))
    if not files:
        raise TaskLoadError(f"no tasks in {p}: expected one of {', '.join(SPLIT_FILES)} or */task.json")
    tasks: list[Task] = []
    for f in files:
        for rec in _read_records(f):
            tasks.append(task_from_record(rec, f.parent, len(tasks), allowed_roots))
            if limit and len(tasks) >= limit:
                return tasks
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskLoadError(f"{p}: task ids are not unique (resume and replay key on them)")
    return tasks


def write_tasks(tasks: list[Task], out_dir: str | Path) -> Path:
    """Write tasks as `tasks.jsonl` + images; PIL reference images in `meta["reference_images"]`
    are saved as files too, so reference checks still run when the split is read back."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for t in tasks:
        rec = t.to_dict()
        stem = safe_file_name(t.id)  # task IDs come from data: never a path out of images/
        rec["images"] = [f"images/{save_image(img, out / 'images' / f'{stem}_{i}').name}" for i, img in enumerate(t.images, 1)]
        refs = []
        for k, ref in enumerate(t.meta.get("reference_images") or []):
            if hasattr(ref, "save"):  # a PIL reference image is stored beside the inputs
                ref = f"images/{save_image(ref, out / 'images' / f'{stem}_reference_{k}').name}"
            refs.append(str(ref))
        if refs:
            rec["meta"] = {**rec["meta"], "reference_images": refs}
        lines.append(json.dumps(rec, ensure_ascii=False))
    path = out / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
