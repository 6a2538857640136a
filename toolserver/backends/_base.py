"""Plumbing shared by the model backends: typed params, lazy thread-safe loading, device and
dtype choice, clear "unavailable" errors, and marking results from random-weight models.

Backends load their model on first use (listing tools or running pure ones must stay cheap) and
may be called from several threads at once (Ray Serve replicas run requests concurrently), so
loading is locked, and so is inference where the library keeps per-call state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Generic, Iterator, TypeVar

from PIL import Image

from toolserver.results import ToolError, ToolResult

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Written into every tiny random-weight checkpoint by `toolserver.backends.tiny`. Whatever the
#: config says, a model directory holding it produces plumbing-only results.
TINY_MARKER = "canvasagent_tiny.json"

PLUMBING_NOTE = "[plumbing only: produced by a random-weight test model; not a real result]"


class BackendUnavailable(ToolError):
    """A backend cannot run here (package, weights or device missing). Says how to fix it."""

    def __init__(self, message: str):
        super().__init__("backend_unavailable", message)


def parse_params(cls: type[T], params: dict[str, Any] | None, backend: str) -> T:
    """Build a params dataclass, refusing unknown keys so a typo in a tools config fails loudly."""
    params = dict(params or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(params) - names)
    if unknown:
        raise ValueError(f"backend {backend!r}: unknown params {unknown}; allowed: {sorted(names)}")
    return cls(**params)


class Lazy(Generic[T]):
    """A value built once, on first `get()`, safely under concurrent callers. A failed build is
    not cached, so a fixed environment (weights copied in later) recovers without a restart."""

    def __init__(self, build: Callable[[], T]):
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get(self) -> T:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
        return self._value

    def reset(self) -> bool:
        """Drop the built value (its memory goes once no caller holds it); the next `get()`
        builds it again. True if there was one."""
        with self._lock:
            had, self._value = self._value is not None, None
        return had


class LazyModelBackend:
    """A backend whose model (what the subclass's `_load` returns) is built on first use."""

    def __init__(self, params: Any):
        self.params = params
        self._model: Lazy[Any] = Lazy(self._load)

    def _load(self) -> Any:
        raise NotImplementedError

    def load(self) -> None:
        """Load now (a serving replica at start-up) instead of on the first request."""
        self._model.get()


_SHARED: dict[tuple[Any, ...], Lazy[Any]] = {}
_SHARED_LOCK = threading.Lock()


def shared(key: tuple[Any, ...], build: Callable[[], T]) -> T:
    """One loaded model per key per process, e.g. Generation and Edit on the same pipeline."""
    with _SHARED_LOCK:
        lazy = _SHARED.setdefault(key, Lazy(build))
    return lazy.get()


_TRIM: Any = None


def return_freed_memory() -> None:
    """Hand the heap pages freed so far back to the system (glibc's `malloc_trim`; elsewhere a
    no-op). A released model's memory is freed in pieces small enough for glibc to keep in its
    arenas, so without this the process's RSS would not go down."""
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _TRIM = False
    if _TRIM:
        _TRIM(0)


def forget_shared(key: tuple[Any, ...]) -> None:
    """Drop this process's entry for `key`: backends holding the model keep it until they
    release it, and the next `shared(key, ...)` builds a new one."""
    with _SHARED_LOCK:
        _SHARED.pop(key, None)


def require(module: str, install_hint: str) -> ModuleType:
    """Import `module` or raise BackendUnavailable naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BackendUnavailable(f"{module} is not importable ({e}); {install_hint}") from e


@contextlib.contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """torch's global RNG seeded with `seed` inside the block and restored after it, so building
    a model or evaluating inside a training run does not shift the caller's random stream."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def resolve_device(device: str | None) -> str:
    """'auto' picks CUDA when present. Asking for CUDA on a machine without it is an error, not
    a silent fallback, because a 4B model on the CPU would look like a hang."""
    import torch

    device = (device or "auto").lower()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {device!r} requested but CUDA is not available here; set device: cpu (slow) or auto")
    return device


_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def resolve_dtype(dtype: str | None, device: str) -> Any:
    """'auto' is bfloat16 on CUDA and float32 on the CPU (CPU half precision is slow or unsupported)."""
    import torch

    name = (dtype or "auto").lower()
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return getattr(torch, _DTYPES[name])
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(_DTYPES))}") from None


