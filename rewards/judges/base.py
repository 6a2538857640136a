"""The one judge interface, what a judge sees, and what it returns.

A judge scores one *aspect* of a trajectory: `alignment` (instruction + inputs + final image),
`aesthetic` (final image only) or `trajectory` (the process + expected tool set, no image). The
three implementations — HTTP (OpenAI-compatible), local VLM (transformers) and offline
(verifiable checks, an image-quality proxy, a deterministic trajectory scorer) — share
`Judge.judge(aspect, view) -> JudgeResult`. A judge never raises: when it cannot score, it
returns the configured fallback with `fallback=True` and a reason, and the caller counts it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from canvasagent.core.trajectory import Trajectory

log = logging.getLogger(__name__)

ASPECTS: tuple[str, ...] = ("alignment", "aesthetic", "trajectory")
COMPONENT_OF = {"alignment": "align", "aesthetic": "aes", "trajectory": "traj"}  # R_align, R_aes, R_traj


@dataclass
class JudgeResult:
    score: float  # always finite, in [0, 1]
    ok: bool = True  # False: the judge could not score and `score` is the fallback
    fallback: bool = False
    reason: str = ""
    details: dict[str, float] = field(default_factory=dict)  # sub-terms, flat and numeric
    cached: bool = False
    judge: str = ""

    @classmethod
    def failed(cls, fallback: float, reason: str, judge: str = "") -> "JudgeResult":
        return cls(score=clamp01(fallback), ok=False, fallback=True, reason=reason, judge=judge)


def clamp01(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.0


@dataclass
class CallSummary:
    index: int
    tool: str
    arguments: Any
    status: str
    output_id: str | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.index, "tool": self.tool, "arguments": self.arguments, "status": self.status,
                "output_id": self.output_id, "error": self.error}


@dataclass
class TrajectoryView:
    """The parts of a trajectory judges read, extracted once (and hashed once for the cache)."""

    trajectory: Trajectory
    instruction: str
    inputs: list[Image.Image]
    final: Image.Image | None
    final_id: str | None
    expected_tools: list[str]
    calls: list[CallSummary]
    _hashes: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, traj: Trajectory) -> "TrajectoryView":
        final = traj.final_asset()
        calls = [
            CallSummary(t.index, t.call.name, t.call.arguments, t.status, t.output_id, t.error)
            for t in traj.turns
            if t.call is not None
        ]
        return cls(
            trajectory=traj,
            instruction=traj.task.instruction,
            inputs=list(traj.task.images),
            final=final.image if final is not None else None,
            final_id=final.id if final is not None else None,
            expected_tools=list(traj.task.expected_tools),
            calls=calls,
        )

    def transcript(self, max_chars: int = 8000) -> str:
        """The assistant turns and tool observations as text (for trajectory judges)."""
        parts = []
        for t in self.trajectory.turns:
            parts.append(f"[assistant {t.index}] {t.reply}")
            if t.observation:
                parts.append(f"[tool] {t.observation}")
        text = "\n".join(parts)
        return text if len(text) <= max_chars else "…" + text[-max_chars:]

    def content_hash(self, aspect: str) -> str:
        """Hash of exactly what the judge of `aspect` reads: equal content, equal key."""
        if aspect in self._hashes:
            return self._hashes[aspect]
        h = hashlib.blake2b(digest_size=16)
        h.update(aspect.encode())
        if aspect in ("alignment", "trajectory"):
            h.update(self.instruction.encode("utf-8", "replace"))
        if aspect == "alignment":
            for img in self.inputs:
                _hash_image(h, img)
            h.update(json.dumps(self.trajectory.task.checks, sort_keys=True, default=str).encode())
            # Checks may also read tool answers (answer_contains) or a recorded outcome (easel_reconstruction).
            h.update(json.dumps([(t.call.name if t.call else None, t.status, t.observation) for t in self.trajectory.turns],
                                default=str).encode("utf-8", "surrogatepass"))
            h.update(json.dumps(self.trajectory.meta.get("easel"), sort_keys=True, default=str).encode())
        if aspect in ("alignment", "aesthetic"):
            _hash_image(h, self.final)
            # Plumbing-only provenance changes what the offline alignment judge may count.
            h.update(b"P" if self.trajectory.plumbing_only else b"R")
        if aspect == "trajectory":
            h.update(json.dumps(self.expected_tools).encode())
            h.update(json.dumps(self.trajectory.task.meta.get("reference_calls"), sort_keys=True, default=str).encode())
            h.update(json.dumps([c.to_dict() for c in self.calls], sort_keys=True, default=str).encode())
            h.update(self.trajectory.stop_reason.encode())
            h.update(self.transcript().encode("utf-8", "replace"))
        self._hashes[aspect] = h.hexdigest()
        return self._hashes[aspect]


# Digests of recent images by object identity: GRPO's rollouts share input images and two aspects
# read each final image, so each is hashed once. The weak reference guards against a recycled id().
_DIGESTS: "OrderedDict[int, tuple[weakref.ref, bytes]]" = OrderedDict()
_DIGESTS_MAX = 4096
_DIGESTS_LOCK = threading.Lock()


def image_digest(img: Image.Image) -> bytes:
    key = id(img)
    with _DIGESTS_LOCK:
        hit = _DIGESTS.get(key)
        if hit is not None and hit[0]() is img:
            return hit[1]
    d = hashlib.blake2b(f"{img.mode}{img.size}".encode(), digest_size=16)
    d.update(img.tobytes())
    digest = d.digest()
    try:
        ref = weakref.ref(img)
    except TypeError:  # not weak-referenceable: do not cache
        return digest
    with _DIGESTS_LOCK:
        _DIGESTS[key] = (ref, digest)
        while len(_DIGESTS) > _DIGESTS_MAX:
            _DIGESTS.popitem(last=False)
    return digest


def _hash_image(h: "hashlib._Hash", img: Image.Image | None) -> None:
    h.update(b"<none>" if img is None else image_digest(img))


@runtime_checkable
class Judge(Protocol):
    name: str

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        """Score `aspect` of the trajectory in [0, 1]; never raises."""
        ...

    def fingerprint(self) -> str:
        """Identity of the judge's configuration, part of every cache key."""
        ...


