"""Validate a tool call against the registry and the current asset state.

The episode runner calls this before executing, and the rule reward reads the same report
for its name/schema/ref/spec terms, so there is exactly one notion of a valid call. Every
problem is an `Issue` with a stable code; nothing here raises on bad input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Protocol

from toolserver.registry import REGISTRY, ArgSpec, ArgType, OutputKind, ToolSpec

# Numbers beyond this are rejected outright: they are never meaningful 0-1000 coordinates and
# they are how overflow bugs get into image code.
MAX_ABS_NUMBER = 1e6
# Longest text argument accepted, in characters: real prompts are a few hundred, and megabytes
# of text can stall a tool server. A serving config's `limits.max_text_chars` overrides it.
DEFAULT_MAX_TEXT_CHARS = 2048


class Profile(str, Enum):
    CANVASCRAFT = "canvascraft"  # reproduce the public tools pixel for pixel, quirks included
    EXACT = "exact"  # do what the schema text promises


class Term(str, Enum):
    NAME = "name"
    SCHEMA = "schema"
    REF = "ref"
    SPEC = "spec"


@dataclass(frozen=True)
class Issue:
    code: str
    term: Term
    message: str
    arg: str | None = None
    blocking: bool = True  # False: recorded (and costs the spec term) but the call still runs

    def to_dict(self) -> dict:
        return {"code": self.code, "term": self.term.value, "message": self.message, "arg": self.arg, "blocking": self.blocking}


class AssetLookup(Protocol):
    def __contains__(self, asset_id: object) -> bool: ...
    def get(self, asset_id: str) -> Any: ...  # returns an object with .kind and .size
    def ids(self) -> list[str]: ...


@dataclass
class CallCheck:
    """Everything the runner and the rule reward need to know about one call."""

    tool: str
    name_ok: bool
    schema_ok: bool
    refs_total: int
    refs_found: int
    spec_ok: bool
    issues: list[Issue] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)  # normalised values (bbox -> list[float])

    @property
    def ref_fraction(self) -> float:
        return 1.0 if self.refs_total == 0 else self.refs_found / self.refs_total

    @property
    def executable(self) -> bool:
        return not any(i.blocking for i in self.issues)

    def first_error(self) -> Issue | None:
        return next((i for i in self.issues if i.blocking), None)

    def error_message(self) -> str:
        return "; ".join(i.message for i in self.issues if i.blocking)

    def referenced_ids(self) -> list[str]:
        return list(self.args.get("__refs__", []))

    def to_dict(self) -> dict:
        """Every field but the normalised `args`, in declaration order, with the issues as dicts."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "args"}
        out["issues"] = [i.to_dict() for i in self.issues]
        return out


_NUM_SPLIT = re.compile(r"[,\s]+")


def _show(value: Any, n: int = 80) -> str:
    """`repr(value)` cut to `n` characters; never raises (an int past Python's digit limit has no repr)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - ValueError from int -> str past the digit limit, or any hostile __repr__
        text = f"<{type(value).__name__} without a printable form>"
    return text[:n]


def _as_float(value: Any) -> float | None:
    """`float(value)`, or None for anything that is not a number (huge ints overflow: None too)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def parse_numbers(value: Any, n: int, arg: str) -> tuple[list[float] | None, Issue | None]:
    """Parse `n` finite numbers from a JSON array or a string like "[1, 2, 3, 4]"."""
    what = "[xmin, ymin, xmax, ymax]" if n == 4 else "[x, y]"
    fmt = Issue(f"{arg}_format", Term.SPEC, f"'{arg}' must be {what} with {n} numbers; got {_show(value)}", arg)
    if isinstance(value, str):
        body = value.strip().strip("[]()").strip()
        parts = [p for p in _NUM_SPLIT.split(body) if p]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        return None, fmt
    if len(parts) != n:
        return None, fmt
    out: list[float] = []
    for p in parts:
        x = _as_float(p)
        if x is None:
            return None, fmt
        if not math.isfinite(x):
            return None, Issue("not_finite", Term.SPEC, f"'{arg}' contains a non-finite number", arg)
        if abs(x) > MAX_ABS_NUMBER:
            return None, Issue("number_too_large", Term.SPEC, f"'{arg}' contains a number beyond ±{MAX_ABS_NUMBER:g}", arg)
        out.append(x)
    return out, None


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, (list, dict)) and not value)


