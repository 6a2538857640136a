"""The Ray Serve application: one deployment per served tool, plus an HTTP ingress.

Inside Ray, requests and results travel as `toolserver.wire` objects; PNG, base64 and raw-pixel
frames exist only in the ingress, for HTTP callers. Every replica executes through a
`LocalToolbox`, so errors, output limits and plumbing-only warnings behave as in-process.
"""

import asyncio
import hashlib
import hmac
import importlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import OutOfMemoryError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolserver import http_codec
from toolserver.backends import BACKEND_FACTORIES, build_backend
from toolserver.limits import Limits, check_request, output_refusal
from toolserver.registry import REGISTRY, Backend
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.serve_config import Mode, ServeConfig, check_bind, ray_actor_options, tool_gpu_device, unconfigured_result
from toolserver.toolbox import LocalToolbox
from toolserver.wire import SHM_UNAVAILABLE, ShmMissing, ShmPool, WireRequest, WireResult, keep_pillow_blocks, shm_available

log = logging.getLogger(__name__)

INGRESS_NAME = "Ingress"
# Errors after which the same call may succeed on another (or a restarted) replica; which of
# them are actually resent, and how often, is the client's RetryPolicy (died_mid_call, out_of_memory).
RETRYABLE = (RayActorError, DeploymentUnavailableError, BackPressureError, OutOfMemoryError)
_OOM_WORDS = ("out of memory", "low on memory", "outofmemory", "memory monitor")
# Threads per replica for pure tools: they run off the event loop, so one slow call (a large
# Rotate) neither stalls the replica's other requests nor outlives a cancelled caller's wait.
PURE_THREADS = 4


def died_mid_call(exc: BaseException) -> bool:
    """The replica died while it ran this call (rather than before it started): the call itself
    may be what killed it, so it is resent at most once (RetryPolicy.died_attempts)."""
    return isinstance(exc, RayActorError) and "never ran" not in str(exc)


def out_of_memory(exc: BaseException) -> bool:
    """Ray says the replica was killed for memory: the same input would do it again."""
    if isinstance(exc, OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RayActorError) and any(w in text for w in _OOM_WORDS)


def unavailable_error(name: str, exc: BaseException) -> tuple[str, str]:
    """(error code, message) for a call that no replica finished: `replica_out_of_memory`,
    `replica_died` (died during this call) or `replica_unavailable` (none to take it)."""
    code = "replica_out_of_memory" if out_of_memory(exc) else "replica_died" if died_mid_call(exc) else "replica_unavailable"
    return code, f"{name}: {type(exc).__name__}: {str(exc)[:300]}"


def load_backend(name: str, params: dict[str, Any]) -> Any:
    """A registered backend name, or "module:factory" for one that is not registered (custom
    backends, the serving probe) without editing toolserver.backends."""
    if name in BACKEND_FACTORIES or ":" not in name:
        return build_backend(name, params)
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)(**params)


def token_digest(token: str | None) -> str | None:
    # Replicas get only a digest, so the token never sits in Ray's deployment config.
    return hashlib.sha256(token.encode()).hexdigest() if token else None


