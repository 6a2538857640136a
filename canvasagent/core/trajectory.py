"""The record of one episode: every turn's text, call, result, error, asset IDs and timing.

Everything downstream reads this object: the rule reward and judges, the CanvasCraft QC and
writers, GRPO reward functions, evaluation tables and the UI. It serialises to
`trajectory.json` plus one image file per asset (PNG; TIFF for modes PNG cannot hold, such
as CMYK or float), and loads back with its images.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from PIL import Image

from canvasagent.core.assets import Asset, AssetStore, Provenance
from canvasagent.core.imageio import ImageLoadError, open_image, resolve_path
from canvasagent.core.protocol import Finding, ToolCall
from canvasagent.core.tasks import Task
from toolserver.registry import OutputKind

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


# Modes PNG stores and reads back unchanged; TIFF holds the rest of what inputs may be (a CMYK
# JPEG, a float or 32-bit TIFF). Anything else is converted to RGB(A) with a warning.
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I;16B"})
_TIFF_MODES = frozenset({"CMYK", "F", "I", "I;16L", "LAB", "PA"})
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def image_suffix(image: Image.Image) -> str:
    """The file suffix `save_image` uses for `image`: .png, or .tiff for modes PNG cannot hold."""
    return ".tiff" if image.mode in _TIFF_MODES else ".png"


def save_image(image: Image.Image, stem: str | Path) -> Path:
    """Write `image` as `stem` + `image_suffix(image)` without changing its mode when PNG or
    TIFF can hold it; other modes (RGBX, YCbCr, HSV, ...) are written as RGB/RGBA PNG."""
    stem = Path(stem)
    path = stem.with_name(stem.name + image_suffix(image))
    if image.mode in _TIFF_MODES:
        image.save(path, format="TIFF")
    elif image.mode in _PNG_MODES:
        image.save(path, format="PNG")
    else:
        log.warning("saving a %s image as %s PNG: no lossless format here keeps that mode", image.mode,
                    "RGBA" if "A" in image.mode.upper() else "RGB")
        image.convert("RGBA" if "A" in image.mode.upper() else "RGB").save(path, format="PNG")
    return path


def safe_file_name(text: str, max_len: int = 96) -> str:
    """`text` as one path component: only letters, digits, `_`, `.`, `-`, never `.`/`..` or empty."""
    name = _SAFE_NAME.sub("_", text)[:max_len].lstrip(".")
    return name or "_"


class TrajectoryLoadError(ValueError):
    """A trajectory file that cannot be read back (not ours, or naming files outside its folder)."""


def json_bytes(data: Any, indent: int | None = 2) -> bytes:
    """`data` as UTF-8 JSON that always encodes and reads back to the same strings.
    Non-ASCII text stays readable; a lone surrogate (which UTF-8 cannot hold, and a model may emit)
    is written as its `\\uXXXX` escape, valid inside JSON strings and decoding to the same code point
    (a high surrogate directly followed by a low one reads back as the character the pair encodes)."""
    return json.dumps(data, indent=indent, ensure_ascii=False, default=str).encode("utf-8", "backslashreplace")


def write_json_atomic(path: str | Path, data: Any, indent: int | None = 2) -> Path:
    """Write `json_bytes(data)` to `path` via a temp file and a rename: a reader never sees half."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(json_bytes(data, indent))
    tmp.replace(path)
    return path


