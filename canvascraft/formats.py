"""Dataset formats: HF parquet shards (native), public ShareGPT (SFT) and public RL JSON.

Native parquet columns (load with `datasets.load_dataset("parquet", data_files=...)`):

SFT (`sft-*.parquet`), one row per kept trajectory:
  id            str   stable row ID (`sft-<seed>-<slot>`)
  messages      list[{role, content}]  ShareGPT turns (system/user/assistant/tool); every `<image>`
                placeholder consumes the next entry of `images`
  images        list[Image]  PNG bytes: the inputs, then each tool output in registration order
  final_image   Image | None the last produced asset (None for read-only chains: OCR, Grounding)
  instruction   str   the user request;  tone: explicit | implicit;  writer: template | llm
  chain, group  str   chain template name and its group (single | hard | user)
  tools         list[str]  tool sequence executed
  n_turns       int   assistant turns (calls + the terminating turn)
  source        str   JSON: what the image source knew about each input
  trajectory    str   JSON of `Trajectory.to_dict()` (replayable; asset files = `images`)

RL (`rl-<split>-*.parquet`), one row per task:
  id, split (train | eval), prompt, tone, chain   str
  images        list[Image]  input images (empty when the task starts with generation)
  path          list[str]    the expected tool set (the public RL `path`)
  reasoning, length, diversity  str  easy | medium | hard (paper Table 2)
  n_steps, n_tools  int
  checks        str   JSON list of verifiable checks for the offline alignment judge
  reference_image  Image | None  expected final image, when the reference solution is deterministic
  reference_calls  str | None  JSON list of the reference solution's calls ({name, arguments}), when
                its tools ran in the build (the `scripted:oracle` policy replays them)

Public formats are written beside their images; extra CanvasCraft columns ride along under a
`canvascraft` key (ShareGPT) or inside `extra_info` (RL JSON), which public readers ignore and
our readers use, so both round-trips are lossless. A ShareGPT export also gets a
`dataset_info.json` entry (`write_dataset_info`), so LLaMA-Factory can train on the folder as is.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq

from canvasagent.core.formats.sharegpt import iter_records, normalize_messages, to_record
from canvasagent.core.imageio import open_image, resolve_path, to_png_bytes
from canvasagent.core.trajectory import Trajectory

_IMG = datasets.Image()
_STR = datasets.Value("string")

SFT_FEATURES = datasets.Features(
    {
        "id": _STR,
        "messages": datasets.List({"role": _STR, "content": _STR}),
        "images": datasets.List(_IMG),
        "final_image": _IMG,
        "instruction": _STR,
        "tone": _STR,
        "writer": _STR,
        "chain": _STR,
        "group": _STR,
        "tools": datasets.List(_STR),
        "n_turns": datasets.Value("int32"),
        "source": _STR,
        "trajectory": _STR,
    }
)
RL_FEATURES = datasets.Features(
    {
        "id": _STR,
        "split": _STR,
        "prompt": _STR,
        "tone": _STR,
        "chain": _STR,
        "images": datasets.List(_IMG),
        "path": datasets.List(_STR),
        "reasoning": _STR,
        "length": _STR,
        "diversity": _STR,
        "n_steps": datasets.Value("int32"),
        "n_tools": datasets.Value("int32"),
        "checks": _STR,
        "reference_image": _IMG,
        "reference_calls": _STR,
    }
)
FEATURES = {"sft": SFT_FEATURES, "rl": RL_FEATURES}


def dump_checks(checks: list[dict[str, Any]]) -> str:
    """The `checks` cell: one canonical JSON spelling, so files round-trip byte for byte."""
    return json.dumps(checks, ensure_ascii=False, sort_keys=True)


def png(image) -> dict[str, Any]:
    """An image cell: PNG bytes we encode ourselves, so a JPEG input is never re-encoded lossily."""
    return {"bytes": to_png_bytes(image), "path": None}


def sft_row(traj: Trajectory, source_meta: list[dict[str, Any]], writer: str) -> dict[str, Any]:
    """A parquet row from a kept trajectory; messages come from the public ShareGPT writer.

    Wall-clock timings are zeroed: they say nothing about the data, and without them a rebuilt
    shard is byte-identical to the original (what makes kill-and-resume checkable).
    """
    for t in traj.turns:
        t.policy_s = t.tool_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        rec = to_record(traj, tmp, image_prefix="")
        images = [_load_cell(Path(tmp), name) for name in rec["images"]]
    final = traj.final_asset()
    meta = traj.task.meta
    return {
        "id": traj.task.id,
        "messages": rec["messages"],
        "images": images,
        "final_image": png(final.image) if final else None,
        "instruction": traj.task.instruction,
        "tone": meta.get("tone", ""),
        "writer": writer,
        "chain": meta.get("chain", ""),
        "group": meta.get("group", ""),
        "tools": traj.tool_sequence,
        "n_turns": len(traj.turns),
        "source": json.dumps(source_meta, ensure_ascii=False, sort_keys=True),
        "trajectory": json.dumps(traj.to_dict(), ensure_ascii=False, sort_keys=True, default=str),
    }


def write_parquet_atomic(rows: list[dict[str, Any]], kind: str, path: str | Path) -> Path:
    """Write a shard to a temporary name and rename it, so a reader never sees half a shard."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset.from_list(rows, features=FEATURES[kind]) if rows else datasets.Dataset.from_dict(
        {k: [] for k in FEATURES[kind]}, features=FEATURES[kind]
    )
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        ds.to_parquet(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_rows(files: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Rows with image cells left as {"bytes", "path"} (no decoding, exact bytes)."""
    rows: list[dict[str, Any]] = []
    for f in sorted(map(str, files)):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def load_hf(files: Iterable[str | Path]) -> datasets.Dataset:
    """The shards as one `datasets.Dataset` (images decode to PIL), for trainers."""
    return datasets.load_dataset("parquet", data_files=sorted(map(str, files)), split="train")


def trajectory_of(row: dict[str, Any]) -> Trajectory:
    """Rebuild a `Trajectory` (with its assets) from an SFT row."""
    d = json.loads(row["trajectory"])
    images = {a["id"]: open_image(cell["bytes"]) for a, cell in zip(d["assets"], row["images"])}
    return Trajectory.from_dict(d, images)


def _save_cell(cell: dict[str, Any], out: Path, name: str) -> str:
    """Write an image cell's bytes as they are (no re-encoding) and return its relative path."""
    rel = f"images/{name}.png"
    (out / rel).write_bytes(cell["bytes"])
    return rel


def _save_cells(cells: list[dict[str, Any]], out: Path, row_id: str) -> list[str]:
    return [_save_cell(c, out, f"{row_id}_{k}") for k, c in enumerate(cells)]


def _load_cell(base: Path, rel: str | None) -> dict[str, Any] | None:
    """The image cell a public record names; a path outside the record's folder raises `ImageLoadError`."""
    if not rel:
        return None
    return {"bytes": resolve_path(rel, [base], base).read_bytes(), "path": None}


def write_sharegpt(rows: list[dict[str, Any]], out_dir: str | Path, name: str = "sharegpt.json") -> Path:
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for row in rows:
        extra = {k: v for k, v in row.items() if k not in ("messages", "images", "final_image")}
        if row.get("final_image"):
            extra["final_image"] = _save_cell(row["final_image"], out, f"{row['id']}_final")
        records.append({"messages": row["messages"], "images": _save_cells(row["images"], out, row["id"]), "canvascraft": extra})
    path = out / name
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1))
    return path


