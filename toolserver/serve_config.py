"""Serving config (`configs/serve/*.yaml`) and the placement check behind `serve --dry-run`.

The deployments follow the tool registry: a model tool gets one when the config gives it a
backend, and a pure tool runs as a light CPU deployment or in the caller. The config only tunes
what the registry declares; naming a tool it does not know is an error.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from itertools import permutations
from pathlib import Path
from typing import Any

from toolserver.config import ToolsConfig, find_config, from_dict, load_yaml
from toolserver.limits import Limits
from toolserver.registry import REGISTRY, Backend, ToolSpec, tools
from toolserver.results import ToolResult

DEFAULT_TOKEN_ENV = "CANVASAGENT_TOOLSERVER_TOKEN"  # same default as toolserver.config.ToolsConfig
DEFAULT_APP_NAME = "toolserver"
DEFAULT_MAX_PIXELS = 40_000_000
_EPS = 1e-9
PURE_DEPLOYMENT = "PureTools"
PURE_MODES = ("deployment", "shared", "caller")
# How GPU tools reach their planned GPU (see docs/serving.md, "GPU placement"):
#   ray:   Ray's num_gpus fractions, packed in replica start order (the plan is not enforced);
#   slots: one Ray node owns the tool GPUs; tool GPU g is the custom resource <prefix>g
#          (capacity 1), each replica asks for its fraction of it and selects device g itself;
#   nodes: one Ray node per tool GPU, each declaring <prefix>g; replicas keep num_gpus.
PLACEMENTS = ("ray", "slots", "nodes")
DEFAULT_PIN_PREFIX = "toolgpu"
# Shortest bearer token accepted; 16 characters of `secrets.token_urlsafe` are 96 bits.
MIN_TOKEN_CHARS = 16


class ServeConfigError(ValueError):
    """The serve config cannot be served as written (bad keys, placement, missing token...)."""


class Mode(str, Enum):
    DEPLOYMENT = "deployment"  # a Ray Serve deployment of its own
    CALLER = "caller"  # pure tools only: run in whoever calls (the client or the HTTP ingress)
    UNCONFIGURED = "unconfigured"  # a model tool without a backend: calls fail clearly


@dataclass
class ToolServeConfig:
    """How one tool is served. Fields mirror Ray Serve's deployment options where they exist."""

    backend: str | None = None  # model tools: a name in toolserver.backends.BACKEND_FACTORIES, or "module:factory"
    params: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None  # pure tools: deployment | caller; None means ServeConfig.pure_mode
    ray_actor_options: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 0.1})
    num_replicas: int | None = 1  # ignored when autoscaling_config is set
    autoscaling_config: dict[str, Any] | None = None
    max_ongoing_requests: int = 8
    # >1 turns on @serve.batch, used only if the backend exposes batch_call(list[ToolRequest]).
    max_batch_size: int = 1
    batch_wait_timeout_s: float = 0.01
    # Batches one replica runs at once, each on its own thread: >1 only for a thread-safe
    # backend. Callers whose calls miss a batch's window then start at once instead of queueing
    # behind it. max_ongoing_requests must hold max_batch_size x this many requests.
    max_concurrent_batches: int = 1
    timeout_s: float | None = None  # None: ServeConfig.default_timeout_s
    # Which GPU of the tool server this tool's num_gpus fraction is planned on. Checked by the
    # dry run; with ServeConfig.pin_resource_prefix it also pins replicas (see docs/serving.md).
    gpu: int | None = None

    @property
    def on_gpu(self) -> bool:
        return self.num_gpus > 0 and self.gpu is not None

    @property
    def num_gpus(self) -> float:
        return float(self.ray_actor_options.get("num_gpus", 0) or 0)

    @property
    def num_cpus(self) -> float:
        # Ray's own default for a replica is one CPU.
        return float(self.ray_actor_options.get("num_cpus", 1))

    @property
    def max_replicas(self) -> int:
        if self.autoscaling_config:
            return int(self.autoscaling_config.get("max_replicas", 1))
        return int(self.num_replicas or 1)


@dataclass
class HttpConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    token_env: str = DEFAULT_TOKEN_ENV
    max_request_bytes: int = 64 * 1024 * 1024
    # The ingress deployment is a router: it decodes PNGs and forwards arrays to tool replicas.
    ray_actor_options: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 0.1})
    num_replicas: int = 1
    max_ongoing_requests: int = 64


