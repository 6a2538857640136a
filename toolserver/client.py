"""The toolbox a tools config asks for (`make_toolbox`): in-process, or the same `Toolbox`
interface over a Ray Serve handle or HTTP. The remote clients retry when a replica dies or the
server is briefly unreachable, and turn every other problem into a failed `ToolResult`, never
an exception.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from toolserver.config import ToolsConfig
from toolserver.limits import DEFAULT_ROW_OVERHEAD_PIXELS, input_pixels_refusal
from toolserver.registry import REGISTRY
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.serve_config import DEFAULT_APP_NAME, DEFAULT_MAX_PIXELS, DEFAULT_TOKEN_ENV, unconfigured_result
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

log = logging.getLogger(__name__)

DEFAULT_HTTP_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 120.0


@dataclass
class RetryPolicy:
    """When a call is sent again.

    - `attempts`: tries in all while no replica took the call (none up, the server unreachable);
    - `died_attempts`: tries in all while the replica died *during* the call. The input may be
      what killed it and each resend costs a replica restart, so the default resends once;
    - a replica Ray reports as killed for memory is never resent (`replica_out_of_memory`).
    """

    attempts: int = 6
    died_attempts: int = 2
    backoff_s: float = 0.1  # doubled after each failure...
    max_backoff_s: float = 2.0  # ...up to this; six attempts cover a replica restart (~5 s)

    def delays(self) -> Iterator[float]:
        d = self.backoff_s
        for _ in range(self.attempts - 1):
            yield d
            d = min(d * 2, self.max_backoff_s)


class ReplicaDied(RuntimeError):
    """The replica died while it ran the call (HTTP 503 `replica_died`)."""


class ReplicaOutOfMemory(RuntimeError):
    """The replica was killed for memory while it ran the call (HTTP 503 `replica_out_of_memory`)."""


def _ray_says(exc: Exception, local: type[Exception], predicate: str) -> bool:
    """Whether `exc` is the HTTP client's `local` error or a Ray error `serve_app.<predicate>` accepts."""
    if isinstance(exc, local):
        return True
    if not type(exc).__module__.startswith("ray."):  # an HTTP client may run without Ray installed
        return False
    from toolserver import serve_app

    return getattr(serve_app, predicate)(exc)


def _with_retries(policy: RetryPolicy, attempt: Callable[[], ToolResult | Exception], tool: str) -> ToolResult:
    """Run `attempt` until it returns a result; an Exception return means "maybe retry"
    (see RetryPolicy for which are resent and how often)."""
    delays = policy.delays()
    died = 0
    while True:
        out = attempt()
        if isinstance(out, ToolResult):
            return out
        why = f"{type(out).__name__}: {str(out)[:300]}"
        if _ray_says(out, ReplicaOutOfMemory, "out_of_memory"):
            return ToolResult.failure("replica_out_of_memory", f"{tool}: the replica ran out of memory on this call; not resent ({why})")
        if _ray_says(out, ReplicaDied, "died_mid_call"):
            died += 1
            if died >= policy.died_attempts:
                return ToolResult.failure(
                    "replica_died",
                    f"{tool}: the replica died during this call {died} time(s); not resent again, since the input may be what kills it ({why})",
                )
        delay = next(delays, None)
        if delay is None:
            return ToolResult.failure("toolserver_unavailable", f"{tool}: the tool server did not answer after {policy.attempts} attempts ({why})")
        log.warning("%s: retrying in %.2f s after %s", tool, delay, why[:200])
        time.sleep(delay)


def _timed_call(kind: str, request: ToolRequest, call: Callable[[], ToolResult]) -> ToolResult:
    """`call()` with its wall time in `elapsed_s`; a client bug becomes a failed result, since it
    must not end a rollout either."""
    t0 = time.perf_counter()
    try:
        result = call()
    except Exception as e:
        log.exception("%s toolbox failed on %s", kind, request.tool)
        result = ToolResult.failure("toolserver_error", f"{request.tool}: {type(e).__name__}: {str(e)[:300]}")
    result.elapsed_s = time.perf_counter() - t0
    return result


def _not_served(tool: str) -> ToolResult:
    if tool in REGISTRY:
        return ToolResult.failure("not_served", f"{tool} is not served by this tool server")
    return ToolResult.failure("unknown_tool", f"unknown tool {tool!r:.60}")