@serve.deployment
class ToolDeployment:
    """One model tool, or one or more pure tools. The model backend is built in the constructor,
    so a bad backend name or params fails the deploy itself (weights may still load lazily)."""

    def __init__(
        self,
        tools: list[str],
        backend: str | None,
        params: dict[str, Any],
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_pixels: int,
        gpu_slot: int | None = None,
        limits: dict[str, Any] | None = None,
        max_concurrent_batches: int = 1,
    ):
        """`gpu_slot`: under `placement: slots`, the tool GPU this replica was placed on by its
        per-GPU resource; it selects that device before any backend touches CUDA. `limits`: the
        serving config's `limits` block; every request is checked against it (and validated)
        before its tool runs. `max_concurrent_batches`: batches run at once, one thread each."""
        if gpu_slot is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = tool_gpu_device(gpu_slot, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.tools = frozenset(tools)
        self.tool = tools[0] if len(tools) == 1 else "+".join(tools)
        keep_pillow_blocks()  # a replica process is ours; see the function for what it saves
        fn = None
        if any(REGISTRY[t].backend is Backend.MODEL for t in tools):
            if len(tools) != 1 or not backend:
                raise ValueError(f"{tools}: a model tool is deployed alone and with a backend")
            fn = load_backend(backend, params)
        self.backend_name = backend or "pure"
        self.max_pixels = max_pixels
        self.fn = fn
        self.box = LocalToolbox(
            backends={self.tool: fn} if fn is not None else {},
            max_output_pixels=max_pixels,
            validate=True,
            limits=Limits(**(limits or {})),
        )
        self.checked_box = LocalToolbox(backends=self.box.backends, max_output_pixels=max_pixels)  # for requests already checked
        self.batched = max_batch_size > 1 and callable(getattr(fn, "batch_call", None))
        # Model code is rarely thread-safe: one thread, or one per concurrent batch (unbatched
        # model calls stay one at a time). Pure tools are thread-safe and Pillow releases the GIL.
        workers = PURE_THREADS if fn is None else max_concurrent_batches if self.batched else 1
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"tool-{self.tool}")
        if self.batched:
            # Built per replica: serve.batch's decorator form offers no max_concurrent_batches setter.
            self._batch = serve.batch(
                max_batch_size=max_batch_size,
                batch_wait_timeout_s=batch_wait_timeout_s,
                max_concurrent_batches=max_concurrent_batches,
            )(self._run_batch_async)
        self.plumbing_only = bool(getattr(fn, "plumbing_only", False))
        if self.plumbing_only:
            log.warning("%s is served by the random-weight %r backend: plumbing only, not real results", self.tool, backend)

    async def __call__(self, wire: WireRequest) -> WireResult:
        if wire.tool not in self.tools:
            return WireResult.pack(ToolResult.failure("not_served", f"deployment {self.tool} does not serve {wire.tool!r:.60}"))
        try:
            req = wire.unpack()
        except ShmMissing as e:  # the caller is on another host: it resends as arrays
            return WireResult.pack(ToolResult.failure(SHM_UNAVAILABLE, f"{self.tool}: {e}"))
        if self.batched:
            checked, refusal = check_request(req, self.box.limits, self.max_pixels)
            result = refusal if refusal is not None else await self._batch(checked)
        else:
            # Off the event loop, pure tools included: a cancelled caller (its timeout) stops
            # waiting here, and the loop keeps serving other requests while the call finishes.
            result = await asyncio.get_running_loop().run_in_executor(self.pool, self.box.call, req)
        # A caller that sent slots is on this host and named a slot for the result image.
        return WireResult.pack(result, wire.reply_slot)

    async def _run_batch_async(self, reqs: list[ToolRequest]) -> list[ToolResult]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._run_batch, reqs)

    def _run_batch(self, reqs: list[ToolRequest]) -> list[ToolResult]:
        if len(reqs) > 1:
            t0 = time.perf_counter()
            try:
                results = list(self.fn.batch_call(reqs))  # type: ignore[union-attr]
                if len(results) == len(reqs):
                    for r in results:
                        r.elapsed_s = r.elapsed_s or (time.perf_counter() - t0) / len(reqs)
                    # LocalToolbox.call applies this limit on the per-item path; batch_call bypasses it.
                    return [output_refusal(self.tool, r, self.max_pixels) or r for r in results]
                log.error("%s batch_call returned %d results for %d requests; retrying one by one", self.tool, len(results), len(reqs))
            except Exception:
                # One bad input must not fail its batch-mates: fall back to per-item calls,
                # where LocalToolbox turns that input's error into its own failed result.
                log.exception("%s batch_call failed; retrying one by one", self.tool)
        # Already checked in __call__; LocalToolbox would validate the normalised args again.
        return [self.checked_box.call(r) for r in reqs]

    def describe(self) -> dict[str, Any]:
        return {
            "tools": sorted(self.tools),
            "backend": self.backend_name,
            "plumbing_only": self.plumbing_only,
            "batched": self.batched,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def __del__(self) -> None:
        box = getattr(self, "box", None)  # absent when the constructor failed
        if box is not None:
            box.close()


# No /docs, /redoc or /openapi.json: they would be served without the bearer token, and the
# tool schemas are already at GET /v1/tools, behind it.
api = FastAPI(title="CanvasAgent toolserver", docs_url=None, redoc_url=None, openapi_url=None)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(http_codec.error_json(code, message), status_code=status)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error(exc.status_code, "http_error", str(exc.detail))


@api.exception_handler(RequestValidationError)
async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return _error(422, "bad_request", str(exc.errors())[:500])


class TooLarge(Exception):
    pass


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes whether or not Content-Length is honest."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_request(
    tool: str, body: bytes, max_pixels: int, content_type: str = http_codec.JSON_CONTENT_TYPE, limits: Limits | None = None
) -> ToolRequest:
    """The request in `body`; raises http_codec.BadRequest (a structured 4xx) for anything else,
    deep or malformed JSON included."""
    limits = limits or Limits()
    if content_type == http_codec.RAW_CONTENT_TYPE:
        return http_codec.request_from_raw(tool, body, max_pixels, limits)
    payload = http_codec.parse_json(body, limits.max_json_depth, "the request body")
    return http_codec.request_from_json(tool, payload, max_pixels, limits)


