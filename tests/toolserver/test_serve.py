"""The tool server on a real (CPU) Ray Serve: one app for the whole module, every tool through
the handle and over HTTP, replica death mid-stream, auth and size limits at the HTTP edge.

Public-interface auth (a non-loopback bind) is unit-tested in test_serve_config.py: tests here
only ever bind 127.0.0.1.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import threading
import time

import numpy as np
import pytest
from PIL import Image, ImageDraw

from toolserver.fonts import dejavu_sans
from toolserver.registry import REGISTRY, ArgType, Backend, OutputKind
from toolserver.request import ToolRequest
from toolserver.serve_config import ServeConfig, node_resources, servable_tools, tool_gpu_device
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

# ray[serve] and httpx are declared dependencies: missing, they are an error, not a silent skip.
import httpx  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

pytestmark = pytest.mark.ray

TOKEN = "test-token-not-secret"
MAX_PIXELS = 1_000_000
MAX_BYTES = 2 * 1024 * 1024
PROBE = "toolserver.serve_probe:batch_probe"
PROBE_TIMEOUT_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """The offline app, with a token (enforced on loopback too) and small limits to test."""
    from toolserver.serve_app import deploy

    cfg = ServeConfig.load("local_cpu")
    cfg.http.port = _free_port()
    cfg.http.max_request_bytes = MAX_BYTES
    cfg.max_pixels = MAX_PIXELS
    # Grounding has no offline weights; the probe backend (plumbing only) exercises @serve.batch.
    probe = cfg.tools["Grounding"]
    probe.backend, probe.params = PROBE, {"delay_s": 0.05}
    probe.max_batch_size, probe.batch_wait_timeout_s = 4, 0.2
    probe.timeout_s = PROBE_TIMEOUT_S
    # Slots placement on a CPU machine: the probe is planned on tool GPU 1, so its replica takes
    # a share of the node resource toolgpu1 (no Ray GPU) and selects that device itself.
    cfg.placement, cfg.num_gpus = "slots", 2
    probe.gpu, probe.ray_actor_options = 1, {**probe.ray_actor_options, "num_gpus": 0.2}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, resources=node_resources(cfg))
    try:
        deploy(cfg, TOKEN)
        yield cfg
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def url(served) -> str:
    return f"http://127.0.0.1:{served.http.port}"


@pytest.fixture(scope="module")
def ray_box(served):
    from toolserver.client import RayToolbox

    box = RayToolbox(app_name=served.app_name)
    yield box
    box.close()


@pytest.fixture(scope="module")
def http_box(url):
    from toolserver.client import HttpToolbox

    box = HttpToolbox(url, token=TOKEN)  # prefers raw frames, which this server lists
    yield box
    box.close()


@pytest.fixture(scope="module")
def json_box(url):
    from toolserver.client import HttpToolbox

    box = HttpToolbox(url, token=TOKEN, raw=False)  # the public base64 PNG format
    yield box
    box.close()


# ---------------------------------------------------------------------- requests built from the registry
def _photo(w: int = 32, h: int = 24) -> Image.Image:
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 255) // w, (y * 255) // h, 128) for y in range(h) for x in range(w)])
    return img


def _mask(size: tuple[int, int]) -> Image.Image:
    m = Image.new("L", size, 0)
    ImageDraw.Draw(m).rectangle([size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2], fill=255)
    return m


def _sr_pair() -> tuple[Image.Image, Image.Image]:
    """A 256x128 drawing and its 4x bicubic reduction, the SR input."""
    hi = Image.new("RGB", (256, 128), "white")
    d = ImageDraw.Draw(hi)
    d.ellipse([10, 10, 110, 110], fill=(200, 40, 40))
    d.rectangle([130, 20, 240, 60], fill=(30, 90, 200))
    d.text((130, 70), "SR 4x", font=dejavu_sans(36), fill="black")
    return hi, hi.resize((64, 32), Image.Resampling.BICUBIC)


def _psnr(a: Image.Image, b: Image.Image) -> float:
    err = np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2)
    return float(10 * np.log10(255**2 / err))


def _text_image() -> Image.Image:
    img = Image.new("RGB", (360, 90), "white")
    ImageDraw.Draw(img).text((20, 15), "HELLO 42", font=dejavu_sans(48), fill="black")
    return img


def sample_request(tool: str) -> ToolRequest:
    """A valid call for any registry tool, derived from its argument specs."""
    spec = REGISTRY[tool]
    base = _text_image() if tool == "OCR" else _sr_pair()[1] if tool == "SR" else _photo()
    args, images = {}, {}
    for a in spec.args:
        if a.type is ArgType.ASSET:
            args[a.name] = f"{a.name}_0"
            images[a.name] = _mask(base.size) if OutputKind.MASK in a.asset_kinds else base
        elif a.type is ArgType.BBOX:
            args[a.name] = [100.0, 100.0, 700.0, 800.0]
        elif a.type is ArgType.POSITION:
            args[a.name] = [500.0, 500.0]
        elif a.type is ArgType.CHOICE:
            args[a.name] = a.choices[0]
        elif a.type is ArgType.TEXT:
            args[a.name] = "Hi" if tool == "Overlayer" else "a red apple"
    return ToolRequest(tool, args, images, dict(args), Profile.CANVASCRAFT)


def _png_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


# ---------------------------------------------------------------------- tests
def test_health_and_tool_listing_come_from_the_registry(url):
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    listed = httpx.get(f"{url}/v1/tools", headers=_auth()).json()["tools"]
    assert [t["name"] for t in listed] == [t.name for t in servable_tools()]
    assert all(t["schema"] == REGISTRY[t["name"]].openai_schema() for t in listed)


@pytest.mark.parametrize("tool", [t.name for t in servable_tools()])
def test_every_tool_through_handle_and_http(tool, served, ray_box, http_box, json_box):
    req = sample_request(tool)
    spec = REGISTRY[tool]
    # The public JSON/PNG format on the cheap tools only: the model tools' time goes to the model.
    boxes = (ray_box, http_box, json_box) if spec.backend is Backend.PURE else (ray_box, http_box)
    for res in (box.call(req) for box in boxes):
        if spec.backend is Backend.PURE:
            want = LocalToolbox().call(sample_request(tool))
            assert res.ok, res.text
            assert (res.text, res.kind, res.data) == (want.text, want.kind, want.data)
            assert res.image.mode == want.image.mode and res.image.tobytes() == want.image.tobytes()
        elif tool == "OCR":
            assert res.ok, res.text
            assert "HELLO" in res.text.upper() and "42" in res.text
        elif tool == "SR":  # real x4plus weights: 4x the size and closer to the original than bicubic
            assert res.ok, res.text
            hi, lo = _sr_pair()
            assert res.image.size == hi.size
            assert _psnr(res.image, hi) > _psnr(lo.resize(hi.size, Image.Resampling.BICUBIC), hi) + 1.0
        elif served.tools[tool].backend == PROBE:
            assert res.ok and res.plumbing_only and res.backend == "probe", res
        else:  # no offline weights: a clear failure, never a fake image
            assert not res.ok and res.error_code == "backend_not_configured", res
            assert tool in res.text and res.image is None


def test_dynamic_batching_groups_concurrent_calls(ray_box, http_box):
    from concurrent.futures import ThreadPoolExecutor

    def call(i: int):
        req = sample_request("Grounding")
        req.args["reference_text"] = f"object {i}"
        return i, (ray_box if i % 2 else http_box).call(req)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert all(r.ok and r.plumbing_only for _, r in results)
    # Each caller gets its own answer back, whatever batch it rode in.
    assert all(r.data["args"]["reference_text"] == f"object {i}" for i, r in results)
    assert max(r.data["batch_size"] for _, r in results) > 1


def test_per_tool_timeouts_become_failed_results(ray_box, http_box, url):
    """The probe holds a call 2.5 s; Grounding's timeout is 1 s, on both paths."""
    from concurrent.futures import ThreadPoolExecutor

    slow = sample_request("Grounding")
    slow.args["reference_text"] = "probe-sleep:2.5"
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda box: box.call(slow), (ray_box, http_box)))
    assert all(not r.ok and r.error_code == "timeout" for r in results), results
    assert time.monotonic() - t0 < 2.3  # neither path waited for the tool, nor retried
    body = {"args": slow.args, "images": {"image": _png_b64(slow.images["image"])}}
    r = httpx.post(f"{url}/v1/tools/Grounding", json=body, headers=_auth(), timeout=10)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"