@dataclass
class ServeConfig:
    app_name: str = DEFAULT_APP_NAME
    # A tools config (configs/tools/<name>.yaml) to take each model tool's backend name and params
    # from, so in-process and served runs share one backend choice; a tool's own `backend` here
    # overrides it, and its `params` are merged over the tools config's.
    backends_from: str | None = None
    family: str = "canvasagent"
    # Where pure tools run unless a tool says otherwise: `deployment` (one each), `shared` (one
    # deployment, PURE_DEPLOYMENT, for all of them: fewer processes) or `caller`.
    pure_mode: str = "deployment"
    pure: ToolServeConfig = field(default_factory=ToolServeConfig)  # options of the shared deployment
    num_gpus: int = 0  # GPUs reserved for the tool server; the dry run packs fractions into them
    # Every model tool must have a backend (a production config); offline configs leave some out.
    require_all_model_tools: bool = False
    placement: str = "ray"  # one of PLACEMENTS
    pin_resource_prefix: str = DEFAULT_PIN_PREFIX  # custom resource per tool GPU: <prefix><gpu>
    default_timeout_s: float = 120.0
    max_pixels: int = DEFAULT_MAX_PIXELS  # per input image at the HTTP edge, per output everywhere
    http: HttpConfig = field(default_factory=HttpConfig)
    # Text length, JSON depth and per-row pixel cost, checked before any work (docs/serving.md).
    limits: Limits = field(default_factory=Limits)
    tools: dict[str, ToolServeConfig] = field(default_factory=dict)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "ServeConfig":
        return cls.from_dict(load_yaml(find_config(name_or_path, "serve")))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ServeConfig":
        data = copy.deepcopy(data)
        defaults = data.pop("defaults", None) or {}
        tool_data = data.pop("tools", None) or {}
        pure = data.pop("pure", None) or {}
        data.update(http=data.get("http") or {}, limits=data.get("limits") or {})  # from_dict builds them
        try:
            cfg = from_dict(cls, data)
            cfg.pure = from_dict(ToolServeConfig, _merge(defaults, pure))
            cfg.tools = {name: from_dict(ToolServeConfig, _merge(defaults, body or {})) for name, body in tool_data.items()}
            # Tools the YAML leaves out still get the defaults (a pure tool becomes a deployment).
            for spec in servable_tools(cfg.family):
                cfg.tools.setdefault(spec.name, from_dict(ToolServeConfig, copy.deepcopy(defaults)))
            if cfg.backends_from:
                cfg._take_backends(cfg.backends_from)
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise ServeConfigError(str(e)) from None
        cfg.check()
        return cfg

    def _take_backends(self, tools_config: str) -> None:
        for tool, bcfg in ToolsConfig.load(tools_config).backends.items():
            if tool not in self.tools:
                raise ValueError(f"backends_from={tools_config!r} names {tool!r}, which is not a served tool")
            tcfg = self.tools[tool]
            if tcfg.backend is None and bcfg.name not in (None, "", "none"):
                tcfg.backend, tcfg.params = bcfg.name, {**(bcfg.params or {}), **tcfg.params}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def mode(self, tool: str) -> Mode:
        spec, tcfg = REGISTRY[tool], self.tools[tool]
        if spec.backend is Backend.PURE:
            return Mode.CALLER if (tcfg.mode or self.pure_mode) == Mode.CALLER.value else Mode.DEPLOYMENT
        return Mode.DEPLOYMENT if tcfg.backend not in (None, "", "none") else Mode.UNCONFIGURED

    def deployment_for(self, tool: str) -> str | None:
        if self.mode(tool) is not Mode.DEPLOYMENT:
            return None
        shared = REGISTRY[tool].backend is Backend.PURE and (self.tools[tool].mode or self.pure_mode) == "shared"
        return PURE_DEPLOYMENT if shared else tool  # named after the tool, so `serve status` reads naturally

    def deployments(self) -> dict[str, tuple[list[str], ToolServeConfig]]:
        """Deployment name -> (the tools it serves, its options), in registry order."""
        out: dict[str, tuple[list[str], ToolServeConfig]] = {}
        for spec in servable_tools(self.family):
            name = self.deployment_for(spec.name)
            if name is not None:
                tcfg = self.pure if name == PURE_DEPLOYMENT else self.tools[spec.name]
                out.setdefault(name, ([], tcfg))[0].append(spec.name)
        return out

    def timeout_s(self, tool: str) -> float:
        t = self.tools[tool].timeout_s
        return float(t if t is not None else self.default_timeout_s)

    def manifest(self) -> dict[str, dict[str, Any]]:
        """What a client needs to route a call: per tool, its mode and timeout."""
        return {
            t.name: {"mode": self.mode(t.name).value, "timeout_s": self.timeout_s(t.name), "deployment": self.deployment_for(t.name)}
            for t in servable_tools(self.family)
        }

    def check(self) -> None:
        """Structural checks that need no Ray and no weights; raises ServeConfigError."""
        names = {t.name for t in servable_tools(self.family)}
        errors: list[str] = []
        for name, tcfg in self.tools.items():
            if name not in REGISTRY:
                errors.append(f"tools.{name}: not a tool in toolserver.registry")
                continue
            if name not in names:
                errors.append(f"tools.{name}: {REGISTRY[name].backend.value} tools of family {REGISTRY[name].family!r} are not served")
                continue
            spec = REGISTRY[name]
            if tcfg.mode not in (None, *PURE_MODES):
                errors.append(f"tools.{name}.mode: {tcfg.mode!r} is not deployment|caller")
            if spec.backend is Backend.PURE and tcfg.backend:
                errors.append(f"tools.{name}: a pure tool takes no backend")
            if spec.backend is Backend.MODEL and tcfg.mode not in (None, Mode.DEPLOYMENT.value):
                errors.append(f"tools.{name}: model tools run only as deployments")
            if tcfg.max_batch_size < 1 or tcfg.batch_wait_timeout_s < 0:
                errors.append(f"tools.{name}: max_batch_size must be >= 1 and batch_wait_timeout_s >= 0")
            if tcfg.max_concurrent_batches < 1:
                errors.append(f"tools.{name}.max_concurrent_batches must be >= 1")
            elif tcfg.max_batch_size > 1 and tcfg.max_ongoing_requests < tcfg.max_batch_size * tcfg.max_concurrent_batches:
                errors.append(
                    f"tools.{name}: max_ongoing_requests ({tcfg.max_ongoing_requests}) is under max_batch_size x "
                    f"max_concurrent_batches ({tcfg.max_batch_size} x {tcfg.max_concurrent_batches}); the replica could never fill them"
                )
            if tcfg.timeout_s is not None and tcfg.timeout_s <= 0:
                errors.append(f"tools.{name}.timeout_s must be positive")
            if tcfg.num_replicas is not None and tcfg.num_replicas < 1 and not tcfg.autoscaling_config:
                errors.append(f"tools.{name}.num_replicas must be >= 1")
        if self.placement not in PLACEMENTS:
            errors.append(f"placement: {self.placement!r} is not one of {'|'.join(PLACEMENTS)}")
        if not self.pin_resource_prefix or not self.pin_resource_prefix.replace("_", "").isalnum():
            errors.append(f"pin_resource_prefix: {self.pin_resource_prefix!r} must be letters, digits and underscores")
        if self.pure_mode not in PURE_MODES:
            errors.append(f"pure_mode: {self.pure_mode!r} is not one of {'|'.join(PURE_MODES)}")
        if not 0 < self.http.port < 65536:
            errors.append(f"http.port {self.http.port} is out of range")
        if self.http.max_request_bytes <= 0 or self.max_pixels <= 0:
            errors.append("http.max_request_bytes and max_pixels must be positive")
        errors += self.limits.problems()
        if errors:
            raise ServeConfigError("; ".join(errors))