def _check_arg(spec: ArgSpec, value: Any, assets: AssetLookup, profile: Profile, chk: CallCheck, max_text_chars: int) -> None:
    issues = chk.issues
    if spec.type is ArgType.ASSET:
        chk.refs_total += 1
        if not isinstance(value, str):
            issues.append(Issue("bad_type", Term.SPEC, f"'{spec.name}' must be an image ID string", spec.name))
            return
        chk.args.setdefault("__refs__", []).append(value)
        if value not in assets:
            issues.append(
                Issue(
                    "unknown_asset",
                    Term.REF,
                    f"'{spec.name}' refers to {_show(value, 60)}, which is not in the imglist {{{', '.join(assets.ids())}}}",
                    spec.name,
                )
            )
            return
        chk.refs_found += 1
        kind = assets.get(value).kind
        allowed = spec.asset_kinds or (OutputKind.IMAGE, OutputKind.RGBA, OutputKind.MASK)
        if kind not in allowed:
            want = " or ".join(k.value for k in allowed)
            issues.append(
                Issue("wrong_asset_kind", Term.SPEC, f"'{spec.name}'={_show(value, 60)} is a {kind.value}, expected a {want}", spec.name)
            )
        chk.args[spec.name] = value
    elif spec.type in (ArgType.BBOX, ArgType.POSITION):
        n = 4 if spec.type is ArgType.BBOX else 2
        vals, issue = parse_numbers(value, n, spec.name)
        if issue:
            issues.append(issue)
            return
        assert vals is not None
        code = f"{spec.name}_out_of_range"
        if any(v < 0 for v in vals):
            # The public Overlayer never range-checks positions; off-canvas overlays are legal there.
            lenient = spec.type is ArgType.POSITION and profile is Profile.CANVASCRAFT
            negative = f"'{spec.name}' has negative coordinates {vals}"
            issues.append(Issue(code, Term.SPEC, negative, spec.name, blocking=not lenient))
        elif any(v > 1000 for v in vals):
            # The public tools clamp values over 1000; we record it, and only the exact profile refuses.
            above = f"'{spec.name}' has coordinates above 1000 {vals}"
            issues.append(Issue(code, Term.SPEC, above, spec.name, blocking=profile is Profile.EXACT))
        if spec.type is ArgType.BBOX and (vals[2] <= vals[0] or vals[3] <= vals[1]):
            issues.append(Issue("bbox_unordered", Term.SPEC, f"'{spec.name}' needs xmin < xmax and ymin < ymax; got {vals}", spec.name))
        chk.args[spec.name] = vals
    elif spec.type is ArgType.CHOICE:
        for c in spec.choices:
            numeric = isinstance(c, (int, float)) and not isinstance(value, bool)
            if (_as_float(value) == float(c)) if numeric else (value == c):
                chk.args[spec.name] = c if numeric else value  # a number normalised to the choice
                return
        issues.append(Issue("bad_choice", Term.SPEC, f"'{spec.name}' must be one of {list(spec.choices)}; got {_show(value, 40)}", spec.name))
    elif spec.type is ArgType.UNIT:
        x = _as_float(value)
        if x is None and not isinstance(value, bool):
            issues.append(Issue("bad_type", Term.SPEC, f"'{spec.name}' must be a number in [0, 1]", spec.name))
            return
        if x is None or not math.isfinite(x) or not 0.0 <= x <= 1.0:
            issues.append(Issue("unit_out_of_range", Term.SPEC, f"'{spec.name}' must be in [0, 1]; got {_show(value, 40)}", spec.name))
            return
        chk.args[spec.name] = x
    else:  # TEXT
        if not isinstance(value, str):
            issues.append(Issue("bad_type", Term.SPEC, f"'{spec.name}' must be a string", spec.name))
            return
        if len(value) > max_text_chars:
            issues.append(
                Issue("text_too_long", Term.SPEC, f"'{spec.name}' has {len(value):,} characters, over the {max_text_chars:,}-character limit", spec.name)
            )
            return
        chk.args[spec.name] = value


