"""Load a Qwen3-VL policy and its processor, by hub id or local path, with one code path.

The same functions serve the tiny offline checkpoint (tests, CPU default) and real checkpoints
such as ``Qwen/Qwen3-VL-8B-Instruct``, and handle two environment problems for every caller:

* **No torchvision.** In transformers 5.x every Qwen-VL processor declares a ``video_processor``
  whose classes need torchvision, which CPU machines lack (PyPI's wheel is a CUDA build that
  cannot load against CPU torch), so ``AutoProcessor`` fails; we then build an image-only
  :class:`Qwen3VLImageOnlyProcessor` from the same files.
* **numpy pixel values.** The PIL image backend (the only one without torchvision) returns numpy
  arrays when ``return_tensors`` is None, which crashes TRL's GRPO tool loop
  (``split_pixel_values_by_grid``) after a text-only tool turn; we make it default to torch
  outputs, as the torchvision backend does.

Offline machines get an explicit :class:`ModelUnavailableError` instead of a network traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canvasagent.core.models.special_tokens import add_protocol_tokens

if TYPE_CHECKING:  # torch/transformers are imported lazily: importing this module stays cheap
    import torch

logger = logging.getLogger(__name__)

#: Model types whose processor we know how to rebuild without the video processor.
_QWEN3_VL_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_moe"})

_DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


class ModelUnavailableError(OSError):
    """A model id or path could not be resolved (missing directory, or hub id unreachable offline).
    Subclasses :class:`OSError` so code that already catches transformers' ``OSError`` keeps working."""


@dataclass(frozen=True)
class ModelSource:
    """Where a checkpoint comes from; resolved once so error messages can be specific."""

    ref: str
    is_local: bool

    @property
    def offline(self) -> bool:
        return _offline_mode()


def _offline_mode() -> bool:
    truthy = {"1", "true", "yes", "on"}
    if any(os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    try:  # huggingface_hub reads the env once at import; respect its view too.
        from huggingface_hub import constants

        return bool(getattr(constants, "HF_HUB_OFFLINE", False))
    except Exception:  # pragma: no cover - hub is a transformers dependency
        return False


# Hub ids are "name" or "org/name" made of word characters, dots and dashes.
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def _looks_like_path(ref: str) -> bool:
    return _HUB_ID_RE.match(ref) is None


def resolve_source(model_id_or_path: str | os.PathLike[str]) -> ModelSource:
    """Classify ``model_id_or_path`` as a local checkpoint directory or a hub id.
    Raises :class:`ModelUnavailableError` early for a path that does not exist, rather than letting
    transformers try it as a hub id and fail with an unrelated validation error."""
    ref = os.fspath(model_id_or_path)
    expanded = os.path.expanduser(ref)
    if os.path.isdir(expanded):
        return ModelSource(ref=expanded, is_local=True)
    if isinstance(model_id_or_path, Path) or _looks_like_path(ref) or os.path.exists(expanded):
        raise ModelUnavailableError(
            f"Model path {ref!r} is not an existing checkpoint directory. Build the tiny offline model "
            f"with `python -m canvasagent.core.models build-tiny --out {ref}` or pass a hub id."
        )
    return ModelSource(ref=ref, is_local=False)


def _unavailable(source: ModelSource, what: str, exc: BaseException) -> ModelUnavailableError:
    if source.is_local:
        hint = f"the directory {source.ref!r} exists but has no loadable {what} ({exc})."
    elif source.offline:
        hint = (
            f"{source.ref!r} is neither a local directory nor in the local Hugging Face cache, and the "
            "hub is offline "
            "(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set). Download it on a networked machine "
            f"(`hf download {source.ref}`) and copy the cache or the folder here, or use the tiny "
            "offline model (`python -m canvasagent.core.models build-tiny --out DIR`)."
        )
    else:
        hint = (
            f"{source.ref!r} could not be fetched from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            "Check the id, network access and HF_TOKEN for gated repos, or pass a local directory."
        )
    return ModelUnavailableError(f"Cannot load {what}: {hint}")


def _is_resolution_error(exc: BaseException) -> bool:
    """True for 'could not find/fetch the files' errors (as opposed to bugs in the checkpoint)."""
    if isinstance(exc, OSError):  # covers hub LocalEntryNotFoundError / RepositoryNotFoundError
        return True
    try:
        from huggingface_hub.errors import HFValidationError

        return isinstance(exc, HFValidationError)
    except ImportError:  # pragma: no cover
        return False


def _load(source: ModelSource, what: str, from_pretrained: Any, **kwargs: Any) -> Any:
    """`from_pretrained(source.ref, **kwargs)`; files that cannot be found raise ModelUnavailableError."""
    try:
        return from_pretrained(source.ref, **kwargs)
    except Exception as exc:
        if _is_resolution_error(exc):
            raise _unavailable(source, what, exc) from exc
        raise


def _resolve_dtype(dtype: str | torch.dtype | None) -> str | torch.dtype | None:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key == "auto":
        return "auto"
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"Unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPE_ALIASES)}")
    return getattr(torch, _DTYPE_ALIASES[key])