def test_an_episode_runs_over_the_remote_toolbox(http_box, ray_box):
    """The runner's own loop: a tool failure is an error observation, never an exception."""
    from canvasagent.core.episode import EpisodeConfig, run_episode
    from canvasagent.core.policies.replay import ScriptedPolicy
    from canvasagent.core.protocol import format_reply
    from canvasagent.core.tasks import Task

    script = [
        format_reply("mirror it", {"name": "Flip", "arguments": {"image": "img_1"}}),
        format_reply("segment", {"name": "SAM", "arguments": {"image": "Flip_0", "bbox": "[0, 0, 500, 500]"}}),
        format_reply("done", None, terminate=True),
    ]
    for box in (http_box, ray_box):
        policy = ScriptedPolicy(lambda messages, ep, it=iter(list(script)): next(it))
        traj = run_episode(policy, Task("mirror then segment", [_photo()]), box, EpisodeConfig(max_turns=4))
        statuses = [(t.status, t.error_code) for t in traj.turns]
        assert statuses[:2] == [("ok", None), ("error", "backend_not_configured")], statuses
        assert traj.final_asset() is not None


def test_make_toolbox_builds_remote_clients(served, url, monkeypatch):
    from toolserver.client import HttpToolbox, RayToolbox, make_toolbox
    from toolserver.config import ToolsConfig

    monkeypatch.setenv("CANVASAGENT_TOOLSERVER_TOKEN", TOKEN)
    for client, cls in (("http", HttpToolbox), ("ray", RayToolbox)):
        box = make_toolbox(ToolsConfig(client=client, url=url if client == "http" else None))
        try:
            assert isinstance(box, cls)
            assert box.call(sample_request("Flip")).ok
        finally:
            box.close()


