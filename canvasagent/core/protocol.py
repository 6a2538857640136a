"""The text protocol between policy and environment.

A reply is `<reason>…</reason>` followed by at most one `<tool_call>{"name": …, "arguments":
{…}}</tool_call>`, or `<Terminate>` when done. `parse_reply` never raises: every way a reply
can be malformed becomes a typed `Finding`, which the episode runner turns into an error
observation and the rule reward turns into format scores. This is the only parser.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from canvasagent.core.models.special_tokens import PROTOCOL_TOKENS, TERMINATE
from canvasagent.core.models.special_tokens import REASON_END as REASON_CLOSE
from canvasagent.core.models.special_tokens import REASON_START as REASON_OPEN
from canvasagent.core.models.special_tokens import TOOL_CALL_END as CALL_CLOSE
from canvasagent.core.models.special_tokens import TOOL_CALL_START as CALL_OPEN
from toolserver.registry import OutputKind, get_tool, openai_schemas, producers, tools

__all__ = ["PROTOCOL_TOKENS", "TERMINATE", "REASON_OPEN", "REASON_CLOSE", "CALL_OPEN", "CALL_CLOSE", "parse_reply"]


class FormatCheck(str, Enum):
    """The five format checks of the paper's R_format, which each finding counts against."""

    REASON = "reason"  # a valid <reason> block
    JSON = "json"  # tool calls parse as JSON objects with a name and arguments
    ONE_CALL = "one_call"  # at most one call per turn
    TERMINATE = "terminate"  # termination used properly
    CLEAN = "clean"  # no unsupported extra formatting


class FindingCode(str, Enum):
    EMPTY_REPLY = "empty_reply"
    MISSING_REASON = "missing_reason"
    EMPTY_REASON = "empty_reason"
    UNCLOSED_REASON = "unclosed_reason"
    MULTIPLE_REASONS = "multiple_reasons"
    UNCLOSED_TOOL_CALL = "unclosed_tool_call"
    STRAY_CLOSE_TAG = "stray_close_tag"
    BAD_JSON = "bad_json"
    CALL_NOT_OBJECT = "call_not_object"
    MISSING_NAME = "missing_name"
    ARGUMENTS_NOT_OBJECT = "arguments_not_object"
    ARGUMENTS_AS_STRING = "arguments_as_string"
    MULTIPLE_CALLS = "multiple_calls"
    NO_ACTION = "no_action"
    CALL_WITH_TERMINATE = "call_with_terminate"
    MULTIPLE_TERMINATES = "multiple_terminates"
    CODE_FENCE = "code_fence"
    EXTRA_TEXT = "extra_text"


_CODES_OF: dict[FormatCheck, tuple[FindingCode, ...]] = {
    FormatCheck.REASON: (FindingCode.EMPTY_REPLY, FindingCode.MISSING_REASON, FindingCode.EMPTY_REASON,
                         FindingCode.UNCLOSED_REASON, FindingCode.MULTIPLE_REASONS),
    FormatCheck.JSON: (FindingCode.UNCLOSED_TOOL_CALL, FindingCode.BAD_JSON, FindingCode.CALL_NOT_OBJECT,
                       FindingCode.MISSING_NAME, FindingCode.ARGUMENTS_NOT_OBJECT,
                       FindingCode.ARGUMENTS_AS_STRING),
    FormatCheck.ONE_CALL: (FindingCode.MULTIPLE_CALLS,),
    FormatCheck.TERMINATE: (FindingCode.NO_ACTION, FindingCode.CALL_WITH_TERMINATE,
                            FindingCode.MULTIPLE_TERMINATES),
    FormatCheck.CLEAN: (FindingCode.STRAY_CLOSE_TAG, FindingCode.CODE_FENCE, FindingCode.EXTRA_TEXT),
}
_CHECK_OF = {code: check for check, codes in _CODES_OF.items() for code in codes}

