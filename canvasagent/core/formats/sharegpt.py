"""The public ShareGPT trajectory format (CanvasCraft-SFT, LLaMA-Factory style).

A record is `{"messages": [{"role": system|user|assistant|tool, "content": str}, ...],
"images": [path, ...]}`. Each `<image>` placeholder consumes the next path in `images`: the
user turn's placeholders are the inputs (img_1, img_2, ...), and a tool turn's placeholder is
the image that tool produced. The older `{"from": human|gpt|observation, "value": ...}`
spelling is accepted too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from PIL import Image

from canvasagent.core.imageio import DEFAULT_MAX_INPUT_PIXELS, load_image
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, safe_file_name, save_image

IMAGE_TOKEN = "<image>"
_ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
    "system": "system",
}
# The echo is appended as "\n[...]" to the tool's own text, which may itself end in a newline.
_ECHO_RE = re.compile(r"\n?\[(?:Output image saved as: [^.\]]+\. )?now imglist is \{[^}]*\}\]\s*$")
_LABEL_RE = re.compile(r"\bimg_\d+:\s*")


class FormatError(ValueError):
    pass


@dataclass
class RecordedToolTurn:
    text: str  # the tool's own text, imglist echo removed
    full_text: str  # as recorded, echo included
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class PublicTrajectory:
    task: Task
    system: str | None
    replies: list[str]  # assistant turns in order
    tool_turns: list[RecordedToolTurn | None]  # the tool reply after each assistant turn (None if absent)


def normalize_messages(record: dict[str, Any]) -> list[dict[str, str]]:
    """Messages as {role, content} strings, with the older ShareGPT role aliases mapped."""
    if not isinstance(record, dict):
        raise FormatError(f"a record must be an object, got {type(record).__name__}")
    raw = record.get("messages") or record.get("conversations")
    if not isinstance(raw, list) or not raw:
        raise FormatError("record has no 'messages' list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise FormatError(f"message {i} is not an object")
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value", ""))
        if not isinstance(role, str) or role not in _ROLE_ALIASES:
            raise FormatError(f"message {i} has unknown role {role!r:.80}")
        if isinstance(content, list):  # OpenAI-style parts: keep text, count images as placeholders
            if not all(isinstance(p, dict) and (p.get("type") != "text" or isinstance(p.get("text", ""), str)) for p in content):
                raise FormatError(f"message {i}: content parts must be objects, text parts with text strings")
            content = "".join(p.get("text", "") if p.get("type") == "text" else IMAGE_TOKEN for p in content)
        if not isinstance(content, str):
            raise FormatError(f"message {i} content must be text")
        out.append({"role": _ROLE_ALIASES[role], "content": content})
    if record.get("system") and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": str(record["system"])})
    return out


def strip_echo(text: str) -> str:
    """The tool's own text: only the echo is removed, so replayed echoes match byte for byte."""
    return _ECHO_RE.sub("", text, count=1)