@dataclass
class Turn:
    index: int
    reply: str
    reason: str | None = None
    findings: list[Finding] = field(default_factory=list)
    call: ToolCall | None = None  # the call that was (or would have been) executed
    n_calls: int = 0  # calls written in the reply (more than one is a format error)
    check: dict[str, Any] | None = None  # toolserver.validation.CallCheck.to_dict()
    # ok: tool ran; error: tool or validation failed; parse_error: nothing executable;
    # terminate: the policy ended the episode; no_call: neither call nor terminate.
    status: str = "no_call"
    error_code: str | None = None
    error: str | None = None
    tool_text: str | None = None
    output_id: str | None = None
    result_data: dict[str, Any] = field(default_factory=dict)
    observation: str | None = None
    imglist: list[str] = field(default_factory=list)  # after this turn
    plumbing_only: bool = False
    policy_s: float = 0.0
    tool_s: float = 0.0

    @property
    def terminated(self) -> bool:
        return self.status == "terminate"

    def to_dict(self) -> dict[str, Any]:
        """Every field, in declaration order, with the findings and the call as their own dicts."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(findings=[f.to_dict() for f in self.findings], call=self.call.to_dict() if self.call else None)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Turn":
        """A turn from `to_dict()` output; a field of the wrong type raises TypeError."""
        call = d.get("call")
        for k in ("reply", "status"):
            if not isinstance(d.get(k, ""), str):
                raise TypeError(f"turn field {k!r} must be a string")
        for k in ("reason", "error_code", "error", "tool_text", "output_id", "observation"):
            if not isinstance(d.get(k), (str, type(None))):
                raise TypeError(f"turn field {k!r} must be a string or null")
        if not isinstance(d.get("imglist") or [], list) or not all(isinstance(x, str) for x in d.get("imglist") or []):
            raise TypeError("turn field 'imglist' must be a list of asset IDs")
        if call is not None and (not isinstance(call, dict) or not isinstance(call.get("name"), str)
                                 or not isinstance(call.get("arguments") or {}, dict)):
            raise TypeError("turn field 'call' must be {name: str, arguments: object}")
        plain = ("reason", "check", "status", "error_code", "error", "tool_text", "output_id", "observation")
        return cls(
            index=d["index"],
            reply=d.get("reply", ""),
            findings=[Finding.from_dict(x) for x in d.get("findings", [])],
            call=ToolCall(call["name"], call.get("arguments")) if call else None,
            n_calls=d.get("n_calls", 1 if call else 0),
            result_data=d.get("result_data") or {},
            imglist=list(d.get("imglist") or []),
            plumbing_only=bool(d.get("plumbing_only", False)),
            policy_s=float(d.get("policy_s", 0.0)),
            tool_s=float(d.get("tool_s", 0.0)),
            **{k: d[k] for k in plain if k in d},
        )


@dataclass
class Trajectory:
    task: Task
    assets: AssetStore
    turns: list[Turn] = field(default_factory=list)
    # terminate | submit | budget (an environment's step budget) | max_turns | policy_error | interrupted
    stop_reason: str = "running"
    system_prompt: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def terminated(self) -> bool:
        return self.stop_reason in ("terminate", "submit")

    @property
    def calls(self) -> list[Turn]:
        """Turns in which the policy wrote at least one tool call."""
        return [t for t in self.turns if t.n_calls > 0]

    @property
    def tool_sequence(self) -> list[str]:
        return [t.call.name for t in self.turns if t.call is not None]

    def final_asset(self) -> Asset | None:
        return self.assets.last_produced()

    @property
    def final_asset_id(self) -> str | None:
        a = self.final_asset()
        return a.id if a else None

    @property
    def plumbing_only(self) -> bool:
        return any(t.plumbing_only for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "task": self.task.to_dict(),
            "system_prompt": self.system_prompt,
            "stop_reason": self.stop_reason,
            "final_asset_id": self.final_asset_id,
            "turns": [t.to_dict() for t in self.turns],
            "assets": [
                {
                    "id": a.id,
                    "kind": a.kind.value,
                    "mode": a.image.mode,
                    "size": list(a.size),
                    "file": f"assets/{a.id}{image_suffix(a.image)}",
                    "provenance": a.provenance.to_dict(),
                    "plumbing_only": a.plumbing_only,
                }
                for a in self.assets
            ],
            "meta": self.meta,
        }

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        (out / "assets").mkdir(parents=True, exist_ok=True)
        for a in self.assets:
            if not _SAFE_ID.match(a.id):  # IDs become file names: nothing may point out of assets/
                raise ValueError(f"asset ID {a.id!r:.80} is not a safe file name")
            save_image(a.image, out / "assets" / a.id)
        return write_json_atomic(out / "trajectory.json", self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any], images: dict[str, Any]) -> "Trajectory":
        """Rebuild from `to_dict()` output plus the asset images keyed by asset ID."""
        store = AssetStore()
        inputs = []
        for a in d.get("assets", []):
            if a["id"] not in images:
                raise ValueError(f"no image given for asset {a['id']}")
            img = images[a["id"]]
            prov = Provenance.from_dict(a.get("provenance") or {})
            if prov.tool is None:
                store.add_input(img, a["id"])
                inputs.append(img)
            else:
                asset = store.register_output(prov.tool, img, OutputKind(a["kind"]), prov, a.get("plumbing_only", False))
                if asset.id != a["id"]:
                    raise ValueError(f"asset order is inconsistent: {asset.id} != {a['id']}")
        task = Task.from_dict(d.get("task") or {}, inputs)
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"meta must be an object, not {type(meta).__name__}")
        return cls(
            task=task,
            assets=store,
            turns=[Turn.from_dict(t) for t in d.get("turns", [])],
            stop_reason=d.get("stop_reason", "running"),
            system_prompt=d.get("system_prompt", ""),
            meta=meta,
        )

    @classmethod
    def load(cls, path: str | Path) -> "Trajectory":
        """Read `trajectory.json` (or its folder) with its asset images.
        Asset files must lie inside the trajectory's own folder: a record naming any other
        path (`../x.png`, an absolute path, a symlink out) raises `TrajectoryLoadError`."""
        p = Path(path)
        if p.is_dir():
            p = p / "trajectory.json"
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TrajectoryLoadError(f"{p}: not a JSON text ({e})") from None
        except RecursionError:
            raise TrajectoryLoadError(f"{p}: JSON nested too deeply") from None
        if not isinstance(d, dict) or not {"task", "turns"} <= set(d):
            raise TrajectoryLoadError(f"{p}: not a CanvasAgent trajectory (expected an object with 'task' and 'turns')")
        assets = d.get("assets") or []
        if not isinstance(assets, list):
            raise TrajectoryLoadError(f"{p}: 'assets' must be a list")
        images = {}
        for a in assets:
            if not isinstance(a, dict) or not isinstance(a.get("id"), str) or not isinstance(a.get("file"), str):
                raise TrajectoryLoadError(f"{p}: every asset needs a string 'id' and 'file'")
            if not _SAFE_ID.match(a["id"]):
                raise TrajectoryLoadError(f"{p}: asset ID {a['id']!r:.80} is not a safe name")
            try:
                file = resolve_path(a["file"], allowed_roots=[p.parent], base=p.parent)
            except ImageLoadError as e:
                raise TrajectoryLoadError(f"{p}: asset {a['id']}: {e}") from None
            images[a["id"]] = open_image(file)
        try:
            return cls.from_dict(d, images)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as e:
            # Any field of the wrong shape: one clear refusal instead of an error from deep inside.
            raise TrajectoryLoadError(f"{p}: malformed trajectory ({type(e).__name__}: {str(e)[:200]})") from None
