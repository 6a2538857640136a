"""Command-line errors are one or two lines naming the valid choices; tracebacks only with --debug;
third-party INFO chatter stays out of the terminal."""

from __future__ import annotations

import argparse
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.cli import main as canvasagent_main
from canvasagent.cli.errors import THIRD_PARTY_LOGGERS, run_command
from canvasagent.train import main as train_main


def _err_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()


def test_bad_training_config_name(capsys):
    assert train_main(["grpo", "--config", "grpo_tiny_cpuu", "--dry-run"]) == 2
    (line,) = _err_lines(capsys)
    assert line.startswith("error: no training config 'grpo_tiny_cpuu'; choose a YAML path or one of:") and "grpo_tiny_cpu," in line


def test_bad_training_key_and_value(capsys):
    assert train_main(["sft", "--config", "sft_tiny_cpu", "--set", "optim.lerning_rate=1", "--dry-run"]) == 2
    (line,) = _err_lines(capsys)
    assert "unknown config keys ['lerning_rate']" in line and "'learning_rate'" in line
    assert train_main(["sft", "--config", "sft_tiny_cpu", "--set", "data.format=parquet", "--dry-run"]) == 2
    (line,) = _err_lines(capsys)
    assert line == "error: unknown data.format 'parquet'; choose from scripted, easel, easel-data, canvascraft, sharegpt, rl-json, mixed"
    assert train_main(["sft", "--config", "grpo_tiny_cpu", "--dry-run"]) == 2
    (line,) = _err_lines(capsys)
    assert "is a grpo config, not sft" in line
    assert train_main(["sft", "--config", "sft_tiny_cpu", "--set", "nokeyvalue"]) == 2
    assert _err_lines(capsys) == ["error: override 'nokeyvalue' is not KEY=VALUE"]


def test_debug_shows_the_traceback():
    with pytest.raises(ValueError, match="no training config"):
        train_main(["grpo", "--config", "grpo_tiny_cpuu", "--dry-run", "--debug"])


def test_bad_tools_config_name_lists_choices(capsys, tmp_path):
    assert canvasagent_main(["tools", "call", "Crop", "--out", str(tmp_path), "--tools-config", "ofline"]) == 2
    (line,) = _err_lines(capsys)
    assert line.startswith("error: no tools config 'ofline'; choose a YAML path or one of:") and "offline," in line


def test_unexpected_errors_are_two_lines(capsys):
    def boom(args):
        raise RuntimeError("the tool server said\n  something long")

    assert run_command(boom, argparse.Namespace()) == 2
    assert _err_lines(capsys) == ["error: RuntimeError: the tool server said something long", "(run again with --debug for the traceback)"]
    with pytest.raises(RuntimeError):
        run_command(boom, argparse.Namespace(debug=True))

    class ServiceDown(RuntimeError):  # errors of our own carry messages written for users: one line
        pass

    def down(args):
        raise ServiceDown("judge at http://127.0.0.1:8100/v1: connection refused")

    assert run_command(down, argparse.Namespace()) == 2
    assert _err_lines(capsys) == ["error: judge at http://127.0.0.1:8100/v1: connection refused"]


def test_third_party_info_is_quiet_by_default(capsys, caplog):
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    assert canvasagent_main(["tools", "list"]) == 0
    capsys.readouterr()
    with caplog.at_level(logging.INFO):  # the root at INFO, as the CLI sets it
        logging.getLogger("httpx").info('HTTP Request: POST http://127.0.0.1:8000/v1/tools/Crop "HTTP/1.1 200 OK"')
        logging.getLogger("canvasagent.core.episode").info("ours")
    assert [r.name for r in caplog.records] == ["canvasagent.core.episode"]
    assert all(logging.getLogger(n).level == logging.WARNING for n in THIRD_PARTY_LOGGERS)


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=30).filter(lambda s: not s.startswith("-") and "\x00" not in s))
def test_any_config_name_gives_one_line(name):
    # Whatever the user types as a config name: exit 2 (or a dry run's 0/1), never a traceback.
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = train_main(["sft", "--config", name, "--dry-run"])
    assert rc in (0, 1, 2) and "Traceback" not in err.getvalue()
    if rc == 2:
        assert err.getvalue().startswith("error: ")


@pytest.mark.parametrize("main_fn,argv,choice", [
    (train_main, ["sftt", "--config", "x"], "(choose from 'sft', 'grpo')"),
    (canvasagent_main, ["nosuch"], "'tools'"),
    (canvasagent_main, ["tools", "list", "--family", "painters"], "(choose from 'all', 'canvasagent', 'easel')"),
])
def test_usage_errors_are_two_lines_naming_the_choices(capsys, main_fn, argv, choice):
    with pytest.raises(SystemExit) as e:
        main_fn(argv)
    assert e.value.code == 2
    lines = _err_lines(capsys)
    assert len(lines) == 2 and lines[0].startswith("error: argument") and choice in lines[0] and lines[1].endswith("-h` for the options)")


def test_canvascraft_usage_error(capsys):
    from canvascraft.__main__ import main as canvascraft_main

    with pytest.raises(SystemExit):
        canvascraft_main(["convert", "--to", "parquet", "--input", "a", "--out", "b"])
    assert _err_lines(capsys) == ["error: argument --to: invalid choice: 'parquet' (choose from 'sharegpt', 'rl-json', 'hf')",
                                  "(see `canvascraft convert -h` for the options)"]