def read_record(
    record: dict[str, Any],
    base_dir: str | Path = ".",
    allowed_roots: Iterable[str | Path] | None = None,
    max_pixels: int = DEFAULT_MAX_INPUT_PIXELS,
    input_overrides: dict[int, Image.Image] | None = None,
) -> PublicTrajectory:
    """Parse one public record into a task, the assistant replies and the recorded tool turns.
    Image paths are relative to `base_dir` and must resolve inside `allowed_roots` (default:
    `base_dir` alone); a path that escapes them (`../x.png`, an absolute path elsewhere, a
    symlink out) raises `ImageLoadError` before anything is read. Paths must be strings."""
    msgs = normalize_messages(record)
    raw_paths = record.get("images") or []
    if isinstance(raw_paths, str):
        raw_paths = [raw_paths]
    if not isinstance(raw_paths, list) or not all(isinstance(x, str) for x in raw_paths):
        raise FormatError("'images' must be a list of path strings")
    paths = list(raw_paths)
    roots = [base_dir] if allowed_roots is None else list(allowed_roots)
    cursor = 0

    def take(n: int, where: str) -> list[Image.Image]:
        nonlocal cursor
        if cursor + n > len(paths):
            raise FormatError(f"{where} has {n} <image> placeholders but only {len(paths) - cursor} images remain")
        imgs = [load_image(p, roots, base_dir, max_pixels) for p in paths[cursor : cursor + n]]
        cursor += n
        return imgs

    system = next((m["content"] for m in msgs if m["role"] == "system"), None)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if not users:
        raise FormatError("record has no user message")
    user = msgs[users[0]]["content"]
    n_inputs = user.count(IMAGE_TOKEN)
    overrides = input_overrides or {}
    if overrides:
        cursor += n_inputs  # keep the image cursor aligned even though the files are not read
        inputs = [overrides.get(i + 1) for i in range(n_inputs)]
        if any(x is None for x in inputs) or len(overrides) != n_inputs:
            raise FormatError(f"the record has {n_inputs} input images; give all of them (img_1..img_{n_inputs})")
    else:
        inputs = take(n_inputs, "the user turn")
    instruction = _LABEL_RE.sub("", user.replace(IMAGE_TOKEN, "")).strip()

    replies: list[str] = []
    tool_turns: list[RecordedToolTurn | None] = []
    for m in msgs[users[0] + 1 :]:
        if m["role"] == "assistant":
            replies.append(m["content"])
            tool_turns.append(None)
        elif m["role"] == "tool":
            if not replies:
                raise FormatError("a tool turn comes before any assistant turn")
            n = m["content"].count(IMAGE_TOKEN)
            text = m["content"].replace(IMAGE_TOKEN, "")
            tool_turns[-1] = RecordedToolTurn(strip_echo(text), text, take(n, f"tool turn {len(replies)}"))
    extra = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise FormatError("'extra_info' must be an object")
    expected = record.get("path") or []
    if not isinstance(expected, list) or not all(isinstance(x, str) for x in expected):
        raise FormatError("'path' must be a list of tool names")
    task = Task(
        instruction=instruction,
        images=list(inputs),  # type: ignore[arg-type]
        id=str(extra.get("id", record.get("id", "sharegpt"))),
        expected_tools=list(expected),
    )
    return PublicTrajectory(task, system, replies, tool_turns)


def loads_or_raise(text: str, where: str, error: type[Exception] = FormatError) -> Any:
    """`json.loads(text)`; bad or too deeply nested JSON raises `error` naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not JSON ({e})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records from a .json (one record or a list) or .jsonl file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{p}: not UTF-8 text ({e})") from None
    if p.suffix == ".jsonl":
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield loads_or_raise(line, f"{p}:{line_no}")
        return
    data = loads_or_raise(text, str(p))
    if isinstance(data, dict):
        yield data
    elif isinstance(data, list):
        yield from data
    else:
        raise FormatError(f"{p}: expected a record or a list of records")


def is_sharegpt(data: Any) -> bool:
    rec = data[0] if isinstance(data, list) and data else data
    return isinstance(rec, dict) and ("messages" in rec or "conversations" in rec) and "turns" not in rec


def to_record(traj: Trajectory, image_dir: str | Path, image_prefix: str | None = None) -> dict[str, Any]:
    """Write a trajectory as a public ShareGPT record; images are saved under `image_dir`.
    `image_prefix` is how the paths are written into the record (default: `image_dir` itself)."""
    image_dir = Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    prefix = str(image_dir) if image_prefix is None else image_prefix
    images: list[str] = []

    def save(asset_id: str) -> None:
        # Task IDs come from data: as file names they keep only safe characters.
        fname = save_image(traj.assets.get(asset_id).image, image_dir / safe_file_name(f"{traj.task.id}_{asset_id}")).name
        images.append(f"{prefix}/{fname}" if prefix else fname)

    input_ids = traj.assets.input_ids()
    user = "".join(f"{aid}: {IMAGE_TOKEN}\n" for aid in input_ids) + traj.task.instruction
    for aid in input_ids:
        save(aid)
    messages = [{"role": "system", "content": traj.system_prompt}, {"role": "user", "content": user}]
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.reply})
        if turn.observation is not None:
            content = turn.observation
            if turn.output_id is not None:
                save(turn.output_id)
                content = IMAGE_TOKEN + content
            messages.append({"role": "tool", "content": content})
    return {"messages": messages, "images": images}