def servable_tools(family: str = "canvasagent") -> tuple[ToolSpec, ...]:
    """Registry tools a tool server can run: stateful tools act on an environment's own state."""
    return tuple(t for t in tools(family) if t.backend is not Backend.STATEFUL)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def unconfigured_result(tool: str) -> ToolResult:
    """What a call to a model tool without a backend returns, from the handle or over HTTP."""
    return ToolResult.failure(
        "backend_not_configured",
        f"{tool} needs a model backend and this tool server has none configured "
        f"(set tools.{tool}.backend in configs/serve/*.yaml)",
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname we cannot vouch for counts as public


def check_bind(http: HttpConfig, token: str | None) -> None:
    """Refuse to expose the toolbox beyond loopback without a bearer token, and refuse a token
    shorter than MIN_TOKEN_CHARS anywhere (raises ServeConfigError)."""
    if token is not None and len(token.strip()) < MIN_TOKEN_CHARS:
        raise ServeConfigError(
            f"${http.token_env} holds a {len(token.strip())}-character token; use at least {MIN_TOKEN_CHARS} "
            "characters, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if http.enabled and not is_loopback(http.host) and not token:
        raise ServeConfigError(
            f"http.host={http.host!r} is not a loopback address, so a bearer token is required: "
            f"set ${http.token_env} before starting the server"
        )


@dataclass
class PlacementReport:
    gpus: dict[int, list[tuple[str, float]]] = field(default_factory=dict)  # gpu -> (tool, fraction x max replicas)
    cpus: float = 0.0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unconfigured: list[str] = field(default_factory=list)
    cpu_models: list[str] = field(default_factory=list)  # model tools planned without a GPU
    replica_fractions: list[float] = field(default_factory=list)  # one entry per GPU replica
    placement: str = "ray"
    # deployment -> what each of its replicas asks Ray for, when placement pins it to a GPU
    pins: dict[str, dict[str, float]] = field(default_factory=dict)
    node_resources: dict[str, float] = field(default_factory=dict)  # what the tool-GPU node(s) must declare

    @property
    def ok(self) -> bool:
        return not self.errors

    def gpu_load(self, gpu: int) -> float:
        return sum(f for _, f in self.gpus.get(gpu, []))

    def render(self) -> str:
        lines = []
        for g in sorted(self.gpus):
            parts = ", ".join(f"{t} {f:g}" for t, f in self.gpus[g])
            lines.append(f"GPU {g}: {self.gpu_load(g):.2f} of 1.00  ({parts})")
        if self.pins:
            how = {
                "slots": "one Ray node owns the tool GPUs; each replica takes its fraction of that GPU's resource and selects the device itself",
                "nodes": "one Ray node per tool GPU; each replica asks for a sliver of its node's resource and Ray assigns the GPU there",
            }[self.placement]
            lines.append(f"placement: {self.placement} (enforced): {how}")
            lines.append(f"  the tool-GPU node(s) must declare: {json.dumps(self.node_resources)}")
            for name, res in self.pins.items():
                lines.append(f"  {name}: " + ", ".join(f"{k} {v:g}" for k, v in res.items()))
        else:
            lines.append("placement: ray (Ray packs fractions in replica start order; the grouping is a plan, not enforced)")
        lines.append(f"CPUs reserved (at max replicas): {self.cpus:g}")
        if self.cpu_models:
            lines.append(f"model tools on CPU: {', '.join(self.cpu_models)}")
        if self.unconfigured:
            lines.append(f"model tools without a backend (calls fail with backend_not_configured): {', '.join(self.unconfigured)}")
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"error: {e}" for e in self.errors]
        lines.append("config OK" if self.ok else "config INVALID")
        return "\n".join(lines)


def check_placement(cfg: ServeConfig, known_backends: set[str] | None = None) -> PlacementReport:
    """Validate the GPU plan without Ray or weights: every model tool is placed (`gpu:`) and each
    GPU's fractions, counted at max replicas (autoscaling may reach it), sum to <= 1. Ray packs
    fractions in replica start order, so the planned grouping is what can be checked."""
    rep = PlacementReport(gpus={g: [] for g in range(cfg.num_gpus)}, placement=cfg.placement)
    for spec in servable_tools(cfg.family):
        if cfg.mode(spec.name) is Mode.UNCONFIGURED:
            rep.unconfigured.append(spec.name)
            if cfg.require_all_model_tools:
                rep.errors.append(f"{spec.name}: model tool has no backend (require_all_model_tools is set)")
    for name, (served, tcfg) in cfg.deployments().items():
        if known_backends is not None and tcfg.backend and tcfg.backend not in known_backends and ":" not in tcfg.backend:
            rep.errors.append(f"{name}: unknown backend {tcfg.backend!r}; registered: {', '.join(sorted(known_backends)) or 'none'}")
        rep.cpus += tcfg.num_cpus * tcfg.max_replicas
        frac = tcfg.num_gpus
        if frac <= 0:
            rep.cpu_models += [t for t in served if REGISTRY[t].backend is Backend.MODEL]
            if tcfg.gpu is not None:
                rep.errors.append(f"{name}: gpu={tcfg.gpu} but num_gpus is 0")
            continue
        if frac > 1 + _EPS:
            rep.errors.append(f"{name}: num_gpus={frac:g} > 1; a tool replica is planned onto one GPU")
        if tcfg.gpu is None or not 0 <= tcfg.gpu < cfg.num_gpus:
            rep.errors.append(f"{name}: needs num_gpus={frac:g} but is not placed (gpu: must be in 0..{cfg.num_gpus - 1})")
            continue
        rep.gpus[tcfg.gpu].append((name, frac * tcfg.max_replicas))
        rep.replica_fractions += [frac] * tcfg.max_replicas
        if cfg.placement != "ray":
            opts = ray_actor_options(cfg, tcfg)
            rep.pins[name] = {**({"GPU": opts["num_gpus"]} if opts.get("num_gpus") else {}), **opts.get("resources", {})}
    for g, items in rep.gpus.items():
        load = rep.gpu_load(g)
        if load > 1 + _EPS:
            rep.errors.append(f"GPU {g} is oversubscribed: {load:.2f} > 1 ({', '.join(t for t, _ in items)})")
        elif not items:
            rep.warnings.append(f"GPU {g} has no tools")
    if cfg.placement != "ray":
        rep.node_resources = node_resources(cfg)
    elif cfg.num_gpus and not rep.errors and not _packs_in_any_order(rep.replica_fractions, cfg.num_gpus):
        rep.warnings.append(
            "Ray packs fractional GPUs in replica start order, which may not reproduce this grouping; "
            "set placement: slots (one Ray node owning the tool GPUs) or nodes (one per GPU) to enforce it"
        )
    return rep


def _packs_in_any_order(items: list[float], n_gpus: int) -> bool:
    """True if first-fit packing of these fractions succeeds whatever order replicas start in."""
    if len(items) > 8:  # 40320 orders; beyond that, say nothing rather than stall the CLI
        return True
    for order in set(permutations(items)):
        free = [1.0] * n_gpus
        for f in order:
            slot = next((i for i, c in enumerate(free) if c + _EPS >= f), None)
            if slot is None:
                return False
            free[slot] -= f
    return True


def ray_actor_options(cfg: ServeConfig, tcfg: ToolServeConfig) -> dict[str, Any]:
    """A deployment's actor options, with the pinning resource its placement asks for."""
    opts = copy.deepcopy(tcfg.ray_actor_options)
    if cfg.placement == "ray" or not tcfg.on_gpu:
        return opts
    res = dict(opts.get("resources") or {})
    key = f"{cfg.pin_resource_prefix}{tcfg.gpu}"
    if cfg.placement == "slots":
        # Ray's GPU accounting picks a device per replica in start order, which is what breaks
        # the plan; the per-GPU resource does that accounting instead (capacity 1, so a GPU
        # still cannot be oversubscribed) and the replica selects device `gpu` itself
        # (tool_gpu_device). With num_gpus 0, Ray leaves CUDA_VISIBLE_DEVICES as the node's.
        opts.pop("num_gpus", None)
        res[key] = tcfg.num_gpus
    else:
        # A sliver of the resource only one node declares forces the replica onto that node;
        # Ray accounts the GPU fraction itself there.
        res[key] = 0.001
    opts["resources"] = res
    return opts


def node_resources(cfg: ServeConfig) -> dict[str, float]:
    """The custom resources the tool-GPU node(s) must declare for `cfg.placement` (none for ray):
    `toolserver serve` declares them itself when it starts Ray; `ray start --resources` otherwise."""
    if cfg.placement == "ray":
        return {}
    return {f"{cfg.pin_resource_prefix}{g}": 1.0 for g in range(cfg.num_gpus)}


def missing_node_resources(cfg: ServeConfig, cluster: dict[str, float]) -> list[str]:
    """What the cluster (`ray.cluster_resources()`) lacks for this placement; replicas asking for
    a resource no node has would stay pending forever rather than fail."""
    return [f"{k} (has {cluster.get(k, 0):g}, needs {v:g})" for k, v in node_resources(cfg).items() if cluster.get(k, 0) + _EPS < v]


def tool_gpu_device(gpu: int, visible: str | None) -> str:
    """The device a `placement: slots` replica planned on tool GPU `gpu` selects, from the node's
    CUDA_VISIBLE_DEVICES (`visible`; None means every GPU of the machine is visible)."""
    if visible is None:
        return str(gpu)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if not 0 <= gpu < len(devices):
        raise ServeConfigError(
            f"tool GPU {gpu} is planned, but this Ray node sees CUDA_VISIBLE_DEVICES={visible!r}; start the node "
            f"with every tool GPU visible (placement: slots), or use placement: nodes (one Ray node per GPU)"
        )
    return devices[gpu]
