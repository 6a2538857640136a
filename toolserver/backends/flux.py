"""ImageGeneration and ImageEdit with FLUX.2 [klein] through diffusers.

* Generation: `Flux2KleinPipeline(prompt=...)` at the configured size (512x512, 4 steps,
  guidance 1.0 by default: the public settings; klein is step-distilled so guidance is ignored).
* Edit: the same pipeline with ``image=`` as the reference.
* Masked edit (``masked_image`` given): `Flux2KleinInpaintPipeline`, built from the same loaded
  components, so it costs no extra memory.

One backend serves both tools, and Generation and Edit in one process share the loaded pipeline.
Edits work at a size the pipeline accepts (sides >= 64 and multiples of 16, area capped by
``max_pixels``) and the result is resized back, so an edit keeps its input's size.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from toolserver.backends._base import (
    LazyModelBackend,
    hf_from_pretrained,
    mark_plumbing,
    parse_params,
    require,
    resolve_device,
    resolve_dtype,
    run_batched,
    shared,
    tiny_meta,
    to_rgb,
)
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolError, ToolResult

log = logging.getLogger(__name__)

DEFAULT_MODEL = "black-forest-labs/FLUX.2-klein-4B"
MIN_SIDE = 64  # Flux2ImageProcessor refuses reference images below this
MAX_ASPECT = 8.0  # ... and beyond this aspect ratio
MULTIPLE = 16  # VAE factor 8 x 2x2 latent patches


@dataclass
class FluxParams:
    model: str = DEFAULT_MODEL
    steps: int = 4
    guidance: float = 1.0
    width: int = 512
    height: int = 512
    strength: float = 0.9  # masked edit: how much of the masked region is re-noised
    max_pixels: int = 1024 * 1024  # working-area cap for edits (the pipeline's own cap)
    seed: int | None = None  # None: a fresh sample per call
    device: str = "auto"
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on the CPU
    cpu_offload: bool = False  # diffusers model CPU offload for small GPUs
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)  # extra __call__ arguments
    plumbing_only: bool = False


@dataclass
class _Pipes:
    base: Any
    device: str
    # One lock per loaded pipeline, not per backend: Generation and Edit share the pipeline, and
    # diffusers pipelines keep per-call state (scheduler timesteps, guidance scale).
    lock: threading.Lock = field(default_factory=threading.Lock)
    _inpaint: Any = None

    def inpaint(self) -> Any:
        if self._inpaint is None:
            from diffusers import Flux2KleinInpaintPipeline

            self._inpaint = Flux2KleinInpaintPipeline(**self.base.components)
            self._inpaint.set_progress_bar_config(disable=True)
        return self._inpaint


def working_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """A size the pipeline accepts with the input's aspect ratio: area <= max_pixels, each side
    >= 64, both multiples of 16."""
    if max(width, height) / max(min(width, height), 1) > MAX_ASPECT:
        raise ToolError("unsupported_aspect_ratio", f"ImageEdit supports aspect ratios up to {MAX_ASPECT:g}:1; got {width}x{height}")
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    scale = max(scale, MIN_SIDE / min(width, height))
    w = max(MIN_SIDE, int(width * scale) // MULTIPLE * MULTIPLE)
    h = max(MIN_SIDE, int(height * scale) // MULTIPLE * MULTIPLE)
    return w, h


def _dtype_kwarg(diffusers: Any, dtype: Any) -> dict[str, Any]:
    """diffusers 0.42 renamed `torch_dtype` to `dtype` (the old name warns); older ones know only the old."""
    from packaging.version import Version

    return {"dtype": dtype} if Version(diffusers.__version__) >= Version("0.42") else {"torch_dtype": dtype}


class FluxBackend(LazyModelBackend):
    name = "flux2-klein"

    def __init__(self, params: FluxParams):
        super().__init__(params)
        meta = tiny_meta(params.model)
        self.plumbing_only = params.plumbing_only or meta is not None
        # A tiny checkpoint records the call arguments its shrunken architecture needs (which
        # text-encoder layers to read, a short max_sequence_length); the config's own win.
        self.call_kwargs = {**((meta or {}).get("pipeline_kwargs") or {}), **params.pipeline_kwargs}
        if "text_encoder_out_layers" in self.call_kwargs:
            self.call_kwargs["text_encoder_out_layers"] = tuple(self.call_kwargs["text_encoder_out_layers"])

    def _load(self) -> _Pipes:
        diffusers = require("diffusers", "pip install 'diffusers>=0.36'")
        p = self.params
        device = resolve_device(p.device)
        dtype = resolve_dtype(p.dtype, device)

        def build() -> _Pipes:
            pipe = hf_from_pretrained(diffusers.Flux2KleinPipeline.from_pretrained, p.model, "the FLUX.2 klein pipeline", **_dtype_kwarg(diffusers, dtype))
            pipe.set_progress_bar_config(disable=True)
            if p.cpu_offload and device.startswith("cuda"):
                pipe.enable_model_cpu_offload()
            else:
                pipe.to(device)
            log.info("loaded FLUX.2 klein %s on %s (%s)", p.model, device, dtype)
            return _Pipes(pipe, device)

        return shared(("flux2-klein", p.model, device, str(dtype), p.cpu_offload), build)

    def _generator(self) -> Any:
        import torch

        if self.params.seed is None:
            return None
        return torch.Generator(device="cpu").manual_seed(self.params.seed)

    def _common(self) -> dict[str, Any]:
        p = self.params
        return {"num_inference_steps": p.steps, "guidance_scale": p.guidance, "generator": self._generator(), **self.call_kwargs}

    def generate(self, prompt: str) -> Image.Image:
        pipes = self._model.get()
        p = self.params
        with pipes.lock:
            return pipes.base(prompt=prompt, width=p.width, height=p.height, **self._common()).images[0]

    def edit(self, image: Image.Image, prompt: str, mask: Image.Image | None = None) -> Image.Image:
        pipes = self._model.get()
        src = to_rgb(image)
        w, h = working_size(src.width, src.height, self.params.max_pixels)
        work = src.resize((w, h), Image.Resampling.LANCZOS) if (w, h) != src.size else src
        with pipes.lock:
            if mask is None:
                out = pipes.base(image=work, prompt=prompt, width=w, height=h, **self._common()).images[0]
            else:
                m = mask.convert("L").resize((w, h), Image.Resampling.NEAREST)
                out = pipes.inpaint()(
                    image=work, mask_image=m, prompt=prompt, width=w, height=h, strength=self.params.strength, **self._common()
                ).images[0]
        return out.resize(src.size, Image.Resampling.LANCZOS) if out.size != src.size else out

    def __call__(self, request: ToolRequest) -> ToolResult:
        if request.tool == "ImageGeneration":
            prompt = str(request.args["prompt"])
            return self._generated(prompt, self.generate(prompt))
        if request.tool == "ImageEdit":
            prompt = str(request.args["edit_prompt"])
            image = self.edit(request.images["image"], prompt, request.images.get("masked_image"))
            return self._result(image, f"Edited image with instruction: {prompt}", request.images.get("masked_image") is not None)
        raise ToolError("wrong_backend", f"the flux2-klein backend serves ImageGeneration and ImageEdit, not {request.tool}")

    def _generated(self, prompt: str, image: Image.Image) -> ToolResult:
        return self._result(image, f"Generated image for prompt: {prompt}", False)

    def _result(self, image: Image.Image, text: str, masked: bool) -> ToolResult:
        result = ToolResult(
            ok=True,
            text=text,
            kind=OutputKind.IMAGE,
            image=image.convert("RGB"),
            data={"size": list(image.size), "masked": masked},
            backend=self.name,
        )
        return mark_plumbing(result, self.plumbing_only)

    def generate_batch(self, prompts: list[str]) -> list[Image.Image]:
        """One pipeline call for several prompts, at the configured size and steps. With a fixed
        seed each prompt gets its own generator seeded alike, so each image starts from the noise
        a single call gives it (one shared generator would not)."""
        pipes = self._model.get()
        p = self.params
        kwargs = self._common()
        if self.params.seed is not None:
            kwargs["generator"] = [self._generator() for _ in prompts]
        with pipes.lock:
            return list(pipes.base(prompt=prompts, width=p.width, height=p.height, **kwargs).images)

    def _prepare(self, request: ToolRequest) -> tuple[str, ToolRequest]:
        if request.tool not in ("ImageGeneration", "ImageEdit"):
            raise ToolError("wrong_backend", f"the flux2-klein backend serves ImageGeneration and ImageEdit, not {request.tool}")
        return (str(request.args["prompt"]) if request.tool == "ImageGeneration" else ""), request

    def _key(self, prepared: tuple[str, ToolRequest]) -> Any:
        # Every generation request is compatible (size, steps and guidance are the backend's).
        # Edits are not batched: the klein pipeline reads a list of images as several references
        # for one prompt, and the inpaint pipeline's per-image masks and working sizes differ.
        _, request = prepared
        return "generate" if request.tool == "ImageGeneration" else ("edit", id(request))

    def _run_group(self, group: list[tuple[str, ToolRequest]]) -> list[ToolResult]:
        if group[0][1].tool != "ImageGeneration":
            return [self(request) for _, request in group]  # an edit, alone in its group
        prompts = [prompt for prompt, _ in group]
        return [self._generated(prompt, image) for prompt, image in zip(prompts, self.generate_batch(prompts))]

    def batch_call(self, requests: list[ToolRequest]) -> list[ToolResult]:
        """Generation requests in one pipeline call; edits one by one (see `_key`)."""
        return run_batched(requests, self._prepare, self._key, self._run_group, self, self.name)


def flux2_klein(**params: Any) -> FluxBackend:
    return FluxBackend(parse_params(FluxParams, params, "flux2-klein"))