# LLaMA-Factory reads a ShareGPT file through an entry of `dataset_info.json` in the dataset
# folder: `columns` names the record keys, `tags` the message keys and role values. Image paths
# are relative to that folder (its default `media_dir`). The tool schemas stay inside the system
# message, in the policy's own prompt format, so no `tools` column is declared.
LLAMAFACTORY_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "system_tag": "system",
}


def llamafactory_entry(file_name: str) -> dict[str, Any]:
    """The `dataset_info.json` entry for a ShareGPT file written by `write_sharegpt`."""
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": dict(LLAMAFACTORY_TAGS),
    }


def write_dataset_info(out_dir: str | Path, file_name: str, name: str = "canvascraft_sft") -> Path:
    """Add (or replace) the entry `name` for `file_name` in `out_dir/dataset_info.json`.

    Other entries of an existing file are kept as they are, so the export can go into a
    LLaMA-Factory `data/` folder that already lists other datasets. A file that is not a JSON
    object is refused (ValueError) rather than overwritten.
    """
    path = Path(out_dir) / "dataset_info.json"
    info: dict[str, Any] = {}
    if path.exists():
        try:
            info = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); fix or move it, the export will not overwrite it") from None
        if not isinstance(info, dict):
            raise ValueError(f"{path} is not a JSON object of dataset entries; fix or move it, the export will not overwrite it")
    info[name] = llamafactory_entry(file_name)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info, ensure_ascii=False, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_sharegpt(path: str | Path) -> list[dict[str, Any]]:
    """SFT rows from a ShareGPT file (ours or the public release; missing columns stay empty)."""
    path = Path(path)
    rows = []
    for i, rec in enumerate(iter_records(path)):
        extra = dict(rec.get("canvascraft") or {})
        msgs = normalize_messages(rec)  # role aliases (human/gpt/observation) as the public reader maps them
        row = {k: None for k in SFT_FEATURES}
        row.update(
            id=str(rec.get("id", f"{path.stem}-{i:06d}")),
            messages=msgs,
            images=[_load_cell(path.parent, p) for p in rec.get("images") or []],
            final_image=_load_cell(path.parent, extra.pop("final_image", None)),
            tools=[],
            n_turns=sum(m["role"] == "assistant" for m in msgs),
        )
        row.update(extra)
        rows.append(row)
    return rows