class RayToolbox:
    """Calls tool deployments directly through Serve handles (no HTTP, no PNG): images travel
    through /dev/shm to replicas on this host, as numpy arrays to others (`toolserver.wire`)."""

    def __init__(
        self,
        app_name: str = DEFAULT_APP_NAME,
        address: str | None = None,
        profile: Profile = Profile.CANVASCRAFT,
        retry: RetryPolicy | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        shm: bool | None = None,
    ):
        """`shm`: pass images through /dev/shm when the replica shares this host (default: when
        /dev/shm is usable; a replica elsewhere turns it off for its deployment)."""
        import ray
        from ray import serve

        from toolserver.serve_app import RETRYABLE
        from toolserver.wire import ShmPool, keep_pillow_blocks, shm_available

        # Each result image is fresh Pillow memory here; reusing freed blocks saves the page
        # faults (1.6 vs 0.4 ms to unpack a 1024^2 result). PILLOW_BLOCKS_MAX overrides it.
        keep_pillow_blocks()
        self.profile = profile
        self.retry = retry or RetryPolicy()
        self._retryable = RETRYABLE
        use_shm = shm_available() if shm is None else shm
        self.shm = ShmPool() if use_shm else None
        self._shm_off: set[str] = set()
        if not ray.is_initialized():
            # "auto" joins the cluster on this node that `toolserver serve` / `ray start` made.
            ray.init(address=address or "auto", log_to_driver=False)
        ingress = serve.get_app_handle(app_name)
        manifest = ingress.manifest.remote().result(timeout_s=60)
        self.manifest: dict[str, dict[str, Any]] = manifest["tools"]
        by_name = {info["deployment"] for info in self.manifest.values() if info["deployment"]}
        handles = {name: serve.get_deployment_handle(name, app_name) for name in by_name}
        self.handles = {tool: handles[info["deployment"]] for tool, info in self.manifest.items() if info["deployment"]}
        # Tools the served app can run, under the same name LocalToolbox uses, so callers such as
        # the CanvasCraft builder can skip chains the server has no backend for.
        self.backends = {tool: info["mode"] for tool, info in self.manifest.items() if info["mode"] != "unconfigured"}
        self.max_pixels = min(max_pixels, int(manifest["max_pixels"]))
        self.row_overhead_pixels = int(manifest.get("row_overhead_pixels", DEFAULT_ROW_OVERHEAD_PIXELS))
        # Caller-mode pure tools run here, exactly as in-process.
        self.local = LocalToolbox(profile=profile, max_output_pixels=self.max_pixels)

    def call(self, request: ToolRequest) -> ToolResult:
        return _timed_call("ray", request, lambda: self._call(request))

    def _call(self, request: ToolRequest) -> ToolResult:
        from toolserver.wire import SHM_UNAVAILABLE, WireRequest

        info = self.manifest.get(request.tool)
        if info is None:
            return _not_served(request.tool)
        if info["mode"] == "caller":
            return self.local.call(request)
        if info["mode"] == "unconfigured":
            return unconfigured_result(request.tool)
        # The same input limit the HTTP edge applies, checked before anything is shipped.
        refusal = input_pixels_refusal(request, self.max_pixels, self.row_overhead_pixels)
        if refusal is not None:
            return refusal
        handle, timeout = self.handles[request.tool], float(info["timeout_s"])
        deployment = info["deployment"]
        pool = self.shm if deployment not in self._shm_off else None
        wire = WireRequest.pack(request, pool)
        timed_out = False

        def attempt() -> ToolResult | Exception:
            nonlocal timed_out
            resp = handle.remote(wire)
            try:
                return resp.result(timeout_s=timeout).unpack(pool)
            except TimeoutError:
                resp.cancel()
                timed_out = True
                return ToolResult.failure("timeout", f"{request.tool} did not finish within {timeout:g} s")
            except self._retryable as e:
                return e

        reuse = False
        try:
            result = _with_retries(self.retry, attempt, request.tool)
            reuse = not timed_out
        finally:
            # After every retry (they all reuse these slots); a timed-out replica may still be
            # using them, so those are removed rather than reused.
            wire.release(pool, reuse)
        if wire.uses_shm and result.error_code == SHM_UNAVAILABLE:
            log.warning("%s: replica cannot see this host's shared memory; sending arrays from now on", deployment)
            self._shm_off.add(deployment)
            return self._call(request)
        return result

    def close(self) -> None:
        self.local.close()
        if self.shm is not None:
            self.shm.close()


