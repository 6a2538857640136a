"""The preflight: a dry run (and the real run) names every missing file, package and service."""

from __future__ import annotations

import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.train import main
from canvasagent.training import dry_run, run
from canvasagent.training.config import TrainConfig
from canvasagent.training.preflight import PreflightError, _probe_ray, preflight


def dead_port() -> int:
    """A port nothing listens on: bound once by us, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Answering:
    """A real HTTP server on 127.0.0.1 answering every GET with `status`; keeps the paths asked."""

    def __init__(self, status: int = 200):
        paths = self.paths = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                paths.append(self.path)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def grpo(tmp_path, **overrides):
    return TrainConfig.load("grpo_tiny_cpu", {"run.output_dir": str(tmp_path / "run"), "run.init_from": None, **overrides})


def test_clean_config_has_no_problems(tmp_path):
    assert preflight(grpo(tmp_path)) == []


def test_missing_data_and_checkpoint(tmp_path, capsys, monkeypatch):
    cfg = TrainConfig.load("sft_tiny_cpu", {"run.output_dir": str(tmp_path), "data.format": "canvascraft", "data.path": str(tmp_path / "nope")})
    (problem,) = preflight(cfg)
    assert problem.startswith("data.path:") and str(tmp_path / "nope") in problem and "build-sft" in problem
    report = dry_run(cfg)
    assert report["ok"] is False and report["problems"] == [problem]

    ckpt = tmp_path / "sft_final"
    problems = preflight(grpo(tmp_path, **{"run.init_from": str(ckpt)}))
    assert problems == [f"run.init_from: {ckpt} does not exist"]
    ckpt.mkdir()  # a folder without config.json is not a checkpoint either
    assert "no config.json" in preflight(grpo(tmp_path, **{"run.init_from": str(ckpt)}))[0]
    # A relative folder that looks like a Hub id is not downloaded for init_from, online or not.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert preflight(grpo(tmp_path, **{"run.init_from": "runs_nowhere/final"})) == [
        "run.init_from: runs_nowhere/final does not exist (neither a local folder nor a cached Hub model)"]

    # The CLI: JSON on stdout with ok false, the list on stderr, exit 1.
    rc = main(["sft", "--config", "sft_tiny_cpu", "--dry-run", "--output-dir", str(tmp_path), "--set", "data.format=canvascraft",
               "--set", f"data.path={tmp_path / 'nope'}"])
    out, err = capsys.readouterr()
    assert rc == 1 and '"ok": false' in out and "the run cannot start" in err and "data.path" in err and "Traceback" not in err


def test_missing_package(tmp_path, monkeypatch):
    # None in sys.modules makes `import vllm` fail the way a missing install does, on any machine.
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    cfg = grpo(tmp_path, **{"grpo.use_vllm": True, "model.attn_implementation": "flash_attention_2"})
    problems = preflight(cfg)
    assert len(problems) == 2
    assert problems[0].startswith("grpo.use_vllm: true needs the vllm package")
    assert problems[1].startswith("model.attn_implementation: flash_attention_2 needs the flash_attn package")
    assert dry_run(cfg)["ok"] is False
    # A package that imports is not a problem: peft is a dependency.
    assert preflight(grpo(tmp_path, **{"lora.enabled": True})) == []


def test_dead_judge_toolserver_and_ray(tmp_path, monkeypatch):
    port = dead_port()
    monkeypatch.setenv("CANVASAGENT_JUDGE_BASE_URL", f"http://127.0.0.1:{port}/v1")
    assert preflight(grpo(tmp_path, **{"grpo.judge": "http"})) == [f"judge at http://127.0.0.1:{port}/v1: connection refused"]

    tools = tmp_path / "tools.yaml"
    tools.write_text(f"client: http\nurl: http://127.0.0.1:{port}\n")
    assert preflight(grpo(tmp_path, **{"tools.config": str(tools)})) == [f"toolserver at http://127.0.0.1:{port}: connection refused"]

    monkeypatch.setitem(sys.modules, "vllm", sys)  # "installed": only the server is missing here
    vllm = grpo(tmp_path, **{"grpo.use_vllm": True, "grpo.vllm_mode": "server", "grpo.vllm_server_base_url": f"http://127.0.0.1:{port}"})
    assert preflight(vllm) == [f"vLLM server at http://127.0.0.1:{port}: connection refused"]

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert preflight(grpo(tmp_path, **{"tools.config": "remote_ray"})) == [f"toolserver (Ray cluster at 127.0.0.1:{port}): connection refused"]
    # SFT on a built dataset runs no tools, so the toolserver is not needed there.
    sft = TrainConfig.load("sft_tiny_cpu", {"run.output_dir": str(tmp_path), "tools.config": "remote_ray", "data.format": "sharegpt",
                                            "data.path": str(tools)})
    assert preflight(sft) == []


def test_live_services_pass(tmp_path, monkeypatch):
    with Answering(200) as judge, Answering(200) as server:
        monkeypatch.setenv("CANVASAGENT_JUDGE_BASE_URL", judge.url + "/v1")
        tools = tmp_path / "tools.yaml"
        tools.write_text(f"client: http\nurl: {server.url}\n")
        assert preflight(grpo(tmp_path, **{"grpo.judge": "http", "tools.config": str(tools)})) == []
        assert judge.paths == ["/v1/models"] and server.paths == ["/healthz"]
    with Answering(401) as judge:
        monkeypatch.setenv("CANVASAGENT_JUDGE_BASE_URL", judge.url + "/v1")
        (problem,) = preflight(grpo(tmp_path, **{"grpo.judge": "http"}))
        assert problem.startswith(f"judge at {judge.url}/v1: refused the credentials (HTTP 401)")


def test_real_run_stops_before_loading_a_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CANVASAGENT_JUDGE_BASE_URL", f"http://127.0.0.1:{dead_port()}/v1")
    cfg = grpo(tmp_path, **{"grpo.judge": "http"})
    with pytest.raises(PreflightError) as e:
        run(cfg)
    assert "judge at" in e.value.problems[0]
    assert not (tmp_path / "run" / "tiny_base").exists()  # the tiny policy was never built
    rc = main(["grpo", "--config", "grpo_tiny_cpu", "--output-dir", str(tmp_path / "run"), "--set", "run.init_from=null",
               "--set", "grpo.judge=http"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: the run cannot start:\n  - judge at http://127.0.0.1:") and "Traceback" not in err


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=40), st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "", "[::1]", "\x00"]),
                                                  st.integers(-5, 200_000))))
def test_ray_address_never_raises(address):
    # Whatever RAY_ADDRESS / tools.url holds, the probe answers with problem lines, never an exception.
    out = _probe_ray(address if address.strip() else "127.0.0.1:1", 0.2)
    assert isinstance(out, list) and all(isinstance(p, str) and p.startswith("toolserver (Ray cluster at") for p in out)