_RL_EXTRA = ("split", "chain", "reasoning", "length", "diversity", "n_steps", "n_tools", "checks", "reference_calls")


def write_rl_json(rows: list[dict[str, Any]], out_dir: str | Path, name: str = "rl.json") -> Path:
    """`{"path", "image", "prompt", "extra_info": {"id", "tone", ...}}` per task, images beside."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for row in rows:
        extra: dict[str, Any] = {"id": row["id"], "tone": row["tone"]}
        extra.update({k: row[k] for k in _RL_EXTRA if row.get(k) is not None})
        if "checks" in extra:
            extra["checks"] = json.loads(extra["checks"])  # a list in the public file, for humans and judges
        if row.get("reference_image"):
            extra["reference_image"] = _save_cell(row["reference_image"], out, f"{row['id']}_reference")
        paths = _save_cells(row["images"], out, row["id"])
        records.append({"path": list(row["path"]), "image": paths, "prompt": row["prompt"], "extra_info": extra})
    path = out / name
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1))
    return path


def read_rl_json(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    rows = []
    for i, rec in enumerate(iter_records(path)):
        extra = dict(rec.get("extra_info") or {})
        row = {k: None for k in RL_FEATURES}
        row.update(
            id=str(extra.pop("id", f"{path.stem}-{i:06d}")),
            tone=extra.pop("tone", None),
            prompt=rec.get("prompt", ""),
            path=list(rec.get("path") or []),
            images=[_load_cell(path.parent, p) for p in rec.get("image") or []],
            reference_image=_load_cell(path.parent, extra.pop("reference_image", None)),
        )
        if isinstance(extra.get("checks"), list):
            extra["checks"] = dump_checks(extra["checks"])
        row.update({k: v for k, v in extra.items() if k in RL_FEATURES})
        rows.append(row)
    return rows