def load_policy(
    model_id_or_path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    **model_kwargs: Any,
):
    """Load an image-text-to-text policy (Qwen3-VL family) from a hub id or a local directory.

    Args:
        model_id_or_path: e.g. ``"Qwen/Qwen3-VL-8B-Instruct"`` or a directory written by
            :func:`canvasagent.core.models.build_tiny_qwen3vl` or by a trainer's ``save_pretrained``.
        dtype: a ``torch.dtype``, ``"auto"`` or a name such as ``"bfloat16"``/``"bf16"``/``"float32"``.
            ``None`` keeps transformers' default.
        device_map, trust_remote_code: passed through (``device_map="auto"`` needs accelerate).
        **model_kwargs: extra ``from_pretrained`` keyword arguments (e.g. ``attn_implementation``).
    """
    from transformers import AutoModelForImageTextToText

    source = resolve_source(model_id_or_path)
    kwargs: dict[str, Any] = dict(model_kwargs)
    resolved_dtype = _resolve_dtype(dtype)
    if resolved_dtype is not None:
        kwargs["dtype"] = resolved_dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = _load(source, "policy model", AutoModelForImageTextToText.from_pretrained,
                  trust_remote_code=trust_remote_code, **kwargs)
    logger.info(
        "Loaded policy %s from %s (%s params, dtype %s)",
        type(model).__name__,
        source.ref,
        f"{sum(p.numel() for p in model.parameters()):,}",
        model.dtype,
    )
    return model


def ensure_token_capacity(model, tokenizer) -> bool:
    """Grow the input/output embeddings if the tokenizer has ids beyond them; True if resized.
    Released Qwen checkpoints pad the embedding matrix well past ``len(tokenizer)``, so adding the
    protocol tokens normally needs no resize; this guards the other cases (and custom models)."""
    needed = len(tokenizer)
    current = model.get_input_embeddings().weight.shape[0]
    if needed <= current:
        return False
    logger.info("Resizing token embeddings from %d to %d", current, needed)
    model.resize_token_embeddings(needed, pad_to_multiple_of=64)
    return True


def torchvision_importable() -> bool:
    """Whether torchvision really imports (a CUDA wheel over CPU torch is 'available' but broken)."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def _image_only_processor_class():
    """Build the image-only Qwen3-VL processor class lazily (keeps import of this module cheap)."""
    from transformers import Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen3VLImageOnlyProcessor(Qwen3VLProcessor):
        """``Qwen3VLProcessor`` without the torchvision-only video processor.
        ProcessorMixin derives a processor's sub-processors from its ``__init__`` signature, so
        dropping ``video_processor`` from the signature is what makes loading and saving skip it.
        Chat template, image-token expansion and ``mm_token_type_ids`` are inherited unchanged."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            # Mirrors Qwen3VLProcessor.__init__ minus the video processor.
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.vision_start_token = getattr(tokenizer, "vision_start_token", None) or "<|vision_start|>"
            self.vision_end_token = getattr(tokenizer, "vision_end_token", None) or "<|vision_end|>"
            self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
            self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)

        def to_dict(self) -> dict[str, Any]:
            # Saved checkpoints name the stock class: machines with torchvision load a regular one.
            out = super().to_dict()
            out["processor_class"] = "Qwen3VLProcessor"
            return out

    # Importable by name (module __getattr__ below) so processors pickle: datasets ships them to workers.
    Qwen3VLImageOnlyProcessor.__module__ = __name__
    Qwen3VLImageOnlyProcessor.__qualname__ = "Qwen3VLImageOnlyProcessor"
    return Qwen3VLImageOnlyProcessor


_TORCH_SUFFIX = "WithTorchOutputs"


