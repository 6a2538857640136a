"""Hostile inputs against the tool server and its clients, without Ray: huge integers, long text,
deep JSON, thin-and-tall images, oversized SR inputs, racing first calls, auth edge cases, and
resends after a replica died. Each test fails on the code before its limit existed.

The same refusals over a real Ray Serve (HTTP and handle) are in test_serve.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
import time
import zlib

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.core.episode import Episode
from canvasagent.core.tasks import Task
from toolserver import http_codec
from toolserver.backends import BACKEND_FACTORIES
from toolserver.client import HttpToolbox, RetryPolicy
from toolserver.http_codec import BadRequest
from toolserver.limits import Limits, check_request, json_depth_exceeds, pixel_cost
from toolserver.registry import REGISTRY, ArgType
from toolserver.request import ToolRequest
from toolserver.results import ToolError, ToolResult
from toolserver.serve_config import (
    HttpConfig,
    ServeConfig,
    ServeConfigError,
    check_bind,
)
from toolserver.toolbox import LocalToolbox
from toolserver.validation import DEFAULT_MAX_TEXT_CHARS, Profile, validate_call
from toolserver.wire import WireRequest

FAST = RetryPolicy(attempts=6, backoff_s=0.001, max_backoff_s=0.002)


class _Assets:
    """img_1 (RGB 64x48) and SAM_0 (its mask), for validate_call."""

    def __init__(self) -> None:
        from toolserver.registry import OutputKind

        class _A:
            def __init__(self, kind):
                self.kind, self.size = kind, (64, 48)

        self._d = {"img_1": _A(OutputKind.IMAGE), "SAM_0": _A(OutputKind.MASK), "Extract_0": _A(OutputKind.RGBA)}

    def __contains__(self, k):
        return isinstance(k, str) and k in self._d

    def get(self, k):
        return self._d[k]

    def ids(self):
        return list(self._d)


def _photo(w: int = 64, h: int = 48) -> Image.Image:
    return Image.effect_noise((w, h), 60).convert("RGB")


# ---------------------------------------------------------------------- 1. huge integers
_hostile = st.one_of(
    st.integers(min_value=-(10**600), max_value=10**600),
    st.just(10**400),
    st.just(-(10**5000)),  # past Python's int -> str digit limit: it has no repr at all
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.lists(st.integers(min_value=-(10**500), max_value=10**500), max_size=5),
    st.booleans(),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(tool=st.sampled_from(sorted(REGISTRY)), value=_hostile, profile=st.sampled_from(list(Profile)))
def test_validate_call_never_raises_on_hostile_numbers(tool, value, profile):
    spec = REGISTRY[tool]
    args = {a.name: (value if a.type is not ArgType.ASSET else "img_1") for a in spec.args}
    chk = validate_call(tool, args, _Assets(), profile)
    chk.to_dict()
    chk.error_message()
    # and as a key, a name, the whole arguments object
    validate_call(value, args, _Assets(), profile)
    validate_call(tool, {str(value)[:10] if not isinstance(value, int) or abs(value) < 10**100 else "k": value}, _Assets(), profile)


def test_a_400_digit_angle_is_an_error_observation_in_an_episode():
    ep = Episode(LocalToolbox())
    ep.reset(Task("Turn it.", images=[_photo()]))
    reply = '<reason>turn</reason><tool_call>{"name": "Rotate", "arguments": {"image": "img_1", "angle": ' + "9" * 400 + "}}</tool_call>"
    res = ep.step(reply)
    assert res.turn.status == "error" and res.turn.error_code == "bad_choice"
    assert "Error:" in res.observation["content"][-1]["text"]
    # TRL hands call_tool Python objects: an int with no decimal repr must not raise either.
    res = ep.call_tool("Rotate", {"image": "img_1", "angle": 10**5000})
    assert res.turn.status == "error" and res.turn.error_code == "bad_choice"
    res = ep.call_tool("Crop", {"image": "img_1", "bbox": [10**400, 0, 5, 5]})
    assert res.turn.status == "error" and res.turn.error_code == "bbox_format"


# ---------------------------------------------------------------------- 5. SR memory
def test_offline_sr_runs_tiled():
    from toolserver.config import ToolsConfig

    for name in ("offline", "offline_plumbing"):
        tile = (ToolsConfig.load(name).backends["SR"].params or {}).get("tile", 0)
        assert tile >= 32, f"{name}: SR tile {tile} (0 = whole image at once, memory grows with the input)"


def test_sr_output_over_the_limit_is_refused_before_it_runs():
    ran = []

    def sr(req):  # stands in for the model: the point is that it is never reached
        ran.append(req)
        return ToolResult(True, "x")

    box = LocalToolbox(backends={"SR": sr}, max_output_pixels=1_000_000)
    img = Image.new("RGB", (300, 300))  # 90K pixels in, 1.44M out
    res = box.call(ToolRequest("SR", {"image": "img_1"}, {"image": img}))
    assert not res.ok and res.error_code == "output_too_large" and "before running" in res.text
    assert ran == []
    assert box.call(ToolRequest("SR", {"image": "img_1"}, {"image": Image.new("RGB", (250, 250))})).ok  # 1.0M out: fits
    # The served path checks it too (the batched SR path skips LocalToolbox.call).
    _, refusal = check_request(ToolRequest("SR", {"image": "img_1"}, {"image": img}), Limits(), 1_000_000)
    assert refusal is not None and refusal.error_code == "output_too_large"


@pytest.mark.parametrize("factory", ["realesrgan-ncnn", "realesrgan-torch"])
def test_untiled_sr_refuses_inputs_over_its_pixel_bound_before_loading(factory):
    from toolserver.backends import build_backend, sr

    backend = build_backend(factory, {"tile": 0, "max_untiled_pixels": 64 * 64})
    with pytest.raises(ToolError) as e:
        backend(ToolRequest("SR", {"image": "img_1"}, {"image": Image.new("RGB", (65, 64))}))
    assert e.value.code == "input_too_large"
    assert not backend._model.loaded  # refused before any weights were touched
    tiled = build_backend(factory, {"tile": 64, "max_untiled_pixels": 64 * 64})
    assert sr.check_untiled_input(Image.new("RGB", (500, 500)), tiled.params.tile, 64 * 64, "x") is None


def _transport(status: int, code: str, seen: list):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tools":
            return httpx.Response(200, json={"tools": [{"name": "SR", "timeout_s": 5}], "formats": ["application/json"]})
        seen.append(request)
        return httpx.Response(status, json=http_codec.error_json(code, "replica says no"))

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    "status,code,sends,result_code",
    [
        (503, "replica_died", 2, "replica_died"),  # died during the call: resent once, not 6 times
        (503, "replica_out_of_memory", 1, "replica_out_of_memory"),  # killed for memory: never resent
        (503, "replica_unavailable", 6, "toolserver_unavailable"),  # nothing ran: resent with backoff
        (400, "json_too_deep", 1, "json_too_deep"),  # the request's own fault: never resent
        (413, "too_many_pixels", 1, "too_many_pixels"),
        (500, "toolserver_error", 1, "toolserver_error"),  # the ingress's structured error: deterministic
    ],
)
def test_http_client_resends_only_what_can_succeed(status, code, sends, result_code):
    seen: list = []
    box = HttpToolbox("http://toolserver.test", retry=FAST, transport=_transport(status, code, seen), raw=False)
    res = box.call(ToolRequest("SR", {"image": "img_1"}, {"image": _photo(8, 8)}))
    assert not res.ok and res.error_code == result_code
    assert len(seen) == sends


def _died(message: str, never_started: bool = False):
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    return ActorDiedError(ActorDiedErrorContext(error_message=message, actor_id=bytes(16), never_started=never_started))


@pytest.mark.parametrize(
    "error,sends,code",
    [
        ("oom", 1, "replica_out_of_memory"),  # Ray's memory monitor killed it: never resent
        ("kill", 2, "replica_died"),  # died during the call (SIGKILL, a crash): resent once
        ("not_started", 6, "toolserver_unavailable"),  # the actor was already gone: nothing ran
        ("oom_task", 1, "replica_out_of_memory"),
    ],
)
def test_ray_client_bounds_resends_after_a_replica_died(error, sends, code):
    from ray.exceptions import OutOfMemoryError

    from toolserver.client import _with_retries

    make = {
        "oom": lambda: _died("Task was killed due to the node running low on memory."),
        "kill": lambda: _died("Worker unexpectedly exits with a connection error code 2. End of file."),
        "not_started": lambda: _died("The actor is dead.", never_started=True),
        "oom_task": lambda: OutOfMemoryError("Task was killed due to the node running low on memory."),
    }[error]
    calls = []

    def attempt():
        calls.append(1)
        return make()

    res = _with_retries(FAST, attempt, "SR")
    assert res.error_code == code and len(calls) == sends


# ---------------------------------------------------------------------- 6. long text, the replica's loop
def test_text_arguments_have_a_length_limit():
    long = "x" * (DEFAULT_MAX_TEXT_CHARS + 1)
    args = {"base_image": "img_1", "overlay_type": "text", "content": long}
    chk = validate_call("Overlayer", args, _Assets())
    assert not chk.executable and chk.first_error().code == "text_too_long"
    assert validate_call("Overlayer", {**args, "content": long[:-1]}, _Assets()).executable
    # The serving config's limit applies to served calls.
    req = ToolRequest("Overlayer", {**args, "content": "y" * 11}, {"base_image": _photo()})
    _, refusal = check_request(req, Limits(max_text_chars=10), 10**7)
    assert refusal is not None and refusal.error_code == "text_too_long"
    cfg = ServeConfig.from_dict({"limits": {"max_text_chars": 10}})
    assert cfg.limits.max_text_chars == 10
    with pytest.raises(ServeConfigError):
        ServeConfig.from_dict({"limits": {"max_text_chars": 0}})


def _replica(tools: list[str], max_pixels: int = 10**8, limits: dict | None = None):
    from toolserver.serve_app import ToolDeployment

    return ToolDeployment.func_or_class(tools, None, {}, 1, 0.01, max_pixels, None, limits)


def test_pure_tools_run_off_the_replica_event_loop_and_a_timeout_abandons_them():
    replica = _replica(["Rotate"])
    # Large enough that the call takes several times the 0.05 s timeout below on any machine here.
    slow = WireRequest.pack(ToolRequest("Rotate", {"image": "img_1", "angle": 45}, {"image": _photo(2000, 2000)}))

    async def scenario():
        gaps, stop = [], asyncio.Event()

        async def heartbeat():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.03)  # the heartbeat is running (mid-sleep) when the call starts
        t0 = time.perf_counter()
        out = await replica(slow)
        took = time.perf_counter() - t0
        # A caller that gives up (the ingress's per-tool timeout) is answered at its deadline,
        # not when the tool finishes.
        t1 = time.perf_counter()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(replica(slow), timeout=0.05)
        gave_up = time.perf_counter() - t1
        stop.set()
        await beat
        return out, took, max(gaps), gave_up

    out, took, worst_gap, gave_up = asyncio.run(scenario())
    assert out.unpack().ok
    assert took > 0.2, f"the call ({took:.3f} s) is too fast to show anything on this machine"
    assert worst_gap < took / 2, f"the event loop stalled {worst_gap:.3f} s during a {took:.3f} s call"
    assert gave_up < 0.05 + (took - 0.05) / 2, f"a 0.05 s timeout returned after {gave_up:.3f} s of a {took:.3f} s call"
    replica.pool.shutdown(wait=True)


# ---------------------------------------------------------------------- 7. served calls are validated
@pytest.mark.parametrize(
    "tool,args,code",
    [
        ("Rotate", {"image": "img_1", "angle": 7}, "bad_choice"),
        ("Crop", {"image": "img_1", "bbox": [-1e9, -1e9, 1e9, 1e9]}, "number_too_large"),
        ("Crop", {"image": "img_1", "bbox": "[1, 2]"}, "bbox_format"),
        ("Extract", {"image": "img_1", "mask": "m"}, "unknown_asset"),  # no mask image sent with it
    ],
)
def test_a_replica_validates_every_request_like_the_episode_runner(tool, args, code):
    replica = _replica([tool])
    out = asyncio.run(replica(WireRequest.pack(ToolRequest(tool, args, {"image": _photo()})))).unpack()
    assert not out.ok and out.error_code == code, out.text
    assert check_request(ToolRequest(tool, args, {"image": _photo()}), Limits(), 10**8)[1].error_code == code


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**500), max_value=10**500) | st.floats() | st.text(max_size=30),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=30,
)


@settings(max_examples=120, deadline=None)
@given(tool=st.sampled_from(sorted(REGISTRY) + ["Nope"]), args=st.dictionaries(st.text(max_size=12), _json_values, max_size=5), with_image=st.booleans())
def test_check_request_refuses_or_normalises_any_arguments(tool, args, with_image):
    spec = REGISTRY.get(tool)
    images = {a.name: _photo(8, 8) for a in (spec.args if spec else ()) if a.type is ArgType.ASSET} if with_image else {}
    checked, refusal = check_request(ToolRequest(tool, args, images), Limits(), 10**6)
    assert (checked is None) != (refusal is None)
    if refusal is not None:
        assert not refusal.ok and refusal.error_code
    else:  # normalised arguments pass again, unchanged: the replica re-checks what the ingress passed
        again, second = check_request(checked, Limits(), 10**6)
        assert second is None and again.args == checked.args


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.binary(max_size=200), _json_values.map(lambda v: json.dumps({"args": v, "images": {}}).encode())))
def test_the_http_parser_answers_any_body_with_a_request_or_a_bad_request(body):
    from toolserver.serve_app import _parse_request

    for ctype in (http_codec.JSON_CONTENT_TYPE, http_codec.RAW_CONTENT_TYPE):
        try:
            _parse_request("Crop", body, 10**6, ctype)
        except BadRequest as e:
            assert e.code in ("bad_request", "bad_image", "json_too_deep", "too_many_pixels")


def test_a_served_request_is_normalised_before_its_tool_runs():
    # A bbox string is parsed by the validator, as in-process; the tool never sees the string.
    replica = _replica(["Crop"])
    req = ToolRequest("Crop", {"image": "img_1", "bbox": "[0, 0, 500, 500]"}, {"image": _photo(64, 48)})
    out = asyncio.run(replica(WireRequest.pack(req))).unpack()
    assert out.ok and out.image.size == (32, 24)


# ---------------------------------------------------------------------- 8. deep and huge JSON
@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_json_is_a_structured_400(depth):
    from toolserver.serve_app import _parse_request

    body = ('{"args": {"bbox": ' + "[" * depth + "]" * depth + "}}").encode()
    with pytest.raises(BadRequest) as e:
        _parse_request("Crop", body, 10**7)
    assert e.value.code == "json_too_deep"
    header = b'{"args": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    with pytest.raises(BadRequest) as e:
        http_codec.request_from_raw("Crop", len(header).to_bytes(4, "big") + header, 10**7)
    assert e.value.code == "json_too_deep"
    with pytest.raises(BadRequest) as e:
        _parse_request("Crop", b'{"args": {"n": ' + b"9" * 5000 + b"}}", 10**7)  # past the int digit limit
    assert e.value.code == "bad_request"


@settings(max_examples=50, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(max_size=3), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=40))
def test_json_depth_matches_a_recursive_count(doc):
    def depth(x):
        if isinstance(x, dict):
            return 1 + max((depth(v) for v in x.values()), default=0)
        if isinstance(x, list):
            return 1 + max((depth(v) for v in x), default=0)
        return 0

    d = depth(doc)
    assert json_depth_exceeds(doc, d) is False
    if d > 1:
        assert json_depth_exceeds(doc, d - 1) is True


# ---------------------------------------------------------------------- 10. thin and tall images
def _thin_png(width: int, height: int) -> bytes:
    """A real PNG of `width` x `height` black pixels (mode L), streamed through zlib."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z, row, parts = zlib.compressobj(9), bytes(1 + width), []
    block = row * 100_000
    for _ in range(height // 100_000):
        parts.append(z.compress(block))
    parts.append(z.compress(row * (height % 100_000)))
    parts.append(z.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def test_a_one_pixel_wide_image_counts_its_rows():
    png = _thin_png(1, 39_999_999)
    assert len(png) < 200_000  # a small upload...
    t0 = time.perf_counter()
    with pytest.raises(BadRequest) as e:
        http_codec.decode_image(base64.b64encode(png).decode(), 40_000_000, "image", Limits().row_overhead_pixels)
    assert e.value.code == "too_many_pixels"
    assert time.perf_counter() - t0 < 2.0  # ...refused from its header, before decoding
    body = {"args": {"image": "img_1"}, "images": {"image": base64.b64encode(png).decode()}}
    with pytest.raises(BadRequest) as e:
        http_codec.request_from_json("Flip", body, 40_000_000, Limits())
    assert e.value.code == "too_many_pixels"
    header = b'{"images": {"image": {"mode": "L", "size": [1, 39999999], "offset": 0, "length": 39999999}}}'
    with pytest.raises(BadRequest) as e:
        http_codec.request_from_raw("Flip", len(header).to_bytes(4, "big") + header, 40_000_000, Limits())
    assert e.value.code == "too_many_pixels"
    # A square image of the same pixel count still fits.
    assert pixel_cost(6000, 6000) <= 40_000_000


# ---------------------------------------------------------------------- 11. lazy backends race
_BUILDS: list[int] = []


def _counting_backend(**_params):
    """A backend whose construction is slow (as loading weights is) and counted."""
    _BUILDS.append(1)
    time.sleep(0.2)
    return lambda req: ToolResult(True, "ok")


def test_concurrent_first_calls_build_one_backend(monkeypatch):
    from toolserver.config import BackendConfig, ToolsConfig

    monkeypatch.setitem(BACKEND_FACTORIES, "counting-test", f"{__name__}:_counting_backend")
    _BUILDS.clear()
    box = LocalToolbox.from_config(ToolsConfig(backends={"OCR": BackendConfig(name="counting-test")}))
    start = threading.Barrier(8)
    results: list[ToolResult] = []

    def first_call():
        start.wait()
        results.append(box.call(ToolRequest("OCR", {"image": "img_1"}, {"image": _photo(8, 8)})))

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.ok for r in results)
    assert len(_BUILDS) == 1


# ---------------------------------------------------------------------- 13. auth edges
def test_docs_and_openapi_are_not_served():
    from fastapi.testclient import TestClient

    from toolserver.serve_app import api

    client = TestClient(api)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404, path


def test_bearer_scheme_is_case_insensitive():
    from toolserver.serve_app import authorized, token_digest

    d = token_digest("a-token-of-enough-length")
    for header in ("Bearer a-token-of-enough-length", "bearer a-token-of-enough-length", "BEARER  a-token-of-enough-length "):
        assert authorized(header, d), header
    for header in ("bearer", "Bearer ", "Basic a-token-of-enough-length", "a-token-of-enough-length", "bearer wrong"):
        assert not authorized(header, d), header


def test_short_tokens_are_refused_at_startup(monkeypatch, capsys):
    from toolserver.cli import main
    from toolserver.serve_app import build_app

    with pytest.raises(ServeConfigError, match="at least 16"):
        check_bind(HttpConfig(), "short")
    with pytest.raises(ServeConfigError, match="at least 16"):
        build_app(ServeConfig.load("local_cpu"), "short")
    monkeypatch.setenv("CANVASAGENT_TOOLSERVER_TOKEN", "short")
    assert main(["serve", "--config", "local_cpu", "--dry-run"]) == 1
    assert "at least 16" in capsys.readouterr().out
    check_bind(HttpConfig(), "x" * 16)


def test_a_local_serve_starts_no_dashboard_and_warns_when_ray_auth_is_off():
    from toolserver.cli import local_ray_options, ray_exposure_warning

    cfg = ServeConfig.load("local_cpu")
    assert local_ray_options(cfg, address=None)["include_dashboard"] is False
    assert local_ray_options(cfg, address="auto") == {}  # an existing cluster decides for itself
    assert ray_exposure_warning(None, {}) is None  # Ray's token auth guards its ports by default
    assert "all interfaces" in ray_exposure_warning(None, {"RAY_AUTH_MODE": "disabled"})
    assert ray_exposure_warning("auto", {"RAY_AUTH_MODE": "disabled"}) is None
