"""Preflight: what would stop a run, checked before any weights load.

`preflight(cfg)` returns the problems that would stop a run, one readable line each, and never
raises for them: data paths and starting checkpoints that do not exist, optional packages the
config asks for that do not import (vLLM for `grpo.use_vllm`, DeepSpeed for `run.deepspeed`,
flash-attn for `model.attn_implementation`, the `run.report_to` loggers), launcher files that
are missing or disagree, and services that do not answer: the HTTP judge (`grpo.judge: http`),
a remote toolserver (`client: http | ray` tools configs) and a vLLM server (`vllm_mode: server`).
Every endpoint line names the service and its address. `require_ready(cfg)` raises
`PreflightError` with that list; the real run calls it before it loads a model.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import socket
from pathlib import Path

from canvasagent.training.common import validate_launcher
from canvasagent.training.config import TINY, TrainConfig
from canvasagent.training.env import load_tools_config
from canvasagent.training.sources import source_of
from toolserver.client import DEFAULT_HTTP_URL

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# model.attn_implementation -> the module it needs (None: built into torch/transformers).
_ATTN_MODULES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
_REPORT_TO_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml",
                      "clearml": "clearml", "trackio": "trackio", "swanlab": "swanlab"}


class PreflightError(RuntimeError):
    """A run cannot start; `problems` lists why, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("the run cannot start:\n" + "\n".join(f"  - {p}" for p in self.problems))


def require_ready(cfg: TrainConfig) -> None:
    """Raise `PreflightError` when `preflight(cfg)` finds anything."""
    problems = preflight(cfg)
    if problems:
        raise PreflightError(problems)


def preflight(cfg: TrainConfig, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """Everything that would stop `cfg` from starting, as readable lines (empty: it can start)."""
    problems = [*_files(cfg), *_packages(cfg), *_endpoints(cfg, timeout_s)]
    log.debug("preflight: %d problem(s)", len(problems))
    return problems


def _files(cfg: TrainConfig) -> list[str]:
    out: list[str] = []
    source = source_of(cfg)
    if source.needs_path:
        p = cfg.resolve(cfg.data.path)
        if p is None or not p.exists():
            out.append(f"data.path: {cfg.data.path} does not exist{source.path_hint(cfg)}")
    if cfg.kind == "grpo" and cfg.run.init_from:
        # An SFT checkpoint folder: it has to be here already (a Hub id only when cached).
        out += _checkpoint("run.init_from", cfg.run.init_from, cfg, download=False)
    elif cfg.model.name_or_path != TINY:
        out += _checkpoint("model.name_or_path", cfg.model.name_or_path, cfg)
    if cfg.kind == "grpo" and cfg.grpo.judge == "local":
        try:
            judge_model = _reward_config(cfg).judges.local.model
        except (OSError, ValueError) as e:
            out.append(f"grpo.reward_preset: {' '.join(str(e).split())}")
        else:
            out += _checkpoint("the local judge's model", judge_model, cfg) if judge_model else ["the local judge has no model (judges.local.model)"]
    try:
        validate_launcher(cfg)
    except (OSError, ValueError) as e:
        out.append(" ".join(str(e).split()))
    try:
        if source.uses_tools_config:
            load_tools_config(cfg)
    except (OSError, ValueError) as e:
        out.append(f"tools.config: {' '.join(str(e).split())}")
    return out


def _checkpoint(field_name: str, ref: str, cfg: TrainConfig, download: bool = True) -> list[str]:
    """A local checkpoint dir must exist (with its config.json); a Hub id must be in the local
    cache unless `download` is allowed and HF_HUB_OFFLINE is not set."""
    p = cfg.resolve(ref)
    if p is not None and p.exists():
        return [] if (p / "config.json").exists() or not p.is_dir() else [f"{field_name}: {ref} has no config.json (not a checkpoint folder)"]
    if not _HUB_ID.match(ref) or ref.startswith((".", "/")):
        return [f"{field_name}: {ref} does not exist"]
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(ref, "config.json"), str)
    except Exception:  # noqa: BLE001 - an unusable cache dir reads as "not cached"
        cached = False
    if cached:
        return []
    if not download:
        return [f"{field_name}: {ref} does not exist (neither a local folder nor a cached Hub model)"]
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return [f"{field_name}: {ref} is neither a local folder nor in the local Hugging Face cache, and HF_HUB_OFFLINE is set"]
    log.info("preflight: %s %s is not cached; the run will download it from the Hub", field_name, ref)
    return []