class _TorchOutputsByDefault:
    """Mixin: a PIL-backend image processor that returns torch tensors unless told otherwise."""

    _canvasagent_base_name: str = ""

    def _preprocess(self, images, *args, return_tensors=None, **kwargs):
        return super()._preprocess(images, *args, return_tensors=return_tensors or "pt", **kwargs)

    def to_dict(self) -> dict[str, Any]:
        # Never leak the patched class name into saved configs.
        out = super().to_dict()
        out["image_processor_type"] = self._canvasagent_base_name
        return out


def force_torch_image_outputs(image_processor):
    """Make a PIL-backend image processor default to torch outputs (in place); returns it.
    Torchvision-backend processors already return tensors and are left alone. We swap the
    instance's class for a cached subclass rather than wrapping methods on the instance, because
    instance-level functions would end up in ``to_dict``/``save_pretrained`` and break pickling."""
    from transformers.image_processing_backends import PilBackend

    cls = type(image_processor)
    if not isinstance(image_processor, PilBackend) or issubclass(cls, _TorchOutputsByDefault):
        return image_processor
    image_processor.__class__ = _torch_output_class(cls)
    return image_processor


@functools.cache
def _torch_output_class(base: type) -> type:
    name = base.__name__ + _TORCH_SUFFIX
    patched = type(name, (_TorchOutputsByDefault, base), {"_canvasagent_base_name": base.__name__})
    # Importable by name through this module's __getattr__, so instances pickle.
    patched.__module__, patched.__qualname__ = __name__, name
    return patched


def __getattr__(name: str):
    """Resolve the lazily built classes by name (PEP 562); pickle looks them up this way."""
    if name == "Qwen3VLImageOnlyProcessor":
        return _image_only_processor_class()
    if name.endswith(_TORCH_SUFFIX):
        import transformers

        base = getattr(transformers, name[: -len(_TORCH_SUFFIX)], None)
        if isinstance(base, type):
            return _torch_output_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _needs_video_fallback(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return "torchvision" in text or "video_processor" in text or (
        isinstance(exc, (ImportError, AttributeError)) and not torchvision_importable()
    )


def _model_type(source: ModelSource) -> str | None:
    from transformers import AutoConfig

    try:
        return getattr(AutoConfig.from_pretrained(source.ref), "model_type", None)
    except Exception:  # a processor-only folder has no config.json; the caller decides
        return None


def load_processor(
    model_id_or_path: str | os.PathLike[str],
    *,
    add_protocol_tokens_if_missing: bool = True,
    torch_image_outputs: bool = True,
    **processor_kwargs: Any,
):
    """Load the multimodal processor for a checkpoint, with or without torchvision.

    Args:
        model_id_or_path: hub id or local directory (same values as :func:`load_policy`).
        add_protocol_tokens_if_missing: add ``<reason>``, ``<Terminate>``, ... as non-special added
            tokens when the tokenizer lacks them (real checkpoints); a no-op for the tiny model.
            Pair with :func:`ensure_token_capacity` on the model.
        torch_image_outputs: make the PIL image backend return torch tensors (see module doc).
        **processor_kwargs: passed to ``from_pretrained``.
    """
    from transformers import AutoProcessor

    source = resolve_source(model_id_or_path)
    try:
        processor = AutoProcessor.from_pretrained(source.ref, **processor_kwargs)
    except Exception as exc:
        if not _needs_video_fallback(exc):
            if _is_resolution_error(exc):
                raise _unavailable(source, "processor", exc) from exc
            raise
        model_type = _model_type(source)
        if model_type is not None and model_type not in _QWEN3_VL_MODEL_TYPES:
            raise RuntimeError(
                f"AutoProcessor failed for {source.ref!r} (model_type {model_type!r}) because torchvision "
                f"is unavailable ({exc}); the image-only fallback supports only {sorted(_QWEN3_VL_MODEL_TYPES)}. "
                "Install a torchvision build matching torch."
            ) from exc
        logger.info(
            "AutoProcessor needs torchvision (%s); using the image-only Qwen3-VL processor",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )
        processor = _load(source, "processor", _image_only_processor_class().from_pretrained, **processor_kwargs)

    if torch_image_outputs and getattr(processor, "image_processor", None) is not None:
        force_torch_image_outputs(processor.image_processor)
    if add_protocol_tokens_if_missing:
        added = add_protocol_tokens(processor.tokenizer)
        if added:
            logger.info("Added protocol tokens to the tokenizer of %s: %s", source.ref, added)
    return processor