class HttpToolbox:
    """Calls the ingress over HTTP: raw-pixel frames when the server lists that format (and
    `raw` is on), otherwise the public JSON format with base64 PNG images."""

    # Not 504 (a tool timeout: resending doubles the wait) nor 4xx (the request's fault); a 500
    # only when it is not the ingress's structured error (a proxy's page while it restarts).
    RETRY_STATUS = frozenset({500, 502, 503})
    MANIFEST_RETRY_S = 10.0

    def __init__(
        self,
        url: str = DEFAULT_HTTP_URL,
        token: str | None = None,
        profile: Profile = Profile.CANVASCRAFT,
        retry: RetryPolicy | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        timeout_margin_s: float = 5.0,
        transport: Any = None,  # an httpx transport, for tests
        raw: bool = True,
    ):
        import httpx

        self.profile = profile
        self.retry = retry or RetryPolicy()
        self.max_pixels = max_pixels
        self.margin = timeout_margin_s
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._httpx = httpx
        self.client = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=DEFAULT_TIMEOUT_S + timeout_margin_s, transport=transport
        )
        self.raw_wanted = raw
        self._raw = False  # set once the server's manifest lists the raw format
        self._timeouts: dict[str, float] | None = None
        self._next_fetch = 0.0
        self._lock = threading.Lock()

    def _timeout(self, tool: str) -> float:
        from toolserver import http_codec

        # Fetched lazily, so building a toolbox does not need the server up yet; after a failed
        # fetch, asked again at most every MANIFEST_RETRY_S rather than on every call.
        with self._lock:
            if self._timeouts is None and time.monotonic() >= self._next_fetch:
                try:
                    r = self.client.get("/v1/tools", timeout=10)
                    r.raise_for_status()
                    listing = r.json()
                    self._timeouts = {t["name"]: float(t["timeout_s"]) for t in listing["tools"]}
                    self._raw = self.raw_wanted and http_codec.RAW_CONTENT_TYPE in listing.get("formats", ())
                except Exception as e:
                    self._next_fetch = time.monotonic() + self.MANIFEST_RETRY_S
                    log.warning("could not read tool timeouts from the server (%s); using %g s for now", e, DEFAULT_TIMEOUT_S)
            return (self._timeouts or {}).get(tool, DEFAULT_TIMEOUT_S)

    def call(self, request: ToolRequest) -> ToolResult:
        return _timed_call("http", request, lambda: self._call(request))

    def _call(self, request: ToolRequest) -> ToolResult:
        from toolserver import http_codec

        timeout = self._timeout(request.tool) + self.margin  # first: it learns the formats
        if self._raw:
            body, ctype = http_codec.request_to_raw(request), http_codec.RAW_CONTENT_TYPE
        else:
            body, ctype = json.dumps(http_codec.request_to_json(request)).encode(), http_codec.JSON_CONTENT_TYPE
        return self._post(request.tool, body, ctype, timeout)

    def _post(self, tool: str, body: bytes, content_type: str, timeout: float) -> ToolResult:
        from toolserver import http_codec

        httpx = self._httpx
        # Ask for the fast form only when sending it: the server spoke raw in its manifest.
        headers = {"content-type": content_type, "accept": content_type}

        def attempt() -> ToolResult | Exception:
            try:
                r = self.client.post(f"/v1/tools/{tool}", content=body, headers=headers, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                return e
            except httpx.TimeoutException:
                return ToolResult.failure("timeout", f"{tool} did not answer within {timeout:g} s")
            if r.status_code == 200:
                if http_codec.media_type(r.headers.get("content-type")) == http_codec.RAW_CONTENT_TYPE:
                    return http_codec.result_from_raw(r.content, self.max_pixels)
                return http_codec.result_from_json(r.json(), self.max_pixels)
            try:
                err = r.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                code = message = None
            replica_error = {"replica_died": ReplicaDied, "replica_out_of_memory": ReplicaOutOfMemory}.get(code or "")
            if r.status_code == 503 and replica_error is not None:
                return replica_error(f"HTTP 503: {message}")
            if r.status_code in self.RETRY_STATUS and not (r.status_code == 500 and code is not None):
                return RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            if code is not None:
                return ToolResult.failure(code, message or "")
            return ToolResult.failure(f"http_{r.status_code}", r.text[:300])

        return _with_retries(self.retry, attempt, tool)

    def close(self) -> None:
        self.client.close()


def make_remote_toolbox(cfg: Any):
    """The remote toolbox for a `ToolsConfig` with client ray|http.

    For `ray`, `url` is the Ray address (default "auto"); for `http`, the server's base URL.
    """
    profile = Profile(cfg.profile)
    if cfg.client == "ray":
        return RayToolbox(
            address=cfg.url,
            app_name=getattr(cfg, "ray_app", DEFAULT_APP_NAME),
            profile=profile,
            max_pixels=cfg.max_pixels,
            shm=getattr(cfg, "shm", None),
        )
    if cfg.client == "http":
        token = os.environ.get(cfg.token_env or DEFAULT_TOKEN_ENV) or None
        return HttpToolbox(url=cfg.url or DEFAULT_HTTP_URL, token=token, profile=profile, max_pixels=cfg.max_pixels)
    raise ValueError(f"make_remote_toolbox handles client ray|http, not {cfg.client!r}")


def make_toolbox(cfg: ToolsConfig | str | Path = "offline"):
    """The toolbox a config asks for: in-process, a Ray Serve handle, or HTTP."""
    if not isinstance(cfg, ToolsConfig):
        cfg = ToolsConfig.load(cfg)
    if cfg.client == "local":
        return LocalToolbox.from_config(cfg)
    if cfg.client in ("ray", "http"):
        return make_remote_toolbox(cfg)
    raise ValueError(f"unknown toolbox client {cfg.client!r} (local | ray | http)")