class FallbackCounter:
    """Counts (and logs) every fallback, per aspect, so a silent judge outage cannot hide."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {a: 0 for a in ASPECTS}
        self.fallbacks: dict[str, int] = {a: 0 for a in ASPECTS}

    def record(self, aspect: str, result: JudgeResult, judge: str) -> None:
        with self._lock:
            self.calls[aspect] = self.calls.get(aspect, 0) + 1
            if result.fallback:
                self.fallbacks[aspect] = self.fallbacks.get(aspect, 0) + 1
        if result.fallback:
            log.warning("%s judge: %s fell back to %.3f (%s)", judge, aspect, result.score, result.reason)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {f"judge/{a}/calls": float(n) for a, n in self.calls.items()}
            out.update({f"judge/{a}/fallbacks": float(n) for a, n in self.fallbacks.items()})
        return out


_JSON_OBJ = re.compile(r"\{[^{}]*\}", re.DOTALL)
_SCORE_RE = re.compile(r"\bscore\b[\"']?\s*(?:is|=|:)\s*[\"']?(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_LONE_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")


def parse_score(text: Any, scale: float = 10.0) -> tuple[float | None, str]:
    """A judge reply -> (score in [0, 1] or None, how it was read).

    Our prompts ask for `{"score": <0-10>, "reason": "..."}`. We accept that JSON anywhere in
    the reply, `score: 7`, a lone number, or `7/10`. Values on [0, scale] are divided by `scale`;
    anything else (missing, non-numeric, out of range, NaN) is a failure, never a guess.
    """
    if not isinstance(text, str) or not text.strip():
        return None, "empty"
    raw: Any = None
    how = "failed"
    for m in _JSON_OBJ.finditer(text):
        try:
            obj = json.loads(m.group())
        except ValueError:
            continue
        if isinstance(obj, dict) and "score" in obj:
            raw, how = obj["score"], "json"
            break
    if raw is None:
        m = _SCORE_RE.search(text)
        if m:
            raw, how = m.group(1), "regex"
    denom = scale
    if raw is None:
        m = _LONE_NUMBER.match(text)
        if m:
            raw, how = m.group(1), "number"
            if m.group(2):
                denom = float(m.group(2))
    if raw is None or isinstance(raw, bool):
        return None, "no_score"
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return None, "not_numeric"
    if not math.isfinite(v) or denom <= 0 or v < 0 or v > denom:
        return None, "out_of_range"
    return v / denom, how