def test_auth_is_enforced(url):
    body = {"args": {"image": "img_1"}, "images": {"image": _png_b64(_photo())}}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        r = httpx.post(f"{url}/v1/tools/Flip", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"{url}/v1/tools").status_code == 401
    assert httpx.post(f"{url}/v1/tools/Flip", json=body, headers=_auth()).json()["ok"] is True


def test_oversized_and_malformed_inputs_are_rejected(url, http_box, ray_box):
    # Over the byte limit, whether or not the client declares a length.
    big = b'{"args": {}, "pad": "' + b"x" * (MAX_BYTES + 10) + b'"}'
    r = httpx.post(f"{url}/v1/tools/Flip", content=big, headers=_auth())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(f"{url}/v1/tools/Flip", content=iter([big[:1000], big[1000:]]), headers=_auth())
    assert r.status_code == 413

    # Over the pixel limit: a tiny PNG that decodes to 1.2 MP is refused before decoding.
    huge = ToolRequest("Flip", {"image": "img_1"}, {"image": Image.new("L", (1200, 1000))})
    r = httpx.post(f"{url}/v1/tools/Flip", json={"args": huge.args, "images": {"image": _png_b64(huge.images["image"])}}, headers=_auth())
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_pixels"
    for box in (http_box, ray_box):  # clients turn it into a failed result, never an exception
        res = box.call(huge)
        assert not res.ok and res.error_code == "too_many_pixels", res

    bad = [
        ("/v1/tools/Flip", b"not json", 400, "bad_request"),
        ("/v1/tools/Flip", b"\xff\xfe{", 400, "bad_request"),
        ("/v1/tools/Flip", json.dumps({"args": {}, "images": {"image": "%%%"}}).encode(), 400, "bad_image"),
        ("/v1/tools/Flip", json.dumps({"args": {}, "images": {"image": base64.b64encode(b"GIF89a").decode()}}).encode(), 400, "bad_image"),
        ("/v1/tools/NoSuchTool", b"{}", 404, "unknown_tool"),
    ]
    for path, content, status, code in bad:
        r = httpx.post(f"{url}{path}", content=content, headers=_auth())
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    # A tool-level failure is a result (HTTP 200), not an HTTP error.
    res = http_box.call(ToolRequest("Crop", {"image": "img_1", "bbox": [10.0, 10.0, 11.0, 11.0]}, {"image": _photo(8, 8)}))
    assert not res.ok and res.error_code == "empty_crop"