# Findings after which nothing is executed this turn.
BLOCKING = {
    FindingCode.EMPTY_REPLY,
    FindingCode.UNCLOSED_TOOL_CALL,
    FindingCode.BAD_JSON,
    FindingCode.CALL_NOT_OBJECT,
    FindingCode.MISSING_NAME,
    FindingCode.ARGUMENTS_NOT_OBJECT,
    FindingCode.MULTIPLE_CALLS,
}


@dataclass(frozen=True)
class Finding:
    code: FindingCode
    message: str

    @property
    def check(self) -> FormatCheck:
        return _CHECK_OF[self.code]

    @property
    def blocking(self) -> bool:
        return self.code in BLOCKING

    def to_dict(self) -> dict:
        return {"code": self.code.value, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        return cls(FindingCode(d["code"]), d.get("message", ""))


@dataclass
class ToolCall:
    name: str
    arguments: Any  # a dict when well formed; kept as written otherwise, for the validator to judge

    def to_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class ParsedReply:
    text: str
    reason: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    terminate: bool = False
    findings: list[Finding] = field(default_factory=list)

    @property
    def call(self) -> ToolCall | None:
        """The call to execute this turn: exactly one, with no blocking finding."""
        if len(self.calls) == 1 and not any(f.blocking for f in self.findings):
            return self.calls[0]
        return None

    @property
    def blocked(self) -> bool:
        return any(f.blocking for f in self.findings)


_REASON_RE = re.compile(r"<reason>(.*?)</reason>", re.DOTALL)
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCE_RE = re.compile(r"```")


def _decode_call(body: str, findings: list[Finding]) -> ToolCall | None:
    try:
        obj = json.loads(body.strip(), parse_constant=lambda c: float(c))
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        findings.append(Finding(FindingCode.BAD_JSON, f"tool call is not valid JSON: {e}"[:200]))
        return None
    if not isinstance(obj, dict):
        findings.append(Finding(FindingCode.CALL_NOT_OBJECT, "tool call must be a JSON object with 'name' and 'arguments'"))
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        findings.append(Finding(FindingCode.MISSING_NAME, "tool call has no 'name' string"))
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        # Some chat templates serialise arguments as a JSON string; accept it, but it is not our format.
        try:
            decoded = json.loads(args)
        except (json.JSONDecodeError, RecursionError, ValueError):
            decoded = None
        if isinstance(decoded, dict):
            findings.append(Finding(FindingCode.ARGUMENTS_AS_STRING, "'arguments' should be a JSON object, not a string"))
            args = decoded
    if args is None:
        args = {}
    if not isinstance(args, dict):
        findings.append(Finding(FindingCode.ARGUMENTS_NOT_OBJECT, "'arguments' must be a JSON object"))
        return None
    return ToolCall(name.strip(), args)


def parse_reply(text: Any) -> ParsedReply:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    out = ParsedReply(text=text)
    f = out.findings
    if not text.strip():
        f.append(Finding(FindingCode.EMPTY_REPLY, "the reply is empty"))
        return out

    reasons = _REASON_RE.findall(text)
    if not reasons:
        if REASON_OPEN in text:
            f.append(Finding(FindingCode.UNCLOSED_REASON, "<reason> is not closed with </reason>"))
        else:
            f.append(Finding(FindingCode.MISSING_REASON, "the reply has no <reason>…</reason> block"))
    else:
        out.reason = reasons[0].strip()
        if len(reasons) > 1:
            f.append(Finding(FindingCode.MULTIPLE_REASONS, f"{len(reasons)} <reason> blocks; write one"))
        if not out.reason:
            f.append(Finding(FindingCode.EMPTY_REASON, "the <reason> block is empty"))

    bodies = _CALL_RE.findall(text)
    opens, closes = text.count(CALL_OPEN), text.count(CALL_CLOSE)
    if opens > len(bodies):
        f.append(Finding(FindingCode.UNCLOSED_TOOL_CALL, "<tool_call> is not closed with </tool_call>"))
    elif closes > opens:
        f.append(Finding(FindingCode.STRAY_CLOSE_TAG, "</tool_call> without a matching <tool_call>"))
    if len(bodies) > 1:
        f.append(Finding(FindingCode.MULTIPLE_CALLS, f"{len(bodies)} tool calls in one turn; make exactly one per turn"))
    for body in bodies:
        call = _decode_call(body, f)
        if call is not None:
            out.calls.append(call)

    # Only a tag outside the call blocks counts: `<Terminate>` inside a call's JSON is data.
    n_term = _CALL_RE.sub("", text).count(TERMINATE)
    out.terminate = n_term > 0
    if n_term > 1:
        f.append(Finding(FindingCode.MULTIPLE_TERMINATES, "<Terminate> appears more than once"))
    if out.terminate and bodies:
        f.append(Finding(FindingCode.CALL_WITH_TERMINATE, "a tool call and <Terminate> in the same turn"))
    if not bodies and not out.terminate and opens == 0:
        f.append(Finding(FindingCode.NO_ACTION, "the reply neither calls a tool nor terminates"))
    if _FENCE_RE.search(text):
        f.append(Finding(FindingCode.CODE_FENCE, "code fences are not part of the protocol"))

    rest = _CALL_RE.sub("", _REASON_RE.sub("", text)).replace(TERMINATE, "")
    if rest.strip() and not any(x.code in (FindingCode.UNCLOSED_REASON, FindingCode.UNCLOSED_TOOL_CALL) for x in f):
        f.append(Finding(FindingCode.EXTRA_TEXT, f"text outside the protocol tags: {rest.strip()[:60]!r}"))
    return out


def format_reply(reason: str, call: dict | ToolCall | None = None, terminate: bool = False) -> str:
    """Render a well-formed reply (used by scripted policies and the data builder). `parse_reply`
    reads the call back as given, whatever its strings hold, protocol tags included."""
    parts = [f"{REASON_OPEN}{reason}{REASON_CLOSE}"]
    if call is not None:
        d = call.to_dict() if isinstance(call, ToolCall) else call
        body = json.dumps(d, ensure_ascii=False)
        if any(tok in body for tok in PROTOCOL_TOKENS):
            # A tag inside a string (a name, an Overlayer text) would end or split the call when
            # parsed. "<" only occurs inside JSON strings, where \u003c decodes to the same text.
            body = body.replace("<", "\\u003c")
        parts.append(f"{CALL_OPEN}{body}{CALL_CLOSE}")
    if terminate:
        parts.append(TERMINATE)
    return "".join(parts)


def echo_saved(tool_text: str, asset_id: str, imglist: str) -> str:
    return f"{tool_text}\n[Output image saved as: {asset_id}. now imglist is {imglist}]"


def echo_plain(tool_text: str, imglist: str) -> str:
    return f"{tool_text}\n[now imglist is {imglist}]"


# How the chain rules name a kind a tool gets or gives.
_KIND_NOUN = {OutputKind.BOXES: "a box", OutputKind.MASK: "a mask", OutputKind.RGBA: "an RGBA image"}


def _dependency_path(kind: OutputKind) -> list[str]:
    """The tools that lead to `kind`: its producer, preceded by the producers of what it needs
    that only an earlier call can give."""
    tool = get_tool(producers(kind)[0])
    earlier = [n for n in tool.needs() if not n.from_task]
    return (_dependency_path(earlier[0].kind) if earlier else []) + [tool.name]


def _chain_rules() -> str:
    """The canvasagent chain rules, stated from the registry's `requires`/`produces`."""
    path = _dependency_path(OutputKind.RGBA)
    steps = []
    for i, name in enumerate(path):
        spec = get_tool(name)
        need = next((n for n in spec.needs() if not n.from_task), None)
        if need is None:
            steps.append(f"{name} (get {_KIND_NOUN[spec.output]})")
            continue
        given = f"{need.arg} = the {path[i - 1]} output" if need.kind.registers_asset else f"{need.arg} from {path[i - 1]}"
        gives = f", gives {_KIND_NOUN[spec.output]} such as {name}_0" if i < len(path) - 1 else ""
        steps.append(f"{name} ({given}{gives})")
    generators = [t.name for t in tools() if OutputKind.IMAGE in t.produces and not t.needs()]
    conditional = [
        f"{t.name} with {n.when[0]}='{n.when[1]}' needs {n.arg} = {_KIND_NOUN[n.kind]} ID such as {producers(n.kind)[0]}_0."
        for t in tools() for n in t.requires if n.when is not None and n.kind.registers_asset
    ]
    rules = [
        "To cut out an object: " + " -> ".join(steps) + ".",
        f"With no input image, call {' or '.join(generators)} first and use its output ID afterwards.",
        *conditional,
    ]
    return "## Chain rules\n" + "".join(f"{k}. {r}\n" for k, r in enumerate(rules, 1))


_CHAIN_RULES = {
    "canvasagent": _chain_rules(),
    "easel": (
        "## Painting rules\n"
        "Each brush_stroke paints one stroke on the canvas; coordinates are fractions of the canvas. "
        "Use undo to revert the last stroke and submit when the canvas is finished.\n"
    ),
}

# EASEL-Data teaches integer 0-1000 path coordinates; the environment rescales them to [0, 1]
# before validation (`canvasagent.training.easel_env`, `canvasagent.easel.agent.Int1000Coords`).
_EASEL_INT1000_RULES = (
    "## Painting rules\n"
    "Each brush_stroke paints one stroke on the canvas; path coordinates are integers 0-1000 (fractions of the "
    "canvas times 1000). Use undo to revert the last stroke and submit when the canvas is finished.\n"
)
_EASEL_INT1000_COORDINATES = (
    "Path coordinates xs, ys, xc, yc, xe, ye are integers in 0-1000 (0,0 = top-left); radii, opacities and "
    "colours are numbers in [0, 1]. "
)
COORD_FORMATS = ("unit", "int1000")

_COORDINATES = {
    "canvasagent": "Coordinates are integers in 0-1000 (fractions of the image size times 1000). ",
    "easel": "Brush parameters are numbers in [0, 1] (coordinates as fractions of the canvas). ",
}

_ROLE = {
    "canvasagent": (
        "You are a visual agent that can see images and solves image creation and editing tasks by calling tools."
    ),
    "easel": "You are a painting agent. You reproduce or draw images one brush stroke at a time.",
}


def render_tools_section(family: str = "canvasagent", names: list[str] | None = None) -> str:
    schemas = openai_schemas(family, names)
    return "## Tools (JSON schema)\n" + json.dumps(schemas, indent=2, ensure_ascii=False)


def render_system_prompt(
    family: str = "canvasagent", names: list[str] | None = None, include_tools: bool = True, coords: str = "unit"
) -> str:
    """The system prompt, generated from the registry so it can never disagree with it.
    `coords="int1000"` (EASEL only) states the EASEL-Data convention: integer 0-1000 path coordinates."""
    if family not in _ROLE:
        raise ValueError(f"unknown tool family {family!r}")
    if coords not in COORD_FORMATS or (coords != "unit" and family != "easel"):
        raise ValueError(f"coords={coords!r} is not a coordinate format of family {family!r}")
    int1000 = coords == "int1000"
    parts = [_ROLE[family]]
    if include_tools:
        parts.append(render_tools_section(family, names))
    parts.append(_EASEL_INT1000_RULES if int1000 else _CHAIN_RULES[family])
    parts.append(
        "## Assets\n"
        "Input images are img_1, img_2, ... Each image-producing call saves its output as {Tool}_{k} "
        "(k counts per tool from 0). Every tool reply ends with the current imglist; only IDs in it are valid.\n"
        "## Output format\n"
        f"Each turn: {REASON_OPEN}a brief reason{REASON_CLOSE}, then at most one "
        f'{CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CALL_CLOSE}. '
        + (_EASEL_INT1000_COORDINATES if int1000 else _COORDINATES[family])
        + f"When the task is done, reply with a {REASON_OPEN}…{REASON_CLOSE} and {TERMINATE}. No code fences."
    )
    return "\n\n".join(parts)
