"""`canvascraft convert --to sharegpt` writes a dataset_info.json that LLaMA-Factory can load as is.

`lf_load` reads the export the way LLaMA-Factory's loader reads a `dataset_info.json` entry
(parser: `columns` and `tags` override the ShareGPT defaults; converter: a leading system message
is taken out, then user/observation and assistant/function roles must alternate and end on an
assistant turn; images resolve against the dataset folder; the multimodal plugin needs one
`<image>` placeholder per image). It is written from LLaMA-Factory's documented behaviour, not
copied from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from canvascraft import formats
from canvascraft.__main__ import main

PURE_TOOLS = str(Path(__file__).with_name("pure_tools.yaml"))
# LLaMA-Factory's ShareGPT defaults (data/README.md): what an entry without `columns`/`tags` means.
LF_DEFAULTS = {"messages": "conversations", "images": None, "role_tag": "from", "content_tag": "value", "user_tag": "human",
               "assistant_tag": "gpt", "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}


class Broken(ValueError):
    pass


def lf_load(dataset_dir: Path, name: str) -> list[dict]:
    """Rows as LLaMA-Factory's converter produces them: {system, prompt, response, images}."""
    info = json.loads((dataset_dir / "dataset_info.json").read_text())
    entry = info[name]
    assert entry.get("formatting") == "sharegpt"
    attr = dict(LF_DEFAULTS)
    attr.update({k: v for k, v in (entry.get("columns") or {}).items() if k in ("messages", "images", "system", "tools")})
    attr.update({k: v for k, v in (entry.get("tags") or {}).items() if k in LF_DEFAULTS})
    records = json.loads((dataset_dir / entry["file_name"]).read_text())
    odd = (attr["user_tag"], attr["observation_tag"])
    even = (attr["assistant_tag"], attr["function_tag"])
    rows = []
    for i, rec in enumerate(records):
        msgs = rec[attr["messages"]]
        system = ""
        if msgs and msgs[0][attr["role_tag"]] == attr["system_tag"]:
            system, msgs = msgs[0][attr["content_tag"]], msgs[1:]
        for k, m in enumerate(msgs):
            if m[attr["role_tag"]] not in (odd, even)[k % 2]:
                raise Broken(f"record {i}: message {k} has role {m[attr['role_tag']]!r}, expected one of {(odd, even)[k % 2]}")
        if len(msgs) % 2:
            raise Broken(f"record {i}: odd message count {len(msgs)}")
        images = []
        for rel in rec[attr["images"]] if attr["images"] else []:
            path = os.path.join(dataset_dir, rel)
            if not os.path.isfile(path):
                raise Broken(f"record {i}: image {rel} is not in the dataset folder")
            images.append(path)
        n_tokens = sum(m[attr["content_tag"]].count("<image>") for m in msgs)
        if n_tokens != len(images):
            raise Broken(f"record {i}: {n_tokens} <image> placeholders for {len(images)} images")
        rows.append({"system": system, "prompt": msgs[:-1], "response": msgs[-1:], "images": images})
    return rows


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lf")
    chains = tmp / "chains.yaml"  # multi-turn chains of pure tools: several tool turns and images per row
    chains.write_text("chains:\n  - {chain: Flip, weight: 1}\n  - {chain: Rotate+Flip, weight: 1}\n  - {chain: Flip+Rotate+Flip, weight: 1}\n")
    cfg = tmp / "sft.yaml"
    cfg.write_text(f"n: 5\nworkers: 1\nshard_size: 5\nchains: [{chains}]\nimages: procedural\nimage_size: 96\n")
    build = tmp / "build"
    assert main(["build-sft", "--config", str(cfg), "--out", str(build), "--no-progress", "--seed", "1", "--tools-config", PURE_TOOLS]) == 0
    out = tmp / "lf_data"
    assert main(["convert", "--to", "sharegpt", "--input", str(build), "--out", str(out)]) == 0
    return out


def test_every_row_resolves(export):
    rows = lf_load(export, "canvascraft_sft")
    records = json.loads((export / "sharegpt.json").read_text())
    assert len(rows) == len(records) == 5
    assert max(len(r["prompt"]) for r in rows) >= 4  # a multi-turn row: user, call, tool, call, tool, ...
    for row, rec in zip(rows, records):
        assert row["system"] and "Flip" in row["system"]  # the tool schemas ride in the system message
        assert row["prompt"][0]["role"] == "user" and row["response"][0]["role"] == "assistant"
        assert any(m["role"] == "tool" for m in row["prompt"])  # observation_tag "tool" maps the tool turns
        assert len(row["images"]) == len(rec["images"]) >= 2
        for p in row["images"]:
            with Image.open(p) as im:
                im.verify()


def test_loader_emulation_rejects_broken_records(export, tmp_path):
    # The check above can fail: a record whose turns do not alternate, or that lost an image.
    recs = json.loads((export / "sharegpt.json").read_text())
    for name, bad in (("swap", [{**recs[0], "messages": recs[0]["messages"][:2] + recs[0]["messages"][3:]}]),
                      ("lost", [{**recs[0], "images": recs[0]["images"][:-1]}])):
        d = tmp_path / name
        d.mkdir()
        (d / "images").symlink_to(export / "images")
        (d / "sharegpt.json").write_text(json.dumps(bad))
        formats.write_dataset_info(d, "sharegpt.json")
        with pytest.raises(Broken):
            lf_load(d, "canvascraft_sft")


def test_dataset_info_keeps_other_entries_and_refuses_junk(tmp_path):
    other = {"alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(other))
    formats.write_dataset_info(tmp_path, "sharegpt.json", "mine")
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["alpaca_en_demo"] == other["alpaca_en_demo"]
    assert info["mine"]["tags"]["observation_tag"] == "tool" and info["mine"]["columns"] == {"messages": "messages", "images": "images"}
    (tmp_path / "dataset_info.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        formats.write_dataset_info(tmp_path, "sharegpt.json")
    assert (tmp_path / "dataset_info.json").read_text() == "[1, 2"  # nothing lost


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(existing=st.one_of(json_values.map(json.dumps), st.text(max_size=30)))
def test_any_existing_dataset_info_is_merged_or_refused(tmp_path, existing):
    # Whatever a dataset folder already holds: merged when it is a JSON object, else refused untouched.
    path = tmp_path / "dataset_info.json"
    path.write_bytes(existing.encode("utf-8", "surrogatepass"))  # bytes as given: no newline translation
    try:
        parsed = json.loads(existing)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        formats.write_dataset_info(tmp_path, "sharegpt.json")
        info = json.loads(path.read_text())
        assert info["canvascraft_sft"] == formats.llamafactory_entry("sharegpt.json")
        assert {k: v for k, v in info.items() if k != "canvascraft_sft"} == {k: v for k, v in parsed.items() if k != "canvascraft_sft"}
    else:
        with pytest.raises(ValueError):
            formats.write_dataset_info(tmp_path, "sharegpt.json")
        assert path.read_bytes() == existing.encode("utf-8", "surrogatepass")
