"""Serve config, placement dry run, auth rule, wire/HTTP codecs and client retries: no Ray."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from toolserver import http_codec
from toolserver.backends import BACKEND_FACTORIES
from toolserver.client import HttpToolbox, RayToolbox, RetryPolicy
from toolserver.http_codec import BadRequest, decode_image, encode_image, result_to_json
from toolserver.registry import Backend, OutputKind, model_backed
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.serve_config import (
    HttpConfig,
    Mode,
    ServeConfig,
    ServeConfigError,
    check_bind,
    check_placement,
    is_loopback,
    servable_tools,
)
from toolserver.wire import (
    SHM_DIR,
    SHM_PREFIX,
    SHM_UNAVAILABLE,
    ShmMissing,
    ShmPool,
    WireImage,
    WireRequest,
    WireResult,
    shm_available,
)

FAST = RetryPolicy(attempts=3, backoff_s=0.001, max_backoff_s=0.002)


# ---------------------------------------------------------------------- configs and placement
def test_shipped_configs_cover_the_registry_and_round_trip():
    for name in ("local_cpu", "paper_2gpu"):
        cfg = ServeConfig.load(name)
        assert list(cfg.manifest()) == [t.name for t in servable_tools()]
        assert ServeConfig.from_dict(cfg.to_dict()) == cfg


def test_paper_config_dry_run_places_every_model_tool():
    cfg = ServeConfig.load("paper_2gpu")
    rep = check_placement(cfg, set(BACKEND_FACTORIES))
    assert rep.ok, rep.render()
    assert not rep.unconfigured
    placed = {t for items in rep.gpus.values() for t, _ in items}
    assert {"ImageGeneration", "SR", "OCR"} == {t for t, _ in rep.gpus[0]}
    assert {"ImageEdit", "SAM", "Grounding"} == {t for t, _ in rep.gpus[1]}
    assert placed | set(rep.cpu_models) == {t.name for t in model_backed()}
    assert all(rep.gpu_load(g) <= 1 + 1e-9 for g in rep.gpus)
    assert all(cfg.mode(t.name) is Mode.CALLER for t in servable_tools() if t.backend is Backend.PURE)


def test_backends_come_from_the_tools_config(tmp_path):
    from toolserver.config import ToolsConfig

    paper, tools = ServeConfig.load("paper_2gpu"), ToolsConfig.load("paper_gpu")
    for tool, bcfg in tools.backends.items():
        assert (paper.tools[tool].backend, paper.tools[tool].params) == (bcfg.name, bcfg.params)
    local = ServeConfig.load("local_cpu")
    assert local.tools["OCR"].backend == "rapidocr" and local.tools["OCR"].params["threads"] == 1
    # The serve config's own backend wins over the tools config's.
    own = ServeConfig.from_dict({"backends_from": "offline", "tools": {"OCR": {"backend": "paddleocr"}}})
    assert own.tools["OCR"].backend == "paddleocr" and own.tools["SR"].backend == "realesrgan-torch"
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends:\n  brush_stroke: {name: rapidocr}\n")
    with pytest.raises(ServeConfigError, match="not a served tool"):
        ServeConfig.from_dict({"backends_from": str(bad)})
    with pytest.raises(ServeConfigError):
        ServeConfig.from_dict({"backends_from": "no_such_tools_config"})


def _paper(**tool_overrides) -> dict:
    data = ServeConfig.load("paper_2gpu").to_dict()
    for tool, over in tool_overrides.items():
        data["tools"][tool].update(over)
    return data


def test_dry_run_catches_oversubscription_unplaced_and_missing_tools():
    over = check_placement(ServeConfig.from_dict(_paper(SR={"ray_actor_options": {"num_gpus": 0.5}})))
    assert not over.ok and any("GPU 0 is oversubscribed" in e for e in over.errors)
    # Autoscaling counts at max_replicas: 0.3 x 2 on top of 0.7 does not fit.
    scaled = check_placement(ServeConfig.from_dict(_paper(SR={"autoscaling_config": {"min_replicas": 1, "max_replicas": 2}, "ray_actor_options": {"num_gpus": 0.3}})))
    assert not scaled.ok
    unplaced = check_placement(ServeConfig.from_dict(_paper(SAM={"gpu": None})))
    assert any("SAM" in e and "not placed" in e for e in unplaced.errors)
    no_grounding = {**_paper(Grounding={"backend": None}), "backends_from": None}
    missing = check_placement(ServeConfig.from_dict(no_grounding))
    assert any("Grounding" in e and "no backend" in e for e in missing.errors)
    typo = check_placement(ServeConfig.from_dict(_paper(OCR={"backend": "rapid-ocr"})), set(BACKEND_FACTORIES))
    assert any("unknown backend" in e for e in typo.errors)


def test_config_errors_are_loud():
    bad = [
        {"tools": {"NotATool": {}}},
        {"tools": {"brush_stroke": {}}},  # stateful tools act on an environment, not a server
        {"tools": {"Flip": {"backend": "rapidocr"}}},
        {"tools": {"OCR": {"backend": "rapidocr", "mode": "caller"}}},
        {"tools": {"OCR": {"backnd": "rapidocr"}}},
        {"pure_mode": "elsewhere"},
        {"http": {"port": 0}},
        {"tools": {"OCR": {"backend": "rapidocr", "max_concurrent_batches": 0}}},
        # 2 batches of 4 need 8 requests held at the replica
        {"tools": {"OCR": {"backend": "rapidocr", "max_batch_size": 4, "max_concurrent_batches": 2, "max_ongoing_requests": 7}}},
    ]
    for data in bad:
        with pytest.raises(ServeConfigError):
            ServeConfig.from_dict(data)


def test_pure_modes_and_shared_deployment():
    shared = ServeConfig.from_dict({"pure_mode": "shared", "pure": {"num_replicas": 3}})
    (tools, opts), = [v for k, v in shared.deployments().items() if k == "PureTools"]
    assert set(tools) == {t.name for t in servable_tools() if t.backend is Backend.PURE} and opts.num_replicas == 3
    mixed = ServeConfig.from_dict({"pure_mode": "caller", "tools": {"Flip": {"mode": "deployment"}}})
    assert mixed.deployment_for("Flip") == "Flip" and mixed.deployment_for("Crop") is None
    assert mixed.mode("SAM") is Mode.UNCONFIGURED


def test_slots_placement_pins_each_replica_to_its_planned_gpu():
    from toolserver.serve_config import node_resources, ray_actor_options

    cfg = ServeConfig.load("paper_2gpu")
    assert cfg.placement == "slots"
    # The GPU fraction moves from Ray's GPU accounting (start-order packing) to the planned
    # GPU's own resource; CPU options and any other resources stay.
    for tool, gpu in {"ImageGeneration": 0, "SR": 0, "OCR": 0, "ImageEdit": 1, "SAM": 1, "Grounding": 1}.items():
        tcfg = cfg.tools[tool]
        opts = ray_actor_options(cfg, tcfg)
        assert "num_gpus" not in opts and opts["resources"] == {f"toolgpu{gpu}": tcfg.num_gpus}, tool
        assert opts["num_cpus"] == tcfg.ray_actor_options["num_cpus"]
    assert node_resources(cfg) == {"toolgpu0": 1.0, "toolgpu1": 1.0}
    # Each GPU's resource is exactly what the plan sums to, at max replicas, so Ray itself
    # refuses what the dry run calls oversubscribed.
    rep = check_placement(cfg, set(BACKEND_FACTORIES))
    assert rep.ok and not rep.warnings, rep.render()
    for g in (0, 1):
        asked = sum(rep.pins[name][f"toolgpu{g}"] * cfg.tools[name].max_replicas for name in rep.pins if f"toolgpu{g}" in rep.pins[name])
        assert asked == pytest.approx(rep.gpu_load(g)) and asked <= node_resources(cfg)[f"toolgpu{g}"] + 1e-9
    kept = ServeConfig.from_dict(_paper(SAM={"ray_actor_options": {"num_cpus": 1, "num_gpus": 0.1, "resources": {"big_mem": 1}}}))
    assert ray_actor_options(kept, kept.tools["SAM"])["resources"] == {"big_mem": 1, "toolgpu1": 0.1}


def test_other_placements_and_their_checks():
    from toolserver.serve_config import (
        missing_node_resources,
        node_resources,
        ray_actor_options,
    )

    nodes = ServeConfig.from_dict({**_paper(), "placement": "nodes"})
    opts = ray_actor_options(nodes, nodes.tools["SAM"])
    assert opts["resources"] == {"toolgpu1": 0.001} and opts["num_gpus"] == 0.1
    plain = ServeConfig.from_dict({**_paper(), "placement": "ray"})
    assert ray_actor_options(plain, plain.tools["SAM"]) == plain.tools["SAM"].ray_actor_options and node_resources(plain) == {}
    # The paper fractions can pack differently in some start order: only Ray's own packing warns.
    assert any("start order" in w for w in check_placement(plain).warnings)
    assert missing_node_resources(nodes, {"toolgpu0": 1.0, "toolgpu1": 1.0, "GPU": 2.0}) == []
    assert missing_node_resources(nodes, {"toolgpu0": 1.0, "GPU": 2.0}) == ["toolgpu1 (has 0, needs 1)"]
    for bad in ({"placement": "anywhere"}, {"pin_resource_prefix": "tool gpu"}):
        with pytest.raises(ServeConfigError):
            ServeConfig.from_dict({**_paper(), **bad})


def test_a_slots_replica_selects_its_device_from_the_nodes_visible_gpus():
    from toolserver.serve_config import tool_gpu_device

    assert tool_gpu_device(1, "6,7") == "7" and tool_gpu_device(0, "6, 7") == "6"
    assert tool_gpu_device(1, None) == "1"  # every GPU visible: tool GPU i is device i
    assert tool_gpu_device(0, "GPU-3f2a") == "GPU-3f2a"  # UUIDs pass through
    with pytest.raises(ServeConfigError, match="CUDA_VISIBLE_DEVICES"):
        tool_gpu_device(1, "6")  # a node that sees one GPU cannot host tool GPU 1
    with pytest.raises(ServeConfigError):
        tool_gpu_device(0, "")


# ---------------------------------------------------------------------- auth rule
@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    assert is_loopback(host)
    check_bind(HttpConfig(host=host), None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "toolserver.example"])
def test_public_bind_requires_a_token(host):
    assert not is_loopback(host)
    with pytest.raises(ServeConfigError, match="bearer token is required"):
        check_bind(HttpConfig(host=host), None)
    check_bind(HttpConfig(host=host), "s3cret-token-of-24-chars")
    check_bind(HttpConfig(host=host, enabled=False), None)  # no HTTP, nothing exposed


def test_build_app_and_cli_refuse_a_public_bind_without_token(monkeypatch, capsys):
    from toolserver.cli import main
    from toolserver.serve_app import build_app

    cfg = ServeConfig.load("local_cpu")
    cfg.http.host = "0.0.0.0"
    with pytest.raises(ServeConfigError):
        build_app(cfg, None)  # refused before any Ray call or socket
    monkeypatch.delenv("CANVASAGENT_TOOLSERVER_TOKEN", raising=False)
    assert main(["serve", "--config", "local_cpu", "--host", "0.0.0.0", "--dry-run"]) == 1
    assert "bearer token is required" in capsys.readouterr().out
    monkeypatch.setenv("CANVASAGENT_TOOLSERVER_TOKEN", "s3cret-token-of-24-chars")
    assert main(["serve", "--config", "local_cpu", "--host", "0.0.0.0", "--dry-run"]) == 0


def test_cli_dry_run_of_the_paper_config(capsys):
    from toolserver.cli import main

    assert main(["serve", "--config", "paper_2gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0: 1.00 of 1.00" in out and "GPU 1: 1.00 of 1.00" in out and "config OK" in out
    assert "placement: slots (enforced)" in out and "warning" not in out
    assert "ImageGeneration: toolgpu0 0.6" in out and "SAM: toolgpu1 0.1" in out


def test_cli_backends_from_override(capsys):
    from toolserver.cli import main

    assert main(["serve", "--config", "local_cpu", "--backends-from", "offline_plumbing", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "without a backend" not in out and "ImageGeneration" in out
    assert main(["serve", "--config", "local_cpu", "--backends-from", "no_such_config", "--dry-run"]) == 2


def test_ingress_token_check():
    from toolserver.serve_app import authorized, token_digest

    d = token_digest("abc")
    assert authorized("Bearer abc", d) and not authorized("Bearer abd", d)
    assert not authorized(None, d) and not authorized("abc", d) and not authorized("Basic abc", d)
    assert authorized(None, None)  # loopback without a token configured


# ---------------------------------------------------------------------- wire and HTTP formats
@pytest.mark.parametrize("mode", ["1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16", "P", "CMYK"])
def test_wire_images_keep_mode_and_pixels(mode):
    rng = np.random.default_rng(0)
    src = Image.fromarray(rng.integers(0, 255, (7, 9, 4), dtype=np.uint8), "RGBA").convert(mode)
    back = WireImage.pack(src).unpack()
    assert back.mode == src.mode and back.size == src.size and back.tobytes() == src.tobytes()
    if mode == "RGB":
        assert WireImage.pack(src).array is not None  # arrays, not PNG bytes


def test_wire_request_and_result_round_trip():
    img = Image.new("RGBA", (5, 4), (1, 2, 3, 4))
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": img}, {"image": "img_1"})
    back = WireRequest.pack(req).unpack()
    assert back.tool == "Flip" and back.images["image"].tobytes() == img.tobytes() and back.profile == req.profile
    res = ToolResult(True, "done", image=img, data={"k": [1]}, plumbing_only=True, backend="x")
    out = WireResult.pack(res).unpack()
    assert (out.ok, out.text, out.data, out.plumbing_only, out.backend) == (True, "done", {"k": [1]}, True, "x")


def _shm_files() -> set[str]:
    """This process's slot files. Not the whole directory: every new pool sweeps dead owners'
    files (a killed test run's, say), and other processes may share this /dev/shm."""
    from toolserver.wire import _owner_tag

    return {p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}{_owner_tag() or ''}*")}


needs_shm = pytest.mark.skipif(not shm_available(), reason="no writable /dev/shm")


@pytest.fixture
def pool():
    before = _shm_files()
    p = ShmPool()
    yield p
    p.close()
    assert _shm_files() == before  # the pool removes every file it made


@needs_shm
@pytest.mark.parametrize("mode", ["1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16", "P"])
def test_shm_images_keep_mode_and_pixels(mode, pool):
    rng = np.random.default_rng(1)
    src = Image.fromarray(rng.integers(0, 255, (300, 400, 4), dtype=np.uint8), "RGBA").convert(mode)
    w = WireImage.pack(src, pool)
    # Big enough raw images go through a slot; packed bits (mode 1) and palettes do not.
    assert (w.shm is not None) == (mode not in ("1", "P"))
    if mode == "RGB":  # Pillow's own 4-byte layout, several encoder chunks long
        assert w.rawmode == "RGBX" and w.nbytes == 400 * 300 * 4
    for back in (w.unpack(), w.unpack(pool)):  # as a replica (opens the file) and as its owner
        assert back.mode == src.mode and back.size == src.size and back.tobytes() == src.tobytes()


def test_pillow_block_reuse_yields_to_the_operators_setting(monkeypatch):
    from toolserver.wire import PILLOW_BLOCKS, keep_pillow_blocks

    before = Image.core.get_blocks_max()
    try:
        monkeypatch.setenv("PILLOW_BLOCKS_MAX", "0")
        Image.core.set_blocks_max(0)
        keep_pillow_blocks()
        assert Image.core.get_blocks_max() == 0
        monkeypatch.delenv("PILLOW_BLOCKS_MAX")
        keep_pillow_blocks()
        assert Image.core.get_blocks_max() == PILLOW_BLOCKS
    finally:
        Image.core.set_blocks_max(before)


@needs_shm
def test_shm_slots_are_reused_grown_and_removed(pool):
    img = Image.effect_noise((256, 256), 50).convert("RGB")
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": img})
    wire = WireRequest.pack(req, pool)
    assert wire.uses_shm and wire.reply_slot is not None
    assert wire.unpack().images["image"].tobytes() == img.tobytes()
    assert wire.unpack().images["image"].tobytes() == img.tobytes()  # a retried call reads it again
    big = img.resize((1024, 1024))  # the replica grows the caller's (empty) reply slot
    out = WireResult.pack(ToolResult(True, "done", OutputKind.IMAGE, image=big), wire.reply_slot)
    assert out.image.shm == wire.reply_slot
    assert out.unpack(pool).image.tobytes() == big.tobytes()
    names = _shm_files()
    wire.release(pool)
    again = WireRequest.pack(req, pool)  # the next call takes the same files back: no new pages
    assert _shm_files() == names and {again.images["image"].shm, again.reply_slot} == {wire.images["image"].shm, wire.reply_slot}
    again.release(pool, reuse=False)  # after a timeout they are removed instead
    assert not (_shm_files() & {again.images["image"].shm, again.reply_slot})
    small = WireRequest.pack(ToolRequest("Flip", {}, {"image": Image.new("RGB", (8, 8))}), pool)
    assert not small.uses_shm and small.reply_slot is None  # Ray inlines small arrays in the RPC


@needs_shm
def test_replica_mappings_are_dropped_when_the_caller_removes_its_slot():
    from toolserver import wire as wire_mod

    img = Image.effect_noise((256, 256), 50).convert("L")
    owner, other = ShmPool(), ShmPool()
    w = WireImage.pack(img, owner)
    assert w.unpack().tobytes() == img.tobytes()  # as a replica: mapped once, kept for reuse
    assert w.shm in wire_mod._CACHE._slots
    owner.close()
    WireImage.pack(img, other).unpack()  # any later use of the cache prunes removed slots
    assert w.shm not in wire_mod._CACHE._slots
    other.close()


@needs_shm
def test_shm_names_are_checked_before_any_file_is_opened(pool):
    for name in ("../etc/passwd", SHM_PREFIX + "x" * 32, "plasma"):
        with pytest.raises(ShmMissing):
            WireImage("L", shm=name, size=(1, 1), nbytes=1).unpack()
    missing = WireImage("L", shm=SHM_PREFIX + "0" * 32, size=(300, 300), nbytes=90_000)
    with pytest.raises(ShmMissing):
        missing.unpack()  # another host's slot: the replica answers shm_unavailable
    w = WireImage.pack(Image.new("L", (300, 300)), pool)
    w.nbytes += 1  # more than the slot holds is refused, not read past its end
    with pytest.raises(ShmMissing):
        w.unpack()
    # A reply slot that vanished: the replica falls back to an array.
    out = WireResult.pack(ToolResult(True, "x", OutputKind.IMAGE, Image.new("L", (300, 300))), SHM_PREFIX + "0" * 32)
    assert out.image.shm is None and out.image.array is not None


def test_wire_arrays_unpack_read_only_and_strided():
    img = Image.effect_noise((64, 48), 40).convert("RGB")
    arr = np.asarray(img).copy()
    arr.setflags(write=False)  # as Ray's object store hands them out
    back = WireImage("RGB", array=arr).unpack()
    assert back.tobytes() == img.tobytes()
    back.putpixel((0, 0), (1, 2, 3))  # a writable copy, not a view of the store
    flipped = WireImage("RGB", array=arr[:, ::-1]).unpack()  # not contiguous: fromarray path
    assert flipped.tobytes() == img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes()


@needs_shm
def test_replica_answers_shm_unavailable_and_replies_in_kind(pool):
    import asyncio

    from toolserver.serve_app import ToolDeployment

    replica = ToolDeployment.func_or_class(["Flip"], None, {}, 1, 0.01, 10**7)
    img = Image.effect_noise((256, 256), 50).convert("RGB")
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": img})
    remote = WireRequest("Flip", req.args, {"image": WireImage("RGB", shm=SHM_PREFIX + "0" * 32, size=(256, 256), nbytes=256 * 256 * 3)})
    assert asyncio.run(replica(remote)).error_code == SHM_UNAVAILABLE
    want = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes()
    for p in (pool, None):
        wire = WireRequest.pack(req, p)
        out = asyncio.run(replica(wire))
        assert (out.image.shm is not None) == (p is not None)  # slots in, slot out; arrays in, arrays out
        assert out.unpack(p).image.tobytes() == want
        wire.release(p)


def test_http_codec_limits():
    small = Image.new("L", (50, 40), 7)
    assert decode_image(encode_image(small), 10_000).tobytes() == small.tobytes()
    with pytest.raises(BadRequest) as e:
        decode_image(encode_image(small), 1999)
    assert e.value.code == "too_many_pixels"
    for junk in ("***", base64.b64encode(b"\x89PNG\r\n\x1a\nbroken").decode(), base64.b64encode(b"GIF89a....").decode()):
        with pytest.raises(BadRequest) as e:
            decode_image(junk, 10_000)
        assert e.value.code == "bad_image"


@pytest.mark.parametrize("mode", ["1", "L", "LA", "RGB", "RGBA", "P", "I;16", "I", "F"])
def test_raw_frames_keep_mode_and_pixels(mode):
    src = Image.effect_noise((37, 21), 60).convert(mode)  # odd width: mode 1 rows are padded
    if mode in ("I", "F"):  # no byte-order-free raw form, and Pillow writes neither as PNG
        assert http_codec.raw_length(mode, src.size) is None
        return
    req = ToolRequest("Overlayer", {"text": "hi"}, {"image": src, "mask": Image.new("L", (3, 2), 9)}, {"text": "hi"})
    back = http_codec.request_from_raw("Overlayer", http_codec.request_to_raw(req), 10_000)
    assert (back.args, back.raw_args, back.profile) == (req.args, req.raw_args, req.profile)
    for k, img in req.images.items():
        assert back.images[k].mode == img.mode and back.images[k].tobytes() == img.tobytes()
    res = ToolResult(True, "done", OutputKind.IMAGE, src, {"k": [1]}, plumbing_only=True, backend="x")
    out = http_codec.result_from_raw(http_codec.result_to_raw(res), 10_000)
    assert (out.ok, out.text, out.kind, out.data, out.plumbing_only) == (True, "done", OutputKind.IMAGE, {"k": [1]}, True)
    assert out.image.mode == src.mode and out.image.tobytes() == src.tobytes()


def _frame(header: object, pixels: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(4, "big") + head + pixels


def test_raw_frames_are_checked_before_pixels_are_read():
    ok = {"mode": "RGB", "size": [4, 2], "offset": 0, "length": 24}
    assert http_codec.request_from_raw("Flip", _frame({"images": {"image": ok}}, bytes(24)), 1000).images["image"].size == (4, 2)
    cases = [
        (b"\x00\x00", "bad_request"),  # shorter than the length prefix
        (b"\x00\x00\x01\x00{}", "bad_request"),  # header runs past the body
        (b"\x00\x00\x00\x03{x}", "bad_request"),  # header not JSON
        (_frame([1, 2]), "bad_request"),
        (_frame({"images": {"image": {**ok, "size": [100, 100]}}}, bytes(24)), "too_many_pixels"),
        (_frame({"images": {"image": {**ok, "length": 23}}}, bytes(24)), "bad_image"),  # wrong length for the size
        (_frame({"images": {"image": {**ok, "offset": 1}}}, bytes(24)), "bad_image"),  # past the pixel section
        (_frame({"images": {"image": {**ok, "offset": -1}}}, bytes(24)), "bad_image"),
        (_frame({"images": {"image": {**ok, "mode": "P"}}}, bytes(24)), "bad_image"),  # no raw form: PNG
        (_frame({"images": {"image": {**ok, "size": [4, 2.0]}}}, bytes(24)), "bad_image"),
        (_frame({"images": {"image": {**ok, "size": [0, 2]}}}, bytes(24)), "bad_image"),
        (_frame({"images": {"image": 7}}), "bad_image"),
        (_frame({"images": {"image": "%%%"}}), "bad_image"),  # base64 PNG slot, not base64
    ]
    for body, code in cases:
        with pytest.raises(BadRequest) as e:
            http_codec.request_from_raw("Flip", body, 1000)
        assert e.value.code == code, body[:60]


def test_content_negotiation_helpers():
    assert http_codec.media_type("Application/JSON; charset=utf-8") == "application/json"
    assert http_codec.accepts_raw(f"application/json, {http_codec.RAW_CONTENT_TYPE};q=0.9")
    assert not http_codec.accepts_raw(None) and not http_codec.accepts_raw("*/*")


def test_http_client_prefers_raw_frames_when_the_server_lists_them():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tools":
            return httpx.Response(200, json={"tools": [{"name": "Flip", "timeout_s": 5}], "formats": list(http_codec.FORMATS)})
        seen.append((request.headers["content-type"], request.headers["accept"]))
        req = http_codec.request_from_raw("Flip", request.content, 1000)
        out = ToolResult(True, "ok", OutputKind.IMAGE, req.images["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT))
        return httpx.Response(200, content=http_codec.result_to_raw(out), headers={"content-type": http_codec.RAW_CONTENT_TYPE})

    box = HttpToolbox("http://toolserver.test", retry=FAST, transport=httpx.MockTransport(handler))
    res = box.call(_flip())
    assert res.ok and res.image.tobytes() == _flip().images["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes()
    assert seen == [(http_codec.RAW_CONTENT_TYPE, http_codec.RAW_CONTENT_TYPE)]
    # An older server (no "formats" in its listing) or raw=False: the public JSON format.
    assert HttpToolbox("http://toolserver.test", retry=FAST, raw=False, transport=httpx.MockTransport(handler)).call(_flip()).error_code == "toolserver_error"


# ---------------------------------------------------------------------- client retries and failures
def _flip() -> ToolRequest:
    return ToolRequest("Flip", {"image": "img_1"}, {"image": Image.new("RGB", (4, 3), "red")})


def test_http_client_retries_5xx_then_succeeds():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tools":
            return httpx.Response(200, json={"tools": [{"name": "Flip", "timeout_s": 5}]})
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, json={"error": {"code": "replica_unavailable", "message": "dead"}})
        body = json.loads(request.content)
        img = decode_image(body["images"]["image"], 100)
        return httpx.Response(200, json=result_to_json(ToolResult(True, "ok", image=img.transpose(Image.Transpose.FLIP_LEFT_RIGHT))))

    box = HttpToolbox("http://toolserver.test", token="t", retry=FAST, transport=httpx.MockTransport(handler))
    res = box.call(_flip())
    assert res.ok and res.image.size == (4, 3) and len(calls) == 3
    assert calls[0].headers["authorization"] == "Bearer t"


def test_http_client_failures_are_results_not_exceptions():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tools":
            return httpx.Response(200, json={"tools": []})
        if request.url.path.endswith("/Crop"):
            return httpx.Response(504, json={"error": {"code": "timeout", "message": "Crop did not finish"}})
        return httpx.Response(500, text="boom")

    box = HttpToolbox("http://toolserver.test", retry=FAST, transport=httpx.MockTransport(handler))
    res = box.call(ToolRequest("Crop", {}, {}))
    assert not res.ok and res.error_code == "timeout"  # 504 is not retried
    res = box.call(_flip())
    assert not res.ok and res.error_code == "toolserver_unavailable"


def test_http_client_against_a_closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = HttpToolbox(f"http://127.0.0.1:{port}", retry=FAST)
    res = box.call(_flip())
    assert not res.ok and res.error_code == "toolserver_unavailable" and "ConnectError" in res.text


class _FakeResponse:
    def __init__(self, outcome):
        self.outcome, self.cancelled = outcome, False

    def result(self, timeout_s=None):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self):
        self.cancelled = True


class _FakeHandle:
    def __init__(self, outcomes):
        self.outcomes, self.sent = list(outcomes), []

    def remote(self, wire):
        self.sent.append(wire)
        return _FakeResponse(self.outcomes.pop(0))


def _ray_box(handle, shm: bool = False) -> RayToolbox:
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import DeploymentUnavailableError

    from toolserver.toolbox import LocalToolbox

    box = RayToolbox.__new__(RayToolbox)  # no cluster: exercise the call path with a fake handle
    box.retry, box._retryable, box.max_pixels, box.row_overhead_pixels = FAST, (RayActorError, DeploymentUnavailableError), 10_000, 64
    box.shm, box._shm_off = (ShmPool() if shm else None), set()
    box.manifest = {
        "Flip": {"mode": "deployment", "timeout_s": 1.0, "deployment": "PureTools"},
        "Crop": {"mode": "caller", "timeout_s": 1.0, "deployment": None},
        "SAM": {"mode": "unconfigured", "timeout_s": 1.0, "deployment": None},
    }
    box.handles, box.local = {"Flip": handle}, LocalToolbox()
    return box


def test_ray_client_retries_dead_replicas_and_maps_timeouts():
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import DeploymentUnavailableError

    ok = WireResult.pack(ToolResult(True, "flipped"))
    h = _FakeHandle([DeploymentUnavailableError("PureTools"), ActorDiedError(), ok])
    assert _ray_box(h).call(_flip()).ok and len(h.sent) == 3
    assert isinstance(h.sent[0].images["image"].array, np.ndarray)  # arrays on the wire, not PNG

    resp_timeout = _FakeHandle([TimeoutError()])
    res = _ray_box(resp_timeout).call(_flip())
    assert not res.ok and res.error_code == "timeout"

    gone = _ray_box(_FakeHandle([DeploymentUnavailableError("PureTools")] * 3)).call(_flip())
    assert not gone.ok and gone.error_code == "toolserver_unavailable"
    dead = _FakeHandle([ActorDiedError()] * 3)  # died during the call: resent once, not until attempts run out
    res = _ray_box(dead).call(_flip())
    assert not res.ok and res.error_code == "replica_died" and len(dead.sent) == 2
    boom = _ray_box(_FakeHandle([RuntimeError("bug")])).call(_flip())
    assert not boom.ok and boom.error_code == "toolserver_error"
    assert _ray_box(_FakeHandle([])).call(ToolRequest("SAM", {}, {})).error_code == "backend_not_configured"
    crop = ToolRequest("Crop", {"image": "img_1", "bbox": [0.0, 0.0, 500.0, 500.0]}, {"image": Image.new("RGB", (8, 8))})
    local = _ray_box(_FakeHandle([])).call(crop)  # caller mode: runs here, no handle call
    assert local.ok and local.image.size == (4, 4)
    assert _ray_box(_FakeHandle([])).call(ToolRequest("Nope", {}, {})).error_code == "unknown_tool"
    big = ToolRequest("Flip", {}, {"image": Image.new("L", (200, 200))})
    assert _ray_box(_FakeHandle([])).call(big).error_code == "too_many_pixels"


@needs_shm
def test_ray_client_falls_back_to_arrays_when_the_replica_is_elsewhere():
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": Image.effect_noise((256, 256), 50).convert("RGB")})
    before = _shm_files()
    miss = WireResult.pack(ToolResult.failure(SHM_UNAVAILABLE, "not on this host"))
    h = _FakeHandle([miss, WireResult.pack(ToolResult(True, "flipped")), WireResult.pack(ToolResult(True, "again"))])
    box = _ray_box(h, shm=True)
    box.max_pixels = 10**6
    assert box.call(req).text == "flipped"
    assert h.sent[0].images["image"].shm is not None and h.sent[1].images["image"].array is not None
    assert box.call(req).text == "again" and h.sent[2].images["image"].array is not None  # stays off
    box.close()
    assert _shm_files() == before


@needs_shm
def test_ray_client_removes_slots_a_timed_out_replica_may_still_use():
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": Image.effect_noise((256, 256), 50).convert("RGB")})
    box = _ray_box(_FakeHandle([TimeoutError(), WireResult.pack(ToolResult(True, "ok"))]), shm=True)
    box.max_pixels = 10**6
    assert box.call(req).error_code == "timeout"
    first = box.handles["Flip"].sent[0]
    assert box.shm.get(first.images["image"].shm) is None and box.shm.get(first.reply_slot) is None
    assert box.call(req).ok  # fresh slots
    second = box.handles["Flip"].sent[1]
    assert box.shm.get(second.images["image"].shm) is not None  # pooled for the next call
    box.close()