def _extra_checks(tool: ToolSpec, raw: dict[str, Any], assets: AssetLookup, chk: CallCheck) -> None:
    for name in tool.extra_checks:
        if name == "mask_matches_image":
            img, mask = raw.get("image"), raw.get("mask")
            if isinstance(img, str) and isinstance(mask, str) and img in assets and mask in assets:
                if assets.get(img).size != assets.get(mask).size:
                    chk.issues.append(
                        Issue(
                            "mask_size_mismatch",
                            Term.SPEC,
                            f"mask {mask} is {assets.get(mask).size} but image {img} is {assets.get(img).size}",
                            "mask",
                        )
                    )
        elif name == "overlay_content":
            kind, content = raw.get("overlay_type"), raw.get("content")
            if kind == "object" and isinstance(content, str) and content.strip():
                chk.refs_total += 1
                chk.args.setdefault("__refs__", []).append(content)
                if content not in assets:
                    chk.issues.append(
                        Issue(
                            "unknown_asset",
                            Term.REF,
                            f"object overlay content {_show(content, 60)} is not an image ID in the imglist {{{', '.join(assets.ids())}}}",
                            "content",
                        )
                    )
                else:
                    chk.refs_found += 1
                    if assets.get(content).kind is not OutputKind.RGBA:
                        chk.issues.append(
                            Issue(
                                "wrong_asset_kind",
                                Term.SPEC,
                                f"object overlay content {_show(content, 60)} must be an RGBA cut-out (e.g. an Extract output), "
                                f"not a {assets.get(content).kind.value}",
                                "content",
                            )
                        )
        else:  # pragma: no cover - a registry typo, caught by tests over the registry
            raise ValueError(f"unknown extra check {name!r} on {tool.name}")


def validate_call(
    name: Any,
    arguments: Any,
    assets: AssetLookup,
    profile: Profile = Profile.CANVASCRAFT,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> CallCheck:
    """Check one call against the registry and `assets` (the IDs available before it).

    Never raises on any `name`/`arguments`, whatever their types or sizes: each problem is an
    `Issue`. Text arguments longer than `max_text_chars` are refused (`text_too_long`).
    """
    tool = REGISTRY.get(name) if isinstance(name, str) else None
    if tool is None:
        return CallCheck(
            tool=name[:200] if isinstance(name, str) else _show(name, 60),
            name_ok=False,
            schema_ok=False,
            refs_total=0,
            refs_found=0,
            spec_ok=False,
            issues=[Issue("unknown_tool", Term.NAME, f"unknown tool {_show(name, 60)}; available: {', '.join(REGISTRY)}")],
        )
    chk = CallCheck(tool=tool.name, name_ok=True, schema_ok=True, refs_total=0, refs_found=0, spec_ok=True)
    if not isinstance(arguments, dict):
        chk.schema_ok = chk.spec_ok = False
        chk.issues.append(Issue("arguments_not_object", Term.SCHEMA, "'arguments' must be a JSON object"))
        return chk
    for arg in tool.args:
        value = arguments.get(arg.name)
        if _is_empty(value):
            if arg.required:
                code = "missing_argument" if arg.name not in arguments else "empty_argument"
                chk.issues.append(Issue(code, Term.SCHEMA, f"{tool.name} needs a non-empty '{arg.name}'", arg.name))
            continue
        _check_arg(arg, value, assets, profile, chk, max_text_chars)
    for extra in arguments:
        if extra not in tool.arg_names:
            chk.issues.append(
                Issue("unexpected_argument", Term.SPEC, f"{tool.name} has no argument {_show(extra, 40)}", _show(extra, 40), blocking=False)
            )
    _extra_checks(tool, arguments, assets, chk)
    chk.schema_ok = not any(i.term is Term.SCHEMA for i in chk.issues)
    chk.spec_ok = not any(i.term is Term.SPEC for i in chk.issues)
    return chk
