"""YAML configs loaded into dataclasses, and the tools config (`ToolsConfig`).

Every package's config loader uses `find_config` and `from_dict`. The toolbox a `ToolsConfig`
asks for is `toolserver.client.make_toolbox`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import yaml

from toolserver.limits import Limits
from toolserver.registry import REGISTRY

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"

T = TypeVar("T")


def find_config(name_or_path: str | Path, kind: str) -> Path:
    """`offline` -> configs/<kind>/offline.yaml; an existing path is used as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    cand = CONFIG_DIR / kind / f"{name_or_path}.yaml"
    if cand.exists():
        return cand
    raise FileNotFoundError(f"no {kind} config {name_or_path!r} (looked for {p} and {cand})")


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
    """Build a (nested) dataclass from a dict, refusing unknown keys so typos fail loudly."""
    data = dict(data or {})
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown config keys {sorted(unknown)}; allowed: {sorted(names)}")
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        t = hints.get(k)
        if is_dataclass(t) and isinstance(v, dict):
            v = from_dict(t, v)  # type: ignore[arg-type]
        elif is_dataclass(t) and v is not None and not isinstance(v, t):  # type: ignore[arg-type]
            raise ValueError(f"{cls.__name__}.{k}: expected a mapping of {t.__name__} settings, got {type(v).__name__} {v!r}")
        kwargs[k] = v
    return cls(**kwargs)


def load_yaml(path: str | Path) -> dict[str, Any]:
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at top level")
    return data


@dataclass
class BackendConfig:
    name: str | None = None  # a key of toolserver.backends.BACKEND_FACTORIES, or none
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolsConfig:
    profile: str = "canvascraft"  # canvascraft | exact
    client: str = "local"  # local | ray | http
    url: str | None = None  # for client=http
    token_env: str = "CANVASAGENT_TOOLSERVER_TOKEN"
    ray_app: str = "toolserver"  # Serve application name (client=ray)
    shm: bool | None = None  # client=ray: images through /dev/shm on one host (None: when usable)
    max_pixels: int = 40_000_000
    backends: dict[str, BackendConfig] = field(default_factory=dict)
    # Tool calls a training process runs at once across its rollouts (the GRPO tool pool), and
    # per-tool caps under it (e.g. ImageEdit: 8 when one tool GPU batches 8). None: one per rollout.
    max_concurrent_calls: int | None = None
    concurrency: dict[str, int] = field(default_factory=dict)
    # Refused before any work, in-process as on a server (docs/serving.md, "Limits").
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def load(cls, name_or_path: str | Path = "offline") -> "ToolsConfig":
        path = find_config(name_or_path, "tools")
        data = load_yaml(path)
        backends = {k: BackendConfig(**(v or {})) for k, v in (data.pop("backends", None) or {}).items()}
        cfg = from_dict(cls, data)
        cfg.backends = backends
        cfg.check_concurrency()
        bad = cfg.limits.problems()
        if bad:
            raise ValueError(f"{path}: " + "; ".join(bad))
        return cfg

    def check_concurrency(self) -> None:
        """Refuse a pool size or per-tool cap that is not a positive integer, or names no tool."""
        if self.max_concurrent_calls is not None and (
            not isinstance(self.max_concurrent_calls, int) or isinstance(self.max_concurrent_calls, bool) or self.max_concurrent_calls < 1
        ):
            raise ValueError(f"tools config: max_concurrent_calls must be an integer >= 1, got {self.max_concurrent_calls!r}")
        if not isinstance(self.concurrency, dict):
            raise ValueError(f"tools config: concurrency must map tool names to integers, got {self.concurrency!r}")
        for tool, n in self.concurrency.items():
            if tool not in REGISTRY:
                raise ValueError(f"tools config: concurrency names unknown tool {tool!r}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"tools config: concurrency.{tool} must be an integer >= 1, got {n!r}")