def test_served_calls_are_validated_and_bounded_like_in_process_ones(url, http_box, json_box, ray_box):
    """Rotate by 7 degrees, a ±1e9 bbox and over-long text are refused through every client,
    as the episode runner refuses them in-process; deep JSON is a structured 400."""
    photo = _photo()
    refused = [
        (ToolRequest("Rotate", {"image": "img_1", "angle": 7}, {"image": photo}), "bad_choice"),
        (ToolRequest("Crop", {"image": "img_1", "bbox": [-1e9, -1e9, 1e9, 1e9]}, {"image": photo}), "number_too_large"),
        (ToolRequest("Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "x" * 5000}, {"base_image": photo}), "text_too_long"),
    ]
    for req, code in refused:
        for box in (http_box, json_box, ray_box):
            res = box.call(req)
            assert not res.ok and res.error_code == code, (type(box).__name__, req.tool, res.text)
    r = httpx.post(f"{url}/v1/tools/Rotate", json={"args": {"image": "img_1", "angle": 7}, "images": {"image": _png_b64(photo)}}, headers=_auth())
    assert r.status_code == 200 and r.json()["error_code"] == "bad_choice"
    deep = b'{"args": {"bbox": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"
    r = httpx.post(f"{url}/v1/tools/Crop", content=deep, headers=_auth())
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"
    # The scheme is case-insensitive; the API docs are not served at all, token or not.
    lower = {"authorization": f"bearer {TOKEN}"}
    assert httpx.get(f"{url}/v1/tools", headers=lower).status_code == 200
    for path in ("/docs", "/openapi.json"):
        assert httpx.get(f"{url}{path}").status_code == 404
        assert httpx.get(f"{url}{path}", headers=_auth()).status_code == 404


def test_calls_survive_a_replica_killed_mid_stream(served, ray_box, http_box):
    """Kill one of the two PureTools replicas while two clients stream calls."""
    req = sample_request("Flip")
    prefix = f"SERVE_REPLICA::{served.app_name}#PureTools#"
    replicas = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    assert len(replicas) == 2, replicas

    results: list[tuple[float, bool, str]] = []
    stop = threading.Event()

    def stream(box) -> None:
        while not stop.is_set():
            r = box.call(req)
            results.append((time.monotonic(), r.ok, r.text))

    threads = [threading.Thread(target=stream, args=(b,)) for b in (ray_box, http_box)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    killed_at = time.monotonic()
    ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(timeout=30)

    failures = [text for _, ok, text in results if not ok]
    assert not failures, failures[:3]
    assert sum(1 for ts, _, _ in results if ts > killed_at + 0.5) >= 10, "calls stopped after the kill"


def test_raw_frames_at_the_http_edge(url, http_box, json_box, ray_box):
    from toolserver import http_codec

    assert http_box._raw and not json_box._raw  # negotiated from the server's listing
    shm_before = _shm_files()
    big = Image.effect_noise((400, 300), 60).convert("RGB")  # over the shm threshold inside Ray
    req = ToolRequest("Flip", {"image": "img_1"}, {"image": big})
    want = big.transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes()
    for box in (http_box, json_box, ray_box):
        res = box.call(req)
        assert res.ok and res.image.tobytes() == want, res
    raw = http_codec.request_to_raw(req)
    headers = {**_auth(), "content-type": http_codec.RAW_CONTENT_TYPE}
    r = httpx.post(f"{url}/v1/tools/Flip", content=raw, headers=headers)  # raw in, JSON out: no Accept
    assert r.status_code == 200 and decode_image_b64(r.json()["image"]).tobytes() == want
    r = httpx.post(f"{url}/v1/tools/Flip", content=raw, headers={**headers, "accept": http_codec.RAW_CONTENT_TYPE})
    assert r.headers["content-type"] == http_codec.RAW_CONTENT_TYPE
    assert http_codec.result_from_raw(r.content, MAX_PIXELS).image.tobytes() == want
    # Raw bodies get the same limits and structured errors as JSON ones.
    huge = {"images": {"image": {"mode": "L", "size": [1200, 1000], "offset": 0, "length": 1_200_000}}}
    head = json.dumps(huge).encode()
    r = httpx.post(f"{url}/v1/tools/Flip", content=len(head).to_bytes(4, "big") + head, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_pixels"
    r = httpx.post(f"{url}/v1/tools/Flip", content=raw[:-1], headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_image"
    assert _shm_files() == shm_before  # every shm file written on the way was removed


def _shm_files() -> set[str]:
    """Slot files on this host, less those of dead owners: any new pool (another test run's,
    say) may sweep those at any moment."""
    from toolserver.wire import _SHM_OWNED, SHM_DIR, SHM_PREFIX, _start_time

    def dead(name: str) -> bool:
        m = _SHM_OWNED.fullmatch(name)
        return m is not None and _start_time(m["pid"]) != int(m["start"])

    return {p.name for p in SHM_DIR.glob(SHM_PREFIX + "*") if not dead(p.name)}


def decode_image_b64(data: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_canvascraft_ray_build_against_the_served_toolbox(served, tmp_path):
    """`build-sft --ray` against the Ray Serve toolbox: every kept row replays in-process to its image."""
    from canvasagent.core.imageio import images_equal
    from canvasagent.replay import from_trajectory, replay
    from canvascraft import formats
    from canvascraft.build import load_build_config, run_build, shard_files
    from toolserver.client import make_toolbox

    remote = tmp_path / "remote_ray.yaml"
    remote.write_text(f"profile: canvascraft\nclient: ray\nurl: auto\nray_app: {served.app_name}\n")
    cfg = load_build_config("sft", n=4, shard_size=2, workers=1, tools_config=str(remote), seed=11)
    run_build("sft", cfg, tmp_path / "ray", use_ray=True, progress=False)
    rows = formats.read_rows(shard_files(tmp_path / "ray"))
    assert len(rows) == 4
    # Chains the served app has no backend for (Gen/Edit/Grounding/SAM here) are never drawn.
    assert not {"ImageGeneration", "ImageEdit", "Grounding", "SAM"} & {t for r in rows for t in r["tools"]}
    for row in rows:
        traj = formats.trajectory_of(row)
        again, report = replay(from_trajectory(traj), make_toolbox("offline"))
        assert report["summary"]["errors"] == 0
        if traj.final_asset() is not None:
            assert images_equal(again.final_asset().image, traj.final_asset().image)


def test_slots_placement_puts_the_replica_on_its_planned_gpu(served):
    described = serve.get_app_handle(served.app_name).describe.remote().result(timeout_s=60)
    # The node's visible devices are this process's (Ray leaves them alone without Ray GPUs).
    assert described["Grounding"]["cuda_visible_devices"] == tool_gpu_device(1, os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert described["OCR"]["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # a CPU tool: untouched
    # Ray holds the replica's fraction of its GPU's resource for the replica's lifetime.
    assert ray.cluster_resources()["toolgpu1"] == 1.0
    assert ray.available_resources().get("toolgpu1") == pytest.approx(0.8)
    assert ray.available_resources().get("toolgpu0") == pytest.approx(1.0)


def test_a_killed_ingress_leaves_slots_that_its_successor_sweeps(served, http_box):
    """`ray.kill` gives the ingress no cleanup (like SIGKILL or the OOM killer): its slot files
    stay until Serve's replacement makes its pool, which sweeps the files of dead owners."""
    from toolserver.serve_app import INGRESS_NAME
    from toolserver.wire import _SHM_OWNED, SHM_DIR, SHM_PREFIX

    prefix = f"SERVE_REPLICA::{served.app_name}#{INGRESS_NAME}#"
    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    ingress = ray.get_actor(name, namespace="serve")
    pid = ray.get(ingress.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    big = Image.effect_noise((400, 300), 60).convert("RGB")  # over the shm threshold inside Ray
    assert http_box.call(ToolRequest("Flip", {"image": "img_1"}, {"image": big})).ok
    owned = [p for p in SHM_DIR.glob(SHM_PREFIX + "*") if (m := _SHM_OWNED.fullmatch(p.name)) and int(m["pid"]) == pid]
    assert owned, "the ingress made no slots"

    ray.kill(ingress, no_restart=True)
    deadline = time.monotonic() + 120
    while any(p.exists() for p in owned) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(p.exists() for p in owned)
    (new,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    assert new != name
    # The successor serves (its own fresh slots).
    while time.monotonic() < deadline:
        if http_box.call(ToolRequest("Flip", {"image": "img_1"}, {"image": big})).ok:
            break
        time.sleep(0.5)
    else:
        pytest.fail("no ingress answered after the kill")