def _wanted_packages(cfg: TrainConfig) -> dict[str, str]:
    """Module -> the config setting that asks for it."""
    want: dict[str, str] = {}
    if cfg.kind == "grpo" and cfg.grpo.use_vllm:
        want["vllm"] = "grpo.use_vllm: true"
    if cfg.run.deepspeed:
        want["deepspeed"] = f"run.deepspeed: {cfg.run.deepspeed}"
    attn = cfg.model.attn_implementation or ""
    if attn in _ATTN_MODULES:
        want[_ATTN_MODULES[attn]] = f"model.attn_implementation: {attn}"
    elif "/" in attn:  # a Hub kernel, e.g. kernels-community/flash-attn
        want["kernels"] = f"model.attn_implementation: {attn}"
    if cfg.lora.enabled:
        want["peft"] = "lora.enabled: true"
    for r in cfg.run.report_to:
        if r in _REPORT_TO_MODULES:
            want[_REPORT_TO_MODULES[r]] = f"run.report_to: {r}"
    return want


def _packages(cfg: TrainConfig) -> list[str]:
    out = []
    for module, why in _wanted_packages(cfg).items():
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - a broken install (ImportError, OSError from a CUDA lib, ...) counts as missing
            out.append(f"{why} needs the {module} package, which does not import ({type(e).__name__}: {' '.join(str(e).split())[:160]})")
    return out


def _reward_config(cfg: TrainConfig):
    from rewards.config import load_reward_config

    return load_reward_config(cfg.grpo.reward_preset)


def _endpoints(cfg: TrainConfig, timeout_s: float) -> list[str]:
    out: list[str] = []
    source = source_of(cfg)
    if cfg.kind == "grpo" and cfg.grpo.judge == "http" and source.judged:
        try:
            http = _reward_config(cfg).judges.http
        except (OSError, ValueError) as e:
            out.append(f"grpo.reward_preset: {' '.join(str(e).split())}")
        else:
            url = (os.environ.get(http.base_url_env) or http.base_url).rstrip("/")
            key = http.api_key or os.environ.get(http.api_key_env, "")
            out += _probe_http("judge", url, url + "/models", key, timeout_s)
    if source.needs_toolserver(cfg):
        try:
            tc = load_tools_config(cfg)
        except (OSError, ValueError):
            tc = None  # reported under files
        if tc is not None and tc.client == "http":
            url = (tc.url or DEFAULT_HTTP_URL).rstrip("/")
            out += _probe_http("toolserver", url, url + "/healthz", os.environ.get(tc.token_env, ""), timeout_s)
        elif tc is not None and tc.client == "ray":
            out += _probe_ray(tc.url, timeout_s)
    if cfg.kind == "grpo" and cfg.grpo.use_vllm and cfg.grpo.vllm_mode == "server":
        # Without a base URL TRL's client uses vllm_server_host/port (default 0.0.0.0:8000).
        host, port = cfg.trl_args.get("vllm_server_host", "0.0.0.0"), cfg.trl_args.get("vllm_server_port", 8000)
        url = (cfg.grpo.vllm_server_base_url or f"http://{host}:{port}").rstrip("/")
        out += _probe_http("vLLM server", url, url + "/health", "", timeout_s)
    return out


def _probe_http(service: str, shown: str, url: str, token: str, timeout_s: float) -> list[str]:
    """Any HTTP answer means the service is up; no answer or a refused key is a problem."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.ConnectError as e:
        return [f"{service} at {shown}: {_reason(e)}"]
    except httpx.TimeoutException:
        return [f"{service} at {shown}: no answer within {timeout_s:g} s"]
    except httpx.HTTPError as e:
        return [f"{service} at {shown}: {type(e).__name__}: {_reason(e)}"]
    if r.status_code in (401, 403):
        return [f"{service} at {shown}: refused the credentials (HTTP {r.status_code}); check the API key / token variable"]
    return []


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text[:200]


def _probe_ray(address: str | None, timeout_s: float) -> list[str]:
    """The Ray cluster's GCS accepts a TCP connection (joining the cluster is the run's job)."""
    shown = address or "auto"
    resolved = _ray_address(address)
    if resolved is None:
        return [f"toolserver (Ray cluster at {shown}): no running Ray cluster found (start one with `ray start --head` and `toolserver serve`)"]
    target = resolved.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return []
    except (ValueError, OverflowError):  # no port, a port out of range, a NUL in the host, ...
        return [f"toolserver (Ray cluster at {shown}): cannot read host:port from {resolved!r:.80}"]
    except OSError as e:
        why = "connection refused" if isinstance(e, ConnectionRefusedError) else " ".join(str(e).split())
        return [f"toolserver (Ray cluster at {resolved}): {why}"]


def _ray_address(address: str | None) -> str | None:
    """host:port of the cluster `address` names ("auto"/None: RAY_ADDRESS, then the cluster
    `ray start` left on this node), or None when there is none."""
    if address and address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return env
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None
    except Exception:  # noqa: BLE001 - private API moved: fall back to the file `ray start` writes
        f = Path("/tmp/ray/ray_current_cluster")
        found = f.read_text().strip() if f.exists() else None
    return found if found and found != "auto" else None
