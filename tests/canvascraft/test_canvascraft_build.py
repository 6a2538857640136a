"""CanvasCraft builds, offline: SFT/RL sets, replay, QC, resume, public formats, sources, writers."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.imageio import open_image
from canvasagent.core.policies import ReplayPolicy
from canvasagent.replay import from_trajectory, replay
from canvasagent.core.tasks import Task
from canvascraft import formats
from canvascraft.build import BuildInterrupted, load_build_config, run_build, shard_files
from canvascraft.chains import Chain, ChainSet, default_inputs
from canvascraft.plan import make_plan
from canvascraft.rl import diversity_level, length_level, task_of
from rewards.checks import CHECK_TYPES
from canvascraft.sft import build_one, missing_backends, quality_control
from canvascraft.sources import HFSource, ProceduralSource, SourceImage, make_source
from canvascraft.stats import write_report
from canvascraft.writers import LLMWriter, Phrasings, TemplateWriter
from toolserver.backends import register_backend
from toolserver.registry import REGISTRY, OutputKind
from toolserver.results import ToolResult
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

from tests.stub_openai import StubOpenAI

# -- fake model backends: exercise Grounding/SAM chains through the real runner ----------------


def fake_grounding(plumbing: bool = False):
    def call(req):
        return ToolResult(True, "Found 1 box: [250, 250, 750, 750]", OutputKind.BOXES, data={"boxes": [[250, 250, 750, 750]]}, plumbing_only=plumbing)

    return call


def fake_sam():
    def call(req):
        w, h = req.images["image"].size
        x0, y0, x1, y1 = (int(v) for v in req.args["bbox"])
        mask = Image.new("L", (w, h), 0)
        mask.paste(255, (x0 * w // 1000, y0 * h // 1000, x1 * w // 1000, y1 * h // 1000))
        return ToolResult(True, "Generated mask", OutputKind.MASK, image=mask)

    return call


def fake_ocr():
    def call(req):
        return ToolResult(True, "OPEN", OutputKind.TEXT, data={"lines": ["OPEN"]})

    return call


def fake_image(scale: int = 1):
    """Gen (no input), Edit (tints the input) or SR (scale > 1): deterministic stand-ins."""

    def call(req):
        src = req.images.get("image")
        if src is None:
            img = Image.new("RGB", (96, 96), (90, 140, 200))
            img.paste((250, 220, 0), (8, 10, 40, 30))  # off-centre, so no flip or turn is a no-op
            return ToolResult(True, "Generated image", OutputKind.IMAGE, image=img)
        out = src.convert("RGB").resize((src.width * scale, src.height * scale)) if scale > 1 else Image.blend(src.convert("RGB"), Image.new("RGB", src.size, (255, 0, 0)), 0.3)
        return ToolResult(True, "Done", OutputKind.IMAGE, image=out)

    return call


for _name, _fn in (("grounding", "fake_grounding"), ("sam", "fake_sam"), ("ocr", "fake_ocr"), ("image", "fake_image")):
    register_backend(f"cc-fake-{_name}", f"{__name__}:{_fn}")


@pytest.fixture(scope="module")
def fake_tools(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("tools") / "fake.yaml"
    p.write_text(
        "profile: canvascraft\nclient: local\nbackends:\n"
        "  Grounding: {name: cc-fake-grounding}\n  SAM: {name: cc-fake-sam}\n"
    )
    return str(p)


# Pure tools only (no model backend): fast, and independent of which backends offline.yaml gains.
PURE_TOOLS = str(Path(__file__).with_name("pure_tools.yaml"))


def _cfg(kind: str, **kw):
    base = dict(workers=1, shard_size=3, tools_config=PURE_TOOLS)
    base.update(kw)
    return load_build_config(kind, **base)


@pytest.fixture(scope="module")
def sft_build(tmp_path_factory, fake_tools) -> Path:
    out = tmp_path_factory.mktemp("sft")
    run_build("sft", _cfg("sft", n=12, tools_config=fake_tools, seed=3), out, progress=False)
    return out


@pytest.fixture(scope="module")
def rl_build(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rl")
    run_build("rl", _cfg("rl", n=8, eval_n=4, shard_size=4), out, progress=False)
    return out


# -- chains ------------------------------------------------------------------------------------


def test_chain_tables_match_paper():
    cs = ChainSet.load()
    single = {c.name: c.weight for c in cs.subset(["single"])}
    assert single["ImageEdit"] == 19378 and single["SR"] == 2000 and len(single) == 11
    hard = cs.subset(["hard"])
    assert len(hard) == 46 and sum(c.weight for c in hard) == 3808
    assert sum(c.weight for c in cs) == 142798
    assert cs.by_name("SR+Grounding+SAM+Extract+Overlay").inputs == 2
    assert cs.by_name("Gen+Edit+OCR+SR").inputs == 0


def test_user_chain_file_adds_chains(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("chains:\n  - {chain: Flip+Rotate+Flip, weight: 5, group: mine}\n")
    cs = ChainSet.load(["chains", str(p)])
    assert cs.by_name("Flip+Rotate+Flip").group == "mine"


@given(st.lists(st.sampled_from([*REGISTRY, "Gen", "Edit", "Overlay", "Nope", ""]), min_size=0, max_size=6))
def test_chain_spec_validation(parts):
    ok = bool(parts) and all(p in ("Gen", "Edit", "Overlay") or (p in REGISTRY and REGISTRY[p].family == "canvasagent") for p in parts)
    if ok:
        c = Chain.from_spec({"tools": parts})
        assert len(c.tools) == len(parts) and all(t in REGISTRY for t in c.tools)
    else:
        with pytest.raises(ValueError):
            Chain.from_spec({"tools": parts})


# -- SFT ---------------------------------------------------------------------------------------


def test_sft_rows_replay_to_the_same_final_image(sft_build, fake_tools):
    rows = formats.read_rows(shard_files(sft_build))
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    chains = {r["chain"] for r in rows}
    assert chains & {"Grounding+Crop", "Grounding+SAM+Extract", "Grounding+SAM", "Grounding"}, chains
    for row in rows:
        traj = formats.trajectory_of(row)
        assert traj.stop_reason == "terminate" and all(t.reason for t in traj.turns)
        # The replay re-executes pure tools and feeds recorded outputs to model tools.
        got, report = replay(from_trajectory(traj), make_toolbox(fake_tools))
        assert report["summary"]["errors"] == 0
        want = traj.final_asset()
        if want is None:
            assert got.final_asset() is None
        else:
            assert np.array_equal(np.asarray(got.final_asset().image), np.asarray(open_image(row["final_image"]["bytes"])))
        # ShareGPT messages: one <image> per image cell, tool role for observations.
        assert sum(m["content"].count("<image>") for m in row["messages"]) == len(row["images"])
        assert {m["role"] for m in row["messages"]} <= {"system", "user", "assistant", "tool"}


def test_replay_cli_reproduces_a_saved_trajectory(sft_build, tmp_path, fake_tools):
    from canvasagent.cli import main as canvasagent_main

    row = next(r for r in formats.read_rows(shard_files(sft_build)) if r["final_image"])
    formats.trajectory_of(row).save(tmp_path / "traj")
    assert canvasagent_main(["replay", str(tmp_path / "traj"), "--out", str(tmp_path / "rep"), "--tools-config", fake_tools]) == 0
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    final = open_image(tmp_path / "rep" / f"{report['final_asset_id']}.png")
    assert np.array_equal(np.asarray(final), np.asarray(open_image(row["final_image"]["bytes"])))


def test_every_chain_template_executes_cleanly(tmp_path):
    """All Table 7/8 chains plan, execute, pass QC and replay, with stand-ins for the models."""
    p = tmp_path / "all.yaml"
    p.write_text(
        "profile: canvascraft\nbackends:\n  Grounding: {name: cc-fake-grounding}\n  SAM: {name: cc-fake-sam}\n"
        "  OCR: {name: cc-fake-ocr}\n  ImageGeneration: {name: cc-fake-image}\n  ImageEdit: {name: cc-fake-image}\n"
        "  SR: {name: cc-fake-image, params: {scale: 2}}\n"
    )
    w = TemplateWriter()
    src = make_source("builtin", 96)
    for i, chain in enumerate(ChainSet.load()):
        tb = make_toolbox(str(p))
        got = build_one(chain, src, w, w.phrasings, tb, random.Random(i), f"c{i}")
        # OCR stand-in reads "OPEN" whatever the sign says: the only reason tolerated here.
        assert got.kept or got.reasons == ["ocr_mismatch"], (chain.name, got.reasons)
        assert got.traj.tool_sequence == list(chain.tools)
        again, report = replay(from_trajectory(got.traj), make_toolbox(str(p)))
        assert report["summary"]["errors"] == 0, chain.name


def test_chains_without_backend_are_skipped_and_plumbing_is_rejected(tmp_path):
    out = tmp_path / "b"
    run_build("sft", _cfg("sft", n=6), out, progress=False)
    t = json.loads(write_report(out)[0].read_text())["totals"]
    tb = make_toolbox(PURE_TOOLS)
    cs = ChainSet.load()
    assert t["kept"] == 6 and not any(missing_backends(cs.by_name(c), tb) for c in t["chains"])
    assert all(missing_backends(cs.by_name(c), tb) for c in t["skipped_no_backend"])
    assert t["skipped_no_backend"], "model-backed chains must be counted as skipped offline"
    # A random-weight backend's output is plumbing only: rejected unless allowed.
    p = tmp_path / "plumb.yaml"
    p.write_text("profile: canvascraft\nbackends:\n  Grounding: {name: cc-fake-grounding, params: {plumbing: true}}\n")
    tb = make_toolbox(str(p))
    chain = ChainSet.load().by_name("Grounding")
    src, w = ProceduralSource(), TemplateWriter()
    got = build_one(chain, src, w, w.phrasings, tb, random.Random(1), "x")
    assert got.reasons == ["plumbing_only"]
    assert build_one(chain, src, w, w.phrasings, tb, random.Random(1), "x", allow_plumbing=True).kept


_GOOD = '<reason>Flip it.</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'
_REPLIES = [
    _GOOD,
    '<reason>Crop.</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0, 0, 1200, 500]}}</tool_call>',
    '<reason>Flip.</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_9"}}</tool_call>',
    '<tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>',
    "<reason>x</reason><tool_call>{bad json</tool_call>",
    '<reason>OCR.</reason><tool_call>{"name": "OCR", "arguments": {"image": "img_1"}}</tool_call>',
    "<reason>Done with Flip_7.</reason><Terminate>",
    "```<reason>x</reason><Terminate>```",
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_REPLIES), min_size=1, max_size=4))
def test_qc_keeps_only_clean_complete_trajectories(replies):
    chain = Chain.from_spec("Flip")
    src = SourceImage(Image.new("RGB", (64, 48), (200, 10, 10)), meta={"objects": []})
    src.image.putpixel((0, 0), (0, 0, 0))  # asymmetric, so a flip is never a no-op
    plan = make_plan(chain, [src], random.Random(0), Profile.CANVASCRAFT)
    traj = run_episode(ReplayPolicy(replies), Task("flip", [src.image]), LocalToolbox(), EpisodeConfig(max_turns=6))
    reasons = quality_control(traj, plan)
    clean = replies == [_GOOD]
    assert (reasons == []) == clean, (replies, reasons)
    if not clean:
        assert set(reasons) <= {
            "unparsable", "invalid_parameters", "asset_reference", "execution_failed", "redundant",
            "not_terminated", "chain_incomplete",
        }


def test_qc_reasons_by_kind():
    src = SourceImage(Image.new("RGB", (64, 48), (9, 9, 9)), meta={"objects": []})
    src.image.putpixel((1, 1), (255, 0, 0))
    tb = LocalToolbox()  # pure tools only: OCR has no backend

    def qc(chain: str, replies: list[str]) -> list[str]:
        plan = make_plan(Chain.from_spec(chain), [src], random.Random(0), Profile.CANVASCRAFT)
        return quality_control(run_episode(ReplayPolicy(replies), Task("t", [src.image]), tb, EpisodeConfig(max_turns=6)), plan)

    assert qc("Flip+Flip", [_GOOD, _GOOD.replace("img_1", "Flip_0")])[:1] == []  # two flips: fine
    assert qc("Flip+Flip", [_GOOD, _GOOD])[0] == "redundant"
    assert qc("Crop", [_REPLIES[1]])[0] == "invalid_parameters"
    assert qc("Flip", [_REPLIES[2]])[0] == "asset_reference"
    assert qc("Flip", [_GOOD, _REPLIES[6]])[0] == "asset_reference"
    assert qc("OCR", [_REPLIES[5]])[0] == "execution_failed"
    assert qc("Flip", [_REPLIES[3]])[0] == "unparsable"


# -- resume ------------------------------------------------------------------------------------


def _rows_by_id(out: Path) -> dict[str, dict]:
    rows = formats.read_rows(shard_files(out))
    assert len(rows) == len({r["id"] for r in rows}), "duplicate rows"
    return {r["id"]: r for r in rows}


def test_kill_and_resume_equals_uninterrupted(tmp_path, monkeypatch):
    cfg = _cfg("sft", n=10, seed=7)
    run_build("sft", cfg, tmp_path / "full", progress=False)
    full = _rows_by_id(tmp_path / "full")

    # Killed after two shards...
    with pytest.raises(BuildInterrupted):
        run_build("sft", cfg, tmp_path / "cut", stop_after=2, progress=False)
    # ...and again by a crash mid-shard, after a shard file was written but not recorded.
    import canvascraft.sft as sft_mod

    real = sft_mod.build_sft_shard
    orphan = formats.write_parquet_atomic([], "sft", tmp_path / "cut" / "shards" / "sft-train-00003.parquet")

    def crash(cfg_, job):
        if job.index == 2:
            raise RuntimeError("simulated crash")
        return real(cfg_, job)

    monkeypatch.setattr(sft_mod, "build_sft_shard", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_build("sft", cfg, tmp_path / "cut", progress=False)
    monkeypatch.setattr(sft_mod, "build_sft_shard", real)
    assert orphan.exists()
    m = run_build("sft", cfg, tmp_path / "cut", progress=False)
    assert m["complete"]
    cut = _rows_by_id(tmp_path / "cut")
    assert cut == full  # same rows, byte for byte, no duplicates, none lost
    assert not list((tmp_path / "cut" / "shards").glob("*.tmp"))
    with pytest.raises(ValueError, match="another config"):
        run_build("sft", dataclasses.replace(cfg, seed=8), tmp_path / "cut", progress=False)


# -- RL ----------------------------------------------------------------------------------------


def test_rl_tasks_labels_checks_and_eval_split(rl_build, tmp_path):
    rows = formats.read_rows(shard_files(rl_build))
    with pytest.raises(ValueError, match="rl build"):
        shard_files(rl_build, "sft")
    assert len(shard_files(rl_build, "rl", "eval")) == 1
    train = [r for r in rows if r["split"] == "train"]
    ev = [r for r in rows if r["split"] == "eval"]
    assert len(train) == 8 and len(ev) == 4
    for r in rows:
        assert r["length"] == length_level(len(r["path"])) and r["diversity"] == diversity_level(len(set(r["path"])))
        assert r["reasoning"] in ("easy", "medium", "hard")
        assert r["prompt"] and all(c["type"] in CHECK_TYPES for c in json.loads(r["checks"]))
        assert len(r["images"]) == default_inputs(r["path"])
    # The eval split does not depend on --seed.
    other = tmp_path / "rl2"
    run_build("rl", _cfg("rl", n=3, eval_n=4, shard_size=4, seed=99), other, progress=False)
    assert {r["id"]: r for r in formats.read_rows(shard_files(other, split="eval"))} == {r["id"]: r for r in ev}


def test_rl_reference_images_for_deterministic_chains(tmp_path):
    p = tmp_path / "pure.yaml"
    p.write_text("chains:\n  - {chain: Rotate, weight: 1}\n  - {chain: Flip, weight: 1}\n  - {chain: Overlay, weight: 1}\n")
    out = tmp_path / "rl"
    run_build("rl", _cfg("rl", n=4, eval_n=0, chains=[str(p)], length={"easy": 1}), out, progress=False)
    rows = formats.read_rows(shard_files(out))
    assert rows and all(r["reference_image"] is not None for r in rows)
    from canvasagent.core.assets import AssetStore, Provenance
    from canvasagent.core.trajectory import Trajectory
    from rewards.checks import CheckContext, run_checks

    for r in rows:
        # The offline alignment judge scores the reference solution's final image as a match.
        task = task_of(r)
        store = AssetStore()
        for img in task.images:
            store.add_input(img)
        store.register_output("Flip", task.meta["reference_images"][0], OutputKind.IMAGE, Provenance(0, "Flip", {}, ("img_1",)))
        _, results = run_checks(CheckContext(Trajectory(task, store, stop_reason="terminate")), task.checks)
        ref = [x for x in results if x.type == "reference_similarity"]
        assert len(ref) == 1 and ref[0].score == pytest.approx(1.0)


# -- formats -----------------------------------------------------------------------------------


def test_public_formats_round_trip_losslessly(sft_build, rl_build, tmp_path):
    sft = formats.read_rows(shard_files(sft_build))
    path = formats.write_sharegpt(sft, tmp_path / "sg")
    assert formats.read_sharegpt(path) == sft
    # The lead's public reader parses our records too (placeholders match images).
    from canvasagent.core.formats.sharegpt import iter_records, read_record

    for rec in iter_records(path):
        read_record(rec, base_dir=path.parent)
    rl = formats.read_rows(shard_files(rl_build))
    path = formats.write_rl_json(rl, tmp_path / "rl")
    rec = json.loads(path.read_text())[0]
    assert set(rec) == {"path", "image", "prompt", "extra_info"} and {"id", "tone"} <= set(rec["extra_info"])
    assert formats.read_rl_json(path) == rl
    # Parquet back from the public files is the same too.
    formats.write_parquet_atomic(formats.read_rl_json(path), "rl", tmp_path / "rl.parquet")
    assert formats.read_rows([tmp_path / "rl.parquet"]) == rl
    ds = formats.load_hf(shard_files(sft_build))
    assert isinstance(ds[0]["images"][0], Image.Image) and len(ds) == len(sft)


def test_released_public_records_without_our_extras(tmp_path):
    """Records as the public release has them (no canvascraft extras) read into trainable rows."""
    Image.new("RGB", (20, 10), (1, 2, 3)).save(tmp_path / "a.png")
    (tmp_path / "rl.json").write_text(json.dumps([{"path": ["Flip", "OCR"], "image": ["a.png"], "prompt": "Fix it.", "extra_info": {"id": "r1", "tone": "implicit"}}]))
    (rl,) = formats.read_rl_json(tmp_path / "rl.json")
    assert rl["id"] == "r1" and rl["path"] == ["Flip", "OCR"] and rl["reasoning"] is None
    user = "img_1: <image>\nFlip it."
    msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": _GOOD}, {"role": "tool", "content": "<image>Flipped"}]
    (tmp_path / "sg.json").write_text(json.dumps([{"messages": msgs, "images": ["a.png", "a.png"]}]))
    (sft,) = formats.read_sharegpt(tmp_path / "sg.json")
    assert sft["messages"] == msgs and len(sft["images"]) == 2 and sft["n_turns"] == 1
    formats.write_parquet_atomic([sft], "sft", tmp_path / "s.parquet")
    formats.write_parquet_atomic([rl], "rl", tmp_path / "r.parquet")
    assert formats.read_rows([tmp_path / "r.parquet"]) == [rl]


def test_folder_source(tmp_path):
    for i in range(3):
        Image.new("RGB", (700, 300), (i * 60, 10, 10)).save(tmp_path / f"p{i}.jpg")
    src = make_source(str(tmp_path))
    got = src.sample(random.Random(0), frozenset({"image"}), frozenset())
    assert max(got.image.size) == 512 and got.meta["origin"].startswith("folder:")
    assert src.sample(random.Random(0), frozenset({"text"}), frozenset()) is None


def test_cli_build_stats_convert(tmp_path):
    from canvascraft.__main__ import main

    out = tmp_path / "cli"
    assert main(["build-sft", "--n", "3", "--out", str(out), "--workers", "1", "--no-progress", "--seed", "2", "--tools-config", PURE_TOOLS]) == 0
    assert (out / "stats.json").exists() and (out / "stats.png").stat().st_size > 1000
    assert main(["stats", str(out)]) == 0
    assert main(["convert", "--to", "sharegpt", "--input", str(out), "--out", str(tmp_path / "pub")]) == 0
    # The public file replays through `canvasagent replay` to the recorded final image.
    from canvasagent.cli import main as canvasagent_main

    pub = tmp_path / "pub" / "sharegpt.json"
    rec = json.loads(pub.read_text())[0]
    assert canvasagent_main(["replay", str(pub), "--index", "0", "--out", str(tmp_path / "rep"), "--tools-config", PURE_TOOLS]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    got = open_image(tmp_path / "rep" / f"{rep['final_asset_id']}.png")
    assert np.array_equal(np.asarray(got), np.asarray(open_image(pub.parent / rec["canvascraft"]["final_image"])))
    assert main(["convert", "--to", "hf", "--input", str(pub), "--out", str(tmp_path / "hf")]) == 0
    assert formats.read_rows([tmp_path / "hf" / "sft.parquet"]) == formats.read_rows(shard_files(out))


# -- sources and writers -----------------------------------------------------------------------


def test_hf_source_from_a_saved_dataset(tmp_path):
    import datasets

    imgs = [Image.new("RGB", (40 + i, 30), (i * 40, 100, 200)) for i in range(3)]
    ds = datasets.Dataset.from_dict({"img": imgs, "name": ["cup", "dog", "car"]}, features=datasets.Features({"img": datasets.Image(), "name": datasets.Value("string")}))
    ds.save_to_disk(str(tmp_path / "ds"))
    src = make_source(str(tmp_path / "ds"))
    assert isinstance(src, HFSource)
    got = src.sample(random.Random(0), frozenset({"image"}), frozenset())
    assert got is not None and got.image.mode == "RGB" and got.meta["origin"].startswith("hf:")
    assert src.sample(random.Random(0), frozenset({"objects"}), frozenset()) is None
    labelled = HFSource(str(tmp_path / "ds"), label_column="name")
    assert labelled.sample(random.Random(0), frozenset({"objects"}), frozenset()).labels[0] in {"cup", "dog", "car"}
    out = tmp_path / "b"
    run_build("sft", _cfg("sft", n=3, images=str(tmp_path / "ds")), out, progress=False)
    assert len(formats.read_rows(shard_files(out))) == 3


def test_builtin_source_scenes_and_photos():
    src = make_source("builtin")
    rng = random.Random(0)
    seen = set()
    for _ in range(30):
        s = src.sample(rng, frozenset(), frozenset({"text", "rotated"}))
        assert "text" in s.tags and s.meta["text"]
        seen.add(s.meta.get("rotation"))
    assert seen - {None}
    photos = {src.sample(random.Random(i), frozenset(), frozenset()).meta["origin"] for i in range(40)}
    assert any(o.startswith(("skimage:", "sklearn:")) for o in photos) and "procedural" in photos


def test_llm_writer_against_a_stub_server(tmp_path):
    status = {"code": 200}
    reply = {"choices": [{"message": {"role": "assistant", "content": "  Please mirror my photo.  "}}]}
    with StubOpenAI(lambda body: (status["code"], reply)) as stub:
        w = LLMWriter(base_url=stub.base_url, model="stub")
        src = ProceduralSource().sample(random.Random(0), frozenset(), frozenset({"text", "mirrored"}))
        plan = make_plan(Chain.from_spec("Flip"), [src], random.Random(0), Profile.CANVASCRAFT)
        assert w.write(plan, random.Random(0), "implicit") == "Please mirror my photo."
        body = stub.requests[-1]
        assert body["_path"] == "/v1/chat/completions" and body["model"] == "stub"
        assert "Flip" in body["messages"][1]["content"] and "implicit" in body["messages"][0]["content"].lower()
        status["code"] = 500
        text = w.write(plan, random.Random(0), "explicit")
        assert w.failures == 1 and text and text != "Please mirror my photo."
        # Wired through a build config: every instruction comes from the endpoint.
        status["code"] = 200
        out = tmp_path / "llm"
        run_build("sft", _cfg("sft", n=2, writer="llm", llm={"base_url": w.base_url, "model": "stub"}), out, progress=False)
        rows = formats.read_rows(shard_files(out))
        assert [r["instruction"] for r in rows] == ["Please mirror my photo."] * 2 and {r["writer"] for r in rows} == {"llm"}


def test_template_writer_varies_phrasing_and_tone():
    w = TemplateWriter(Phrasings.load())
    src = ProceduralSource().sample(random.Random(0), frozenset(), frozenset({"text"}))
    plan = make_plan(ChainSet.load().by_name("Overlay"), [src], random.Random(0), Profile.CANVASCRAFT)
    texts = {w.write(plan, random.Random(i), tone) for i in range(20) for tone in ("explicit", "implicit")}
    assert len(texts) > 10 and all(plan.steps[0].params["text"] in t for t in texts)
