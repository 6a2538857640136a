"""The toolbox interface the episode runner uses, and its in-process implementation.

Wherever tools run (in-process, behind a Ray Serve handle, over HTTP), the runner sees
`Toolbox.call(request) -> ToolResult`; a failing tool is a failed result, never an exception.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from PIL import Image

from toolserver.backends import BackendFn, build_backend
from toolserver.backends._base import item_failure
from toolserver.limits import Limits, check_request, output_refusal, predicted_output_refusal
from toolserver.registry import REGISTRY, Backend, OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult, close_if_closable
from toolserver.tools.pure import PURE_TOOLS
from toolserver.validation import Profile

log = logging.getLogger(__name__)

DEFAULT_MAX_PIXELS = 40_000_000  # about 6300 x 6300: beyond any real tool input, short of a bomb


class Toolbox(Protocol):
    profile: Profile

    def call(self, request: ToolRequest) -> ToolResult: ...

    def close(self) -> None: ...


@dataclass
class RecordedOutput:
    """A tool result recorded in a trajectory, for replaying model-backed tools without models."""

    text: str
    image: Image.Image | None = None
    ok: bool = True


def _output_kind(tool: str, image: Image.Image | None) -> OutputKind:
    declared = REGISTRY[tool].output
    if image is not None and declared is OutputKind.IMAGE and image.mode == "RGBA":
        return OutputKind.RGBA
    return declared


@dataclass
class LocalToolbox:
    """Runs pure tools in-process and model tools through configured backends."""

    profile: Profile = Profile.CANVASCRAFT
    backends: dict[str, BackendFn] = field(default_factory=dict)
    max_output_pixels: int = DEFAULT_MAX_PIXELS
    # Per-tool queues of recorded outputs (replay); used before a live backend.
    recorded: dict[str, deque[RecordedOutput]] = field(default_factory=dict)
    # A server's toolbox (a replica, the ingress) runs `check_request` itself: its callers'
    # validation cannot be trusted. In-process, the episode runner has already validated each call.
    validate: bool = False
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_config(cls, cfg: Any) -> "LocalToolbox":
        """Build from a `toolserver.config.ToolsConfig` (duck-typed: `toolserver.config` is not imported here)."""
        backends: dict[str, BackendFn] = {}
        for tool, bcfg in (cfg.backends or {}).items():
            if tool not in REGISTRY:
                raise ValueError(f"tools config names unknown tool {tool!r}")
            if bcfg.name not in (None, "", "none"):
                backends[tool] = _LazyBackend(bcfg.name, dict(bcfg.params or {}))
        return cls(profile=Profile(cfg.profile), backends=backends, max_output_pixels=cfg.max_pixels,
                   limits=getattr(cfg, "limits", None) or Limits())

    def add_recorded(self, tool: str, output: RecordedOutput) -> None:
        self.recorded.setdefault(tool, deque()).append(output)

    def call(self, request: ToolRequest) -> ToolResult:
        """Run one call. Refused before any work: with `validate`, anything `check_request`
        refuses; always, an output the tool's `output_scale` says would exceed
        `max_output_pixels` (`output_too_large`). Never raises."""
        t0 = time.perf_counter()
        if self.validate:
            checked, refusal = check_request(request, self.limits, self.max_output_pixels)
            if refusal is None:
                assert checked is not None  # a validated toolbox never runs the unchecked request
                request = checked
        else:
            refusal = predicted_output_refusal(request, self.max_output_pixels)
        if refusal is not None:
            return refusal
        result = self._dispatch(request)
        result.elapsed_s = time.perf_counter() - t0
        return output_refusal(request.tool, result, self.max_output_pixels) or result

    def _dispatch(self, request: ToolRequest) -> ToolResult:
        spec = REGISTRY.get(request.tool)
        if spec is None:
            return ToolResult.failure("unknown_tool", f"unknown tool {request.tool!r}")
        queue = self.recorded.get(request.tool)
        if queue:
            rec = queue.popleft()
            if not rec.ok:
                return ToolResult.failure("recorded_failure", rec.text, backend="recorded")
            return ToolResult(True, rec.text, _output_kind(request.tool, rec.image), rec.image, backend="recorded")
        try:
            if spec.backend is Backend.PURE:
                return PURE_TOOLS[spec.name](request)
            backend = self.backends.get(spec.name)
            if backend is None:
                return ToolResult.failure(
                    "backend_not_configured",
                    f"{spec.name} needs a model backend and none is configured in the tools config "
                    f"(set backends.{spec.name} in configs/tools/*.yaml)",
                )
            return backend(request)
        except Exception as e:  # a backend bug must not kill a rollout; it becomes an observation
            return item_failure(request, e)

    def close(self) -> None:
        """Release every backend's loaded model. The toolbox stays usable: a later call to a
        model tool loads its backend again."""
        for b in self.backends.values():
            close_if_closable(b)


class _LazyBackend:
    """Loads a model backend on first use, so listing tools or running pure ones stays cheap."""

    def __init__(self, name: str, params: dict[str, Any]):
        self.name, self.params = name, params
        self._fn: BackendFn | None = None
        # Concurrent first calls must build one backend, not one each: each build may load a model.
        self._lock = threading.Lock()

    def _backend(self) -> BackendFn:
        fn = self._fn
        if fn is None:
            with self._lock:
                if self._fn is None:
                    self._fn = build_backend(self.name, self.params)
                fn = self._fn
        return fn

    def __call__(self, request: ToolRequest) -> ToolResult:
        result = self._backend()(request)
        if result.plumbing_only:
            log.warning("%s result comes from the random-weight %r backend: plumbing only, not a real result", request.tool, self.name)
        return result

    def close(self) -> None:
        """Release the backend and what it loaded; a later call builds it again."""
        with self._lock:
            fn, self._fn = self._fn, None
        close_if_closable(fn)
