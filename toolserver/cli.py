"""`toolserver serve --config configs/serve/local_cpu.yaml [--dry-run]` and `toolserver status`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from contextlib import suppress
from typing import Mapping, Sequence

from toolserver.config import find_config, load_yaml
from toolserver.serve_config import ServeConfig, ServeConfigError, check_bind, check_placement, missing_node_resources, node_resources


def local_ray_options(cfg: ServeConfig, address: str | None) -> dict:
    """`ray.init` options for `serve`: for a private local Ray (no `address`), no dashboard, and
    under `placement: slots` the per-GPU resources with no Ray GPUs. An existing cluster
    (`ray start`, which --detach needs) keeps its own settings."""
    if address is not None:
        return {}
    opts: dict = {"include_dashboard": False}
    if cfg.placement == "slots":
        # Our own node owns the tool GPUs: it declares one resource per GPU, and no Ray GPUs, so
        # nothing else scheduled here is handed a device the tools already use.
        opts.update(resources=node_resources(cfg), num_gpus=0)
    return opts


def ray_exposure_warning(address: str | None, env: Mapping[str, str]) -> str | None:
    """A warning for a private local Ray with `RAY_AUTH_MODE=disabled`, else None: Ray 2.60's GCS,
    raylet and agents listen on every interface whatever `ray.init` is told (`_node_ip_address`
    included), and its token auth is what guards them."""
    if address is None and env.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return (
            "RAY_AUTH_MODE=disabled: this private Ray's GCS and raylet ports listen on all interfaces without "
            "authentication; unset RAY_AUTH_MODE, or firewall them (docs/serving.md, Auth)"
        )
    return None


def _serve(args: argparse.Namespace) -> int:
    try:
        data = load_yaml(find_config(args.config, "serve"))
        if args.backends_from:
            data["backends_from"] = args.backends_from
        cfg = ServeConfig.from_dict(data)
        if args.host:
            cfg.http.host = args.host
        if args.port:
            cfg.http.port = args.port
        cfg.check()
    except (ServeConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from toolserver.backends import BACKEND_FACTORIES

    report = check_placement(cfg, set(BACKEND_FACTORIES))
    token = os.environ.get(cfg.http.token_env) or None
    try:
        check_bind(cfg.http, token)
    except ServeConfigError as e:
        report.errors.append(str(e))
    print(report.render())
    if args.dry_run or not report.ok:
        return 0 if report.ok else 1

    import ray

    from toolserver.serve_app import deploy
    from toolserver.wire import sweep_orphaned_slots

    # The ingress sweeps its own node when it starts; this covers the host `serve` runs on,
    # where clients of a previous server may have been killed (its ingress may land elsewhere).
    if swept := sweep_orphaned_slots():
        print(f"removed {swept} /dev/shm slot file(s) left by dead toolserver processes")
    if cfg.placement == "nodes" and args.address is None:
        print("error: placement: nodes needs a cluster of one Ray node per tool GPU (--address); see docs/serving.md", file=sys.stderr)
        return 1
    if warning := ray_exposure_warning(args.address, os.environ):
        print(f"warning: {warning}", file=sys.stderr)
    try:
        ray.init(address=args.address, log_to_driver=True, **local_ray_options(cfg, args.address))
    except ConnectionError as e:
        print(f"error: no Ray cluster at {args.address!r} ({e}); start one with `ray start --head` or omit --address", file=sys.stderr)
        return 1
    if missing := missing_node_resources(cfg, ray.cluster_resources()):
        # Replicas asking for a resource no node has would wait forever instead of failing.
        print(f"error: placement: {cfg.placement} needs node resources the cluster lacks: {', '.join(missing)}; see docs/serving.md", file=sys.stderr)
        return 1
    ingress = deploy(cfg, token)
    described = ingress.describe.remote().result(timeout_s=120)
    for tool, d in sorted(described.items()):
        flag = "  WARNING: random weights, plumbing only" if d["plumbing_only"] else ""
        device = f" CUDA_VISIBLE_DEVICES={d['cuda_visible_devices']}" if d.get("cuda_visible_devices") is not None else ""
        print(f"  {tool:16s} {','.join(d['tools'])} backend={d['backend']}{' batched' if d['batched'] else ''}{device}{flag}")
    if cfg.http.enabled:
        print(f"serving {cfg.app_name!r} on http://{cfg.http.host}:{cfg.http.port}  (health: /healthz, tools: /v1/tools)")
    else:
        print(f"serving {cfg.app_name!r} to Ray handles only (HTTP disabled)")
    if args.detach:
        return 0
    print("Ctrl-C to stop")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with suppress(KeyboardInterrupt):
        stop.wait()
    from ray import serve

    serve.delete(cfg.app_name)
    return 0


def _status(args: argparse.Namespace) -> int:
    rc = 0
    if args.url:
        import httpx

        try:
            r = httpx.get(args.url.rstrip("/") + "/healthz", timeout=5)
            print(f"{args.url}/healthz: HTTP {r.status_code} {r.text[:500]}")
            rc = 0 if r.status_code == 200 else 1
        except httpx.HTTPError as e:
            print(f"{args.url}/healthz: unreachable ({e})")
            rc = 1
    if args.url and args.address is None:
        return rc
    import ray
    from ray import serve

    try:
        ray.init(address=args.address or "auto", log_to_driver=False)
    except ConnectionError as e:
        print(f"no Ray cluster at {args.address or 'auto'}: {e}")
        return 1
    status = serve.status()
    app = status.applications.get(args.app)
    if app is None:
        print(f"no Serve application {args.app!r}; running: {', '.join(status.applications) or 'none'}")
        return 1
    out = {
        "app": args.app,
        "status": str(app.status.value if hasattr(app.status, "value") else app.status),
        "deployments": {
            name: {
                "status": str(d.status.value if hasattr(d.status, "value") else d.status),
                "replicas": {str(k.value if hasattr(k, "value") else k): v for k, v in d.replica_states.items()},
                "message": d.message,
            }
            for name, d in app.deployments.items()
        },
        "proxies": {node: str(p.value if hasattr(p, "value") else p) for node, p in status.proxies.items()},
    }
    print(json.dumps(out, indent=2))
    return rc if out["status"] == "RUNNING" else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolserver", description="Serve the CanvasAgent toolbox with Ray Serve.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="deploy the tool server")
    s.add_argument("--config", default="local_cpu", help="configs/serve/<name>.yaml or a path")
    s.add_argument("--backends-from", default=None, help="override backends_from: a configs/tools/<name>.yaml, e.g. offline_plumbing")
    s.add_argument("--dry-run", action="store_true", help="validate the config and GPU placement; load nothing")
    s.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one; 'auto' joins `ray start`)")
    s.add_argument("--host", default=None, help="override http.host")
    s.add_argument("--port", type=int, default=None, help="override http.port")
    s.add_argument("--detach", action="store_true", help="return after deploying (needs a cluster that outlives this process)")
    s.set_defaults(func=_serve)
    st = sub.add_parser("status", help="show the running tool server")
    st.add_argument("--address", default=None, help="Ray cluster (default: auto)")
    st.add_argument("--app", default="toolserver")
    st.add_argument("--url", default=None, help="also (or only) check http://HOST:PORT/healthz")
    st.set_defaults(func=_status)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("TOOLSERVER_LOG", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