def authorized(header: str | None, digest: str | None) -> bool:
    """`Authorization: Bearer <token>` (the scheme in any case, RFC 7235) matching `digest`."""
    if digest is None:
        return True
    scheme, _, credentials = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return False
    return hmac.compare_digest(hashlib.sha256(credentials.strip().encode()).hexdigest(), digest)


@serve.deployment
@serve.ingress(api)
class Ingress:
    """Routes HTTP calls to tool replicas, runs caller-mode pure tools, and serves the manifest."""

    def __init__(self, handles: dict[str, Any], config: dict[str, Any], auth_digest: str | None):
        self.cfg = ServeConfig.from_dict(config)
        self.handles = handles
        self.digest = auth_digest
        # Defence in depth: the same refusal as the CLI, in case someone deploys the app by hand.
        if self.cfg.http.enabled and auth_digest is None:
            check_bind(self.cfg.http, None)
        self.local = LocalToolbox(max_output_pixels=self.cfg.max_pixels, validate=True, limits=self.cfg.limits)
        keep_pillow_blocks()  # it decodes HTTP images and runs caller-mode tools
        self.shm = ShmPool() if shm_available() else None
        self.shm_off: set[str] = set()  # deployments with a replica on another host
        self.codec_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="codec")

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown; the pool's own finalizer only runs at a normal
        # interpreter exit, which a replica's process does not get.
        pool = getattr(self, "shm", None)
        if pool is not None:
            pool.close()

    # -- for Ray clients (called through the app handle, not over HTTP)
    def manifest(self) -> dict[str, Any]:
        return {
            "app": self.cfg.app_name,
            "max_pixels": self.cfg.max_pixels,
            "row_overhead_pixels": self.cfg.limits.row_overhead_pixels,
            "tools": self.cfg.manifest(),
        }

    async def describe(self) -> dict[str, Any]:
        """Deployment name -> what its replica runs (backend, plumbing-only, batched)."""
        return {name: await h.describe.remote() for name, h in self.handles.items()}

    async def run(self, tool: str, req: ToolRequest) -> ToolResult:
        """Execute one call from inside Ray; raises the retryable errors for the caller to handle."""
        mode = self.cfg.mode(tool)
        if mode is Mode.UNCONFIGURED:
            return unconfigured_result(tool)
        if mode is Mode.CALLER:
            return await asyncio.get_running_loop().run_in_executor(None, self.local.call, req)
        deployment = self.cfg.deployment_for(tool)
        pool = self.shm if deployment not in self.shm_off else None
        wire = WireRequest.pack(req, pool)
        done = False
        try:
            result = (await self.handles[deployment].remote(wire)).unpack(pool)
            done = True
        finally:
            # Cancelled (the per-tool timeout): the replica may still use the slots.
            wire.release(pool, reuse=done)
        if wire.uses_shm and result.error_code == SHM_UNAVAILABLE:
            log.warning("%s: replica cannot see this host's shared memory; sending arrays from now on", deployment)
            self.shm_off.add(deployment)
            return await self.run(tool, req)
        return result

    @api.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        return {"status": "ok", "app": self.cfg.app_name, "tools": {k: v["mode"] for k, v in self.cfg.manifest().items()}}

    @api.get("/v1/tools")
    async def list_tools(self, request: Request) -> Any:
        if not authorized(request.headers.get("authorization"), self.digest):
            return _error(401, "unauthorized", "missing or wrong bearer token")
        manifest = self.cfg.manifest()
        return {
            "app": self.cfg.app_name,
            "max_pixels": self.cfg.max_pixels,
            "max_request_bytes": self.cfg.http.max_request_bytes,
            "limits": asdict(self.cfg.limits),
            "formats": list(http_codec.FORMATS),  # request Content-Type / response Accept
            "tools": [{"name": n, **manifest[n], "schema": REGISTRY[n].openai_schema()} for n in manifest],
        }

    @api.post("/v1/tools/{name}")
    async def call_tool(self, name: str, request: Request) -> Any:
        if not authorized(request.headers.get("authorization"), self.digest):
            return _error(401, "unauthorized", "missing or wrong bearer token")
        if name not in self.cfg.tools:
            return _error(404, "unknown_tool", f"unknown tool {name!r:.60}; served: {', '.join(self.cfg.tools)}")
        try:
            body = await read_limited(request, self.cfg.http.max_request_bytes)
        except TooLarge:
            return _error(413, "request_too_large", f"request body over the {self.cfg.http.max_request_bytes:,}-byte limit")
        loop = asyncio.get_running_loop()
        try:
            content_type = http_codec.media_type(request.headers.get("content-type"))
            req = await loop.run_in_executor(self.codec_pool, _parse_request, name, body, self.cfg.max_pixels, content_type, self.cfg.limits)
        except http_codec.BadRequest as e:
            return _error(413 if e.code == "too_many_pixels" else 400, e.code, str(e))
        # Validated here as in-process (and again by the replica, which Ray callers reach
        # directly): a refused call is a failed result, and nothing is shipped for it.
        checked, refusal = check_request(req, self.cfg.limits, self.cfg.max_pixels)
        if refusal is not None:
            return JSONResponse(http_codec.result_to_json(refusal))
        timeout = self.cfg.timeout_s(name)
        try:
            result = await asyncio.wait_for(self.run(name, checked), timeout)
        except asyncio.TimeoutError:
            return _error(504, "timeout", f"{name} did not finish within {timeout:g} s")
        except RETRYABLE as e:
            return _error(503, *unavailable_error(name, e))
        except Exception as e:  # structured, never a bare 500 page
            log.exception("ingress failed on %s", name)
            return _error(500, "toolserver_error", f"{name}: {type(e).__name__}: {str(e)[:300]}")
        if http_codec.accepts_raw(request.headers.get("accept")):
            raw = await loop.run_in_executor(self.codec_pool, http_codec.result_to_raw, result)
            return Response(raw, media_type=http_codec.RAW_CONTENT_TYPE)
        out = await loop.run_in_executor(self.codec_pool, http_codec.result_to_json, result)
        return JSONResponse(out)