def tiny_meta(source: str | Path) -> dict[str, Any] | None:
    """The tiny-model marker of a local checkpoint directory, or None for a real checkpoint."""
    marker = Path(source) / TINY_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def hf_from_pretrained(loader: Callable[..., T], source: str, what: str, **kwargs: Any) -> T:
    """`loader(source, **kwargs)` with offline / missing-weights failures turned into a clear error."""
    try:
        return loader(source, **kwargs)
    except (OSError, ValueError) as e:
        hint = (
            "the directory exists but does not hold a loadable checkpoint"
            if Path(source).exists()
            else "it is neither a local directory nor reachable on the model hub (offline? HF_HUB_OFFLINE set?); "
            "download it once with `huggingface-cli download` or point the config at a local path"
        )
        raise BackendUnavailable(f"cannot load {what} from {source!r}: {hint}. ({type(e).__name__}: {e})") from e


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB for a model input. Transparent pixels are composited on white, not dropped to black,
    so text on a cut-out stays readable."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return image.convert("RGB")


def mark_plumbing(result: ToolResult, plumbing_only: bool) -> ToolResult:
    """Flag a result from random weights and say so in the text the policy reads."""
    if plumbing_only:
        result.plumbing_only = True
        sep = "" if result.text.endswith("\n") else "\n"
        result.text = f"{result.text}{sep}{PLUMBING_NOTE}"
    return result


# `batch_call(list[ToolRequest]) -> list[ToolResult]`, called by serve_app.ToolDeployment's
# @serve.batch path, bypasses LocalToolbox: the helpers below turn one request's error into its
# own failed result as LocalToolbox.call would, never failing its batch-mates.

P = TypeVar("P")


def item_failure(request: Any, exc: BaseException) -> ToolResult:
    """The failed result of an exception raised by one call (LocalToolbox's and a batch's)."""
    if isinstance(exc, ToolError):
        return ToolResult.failure(exc.code, exc.message)
    log.error("tool %s raised", request.tool, exc_info=exc)
    return ToolResult.failure("tool_exception", f"{request.tool} failed: {type(exc).__name__}: {exc}")


def call_one(fn: Callable[[Any], ToolResult], request: Any) -> ToolResult:
    try:
        return fn(request)
    except Exception as e:
        return item_failure(request, e)


def run_batched(
    requests: list[Any],
    prepare: Callable[[Any], P],
    key: Callable[[P], Any],
    run_group: Callable[[list[P]], list[ToolResult]],
    single: Callable[[Any], ToolResult],
    what: str,
) -> list[ToolResult]:
    """Results for `requests`, in order, running compatible requests together.

    `prepare` validates and preprocesses one request (an error fails that request only); `key`
    says which prepared requests can share one model call (same tensor shapes, same sampling
    settings); `run_group` runs one such group and returns one result per member. If a group's
    model call raises (out of memory, a bad input the checks missed), its members are retried one
    by one with `single`, the per-request path, so only the culprit fails.
    """
    results: list[ToolResult | None] = [None] * len(requests)
    groups: dict[Any, list[tuple[int, P]]] = {}
    for i, req in enumerate(requests):
        try:
            prepared = prepare(req)
        except Exception as e:
            results[i] = item_failure(req, e)
            continue
        groups.setdefault(key(prepared), []).append((i, prepared))
    for members in groups.values():
        idx = [i for i, _ in members]
        try:
            out = run_group([p for _, p in members])
            if len(out) != len(members):
                raise RuntimeError(f"{what}: a batch of {len(members)} returned {len(out)} results")
        except Exception:
            log.exception("%s: a batch of %d failed; retrying its requests one by one", what, len(members))
            out = [call_one(single, requests[i]) for i in idx]
        for i, r in zip(idx, out):
            results[i] = r
    log.debug("%s: %d requests in %d model calls", what, len(requests), len(groups))
    return results  # type: ignore[return-value]  (every index is filled above)