def build_app(cfg: ServeConfig, token: str | None = None):
    """The Serve application for `cfg`; refuses a public bind without a token."""
    check_bind(cfg.http, token)
    handles = {}
    for name, (served, tcfg) in cfg.deployments().items():
        opts: dict[str, Any] = {
            "name": name,
            "ray_actor_options": ray_actor_options(cfg, tcfg),
            "max_ongoing_requests": tcfg.max_ongoing_requests,
        }
        if tcfg.autoscaling_config:
            opts["autoscaling_config"] = tcfg.autoscaling_config
        else:
            opts["num_replicas"] = tcfg.num_replicas
        slot = tcfg.gpu if cfg.placement == "slots" and tcfg.on_gpu else None
        handles[name] = ToolDeployment.options(**opts).bind(
            served, tcfg.backend, dict(tcfg.params), tcfg.max_batch_size, tcfg.batch_wait_timeout_s, cfg.max_pixels, slot, asdict(cfg.limits),
            tcfg.max_concurrent_batches,
        )
    # Backends are already taken from `backends_from`; the ingress may run on a node without
    # the configs/ directory, so it gets the resolved config, not the reference.
    resolved = {**cfg.to_dict(), "backends_from": None}
    return Ingress.options(
        name=INGRESS_NAME,
        ray_actor_options=dict(cfg.http.ray_actor_options),
        num_replicas=cfg.http.num_replicas,
        max_ongoing_requests=cfg.http.max_ongoing_requests,
    ).bind(handles, resolved, token_digest(token))


def deploy(cfg: ServeConfig, token: str | None = None):
    """Start Serve (HTTP on the configured host/port) and run the app; returns the ingress handle.

    Needs a connected Ray (`ray.init`). Blocks until every replica is up.
    """
    app = build_app(cfg, token)  # before serve.start, so a refused bind opens no port
    if cfg.http.enabled:
        serve.start(http_options={"host": cfg.http.host, "port": cfg.http.port}, proxy_location="HeadOnly")
        return serve.run(app, name=cfg.app_name, route_prefix="/")
    serve.start(proxy_location="Disabled")
    return serve.run(app, name=cfg.app_name, route_prefix=None)
