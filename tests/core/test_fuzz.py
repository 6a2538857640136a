"""Property tests over the parser, the validator and the episode runner (>= 10k cases in all)."""

import json
import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig
from canvasagent.core.protocol import FindingCode, format_reply, parse_reply
from canvasagent.core.tasks import Task
from toolserver.registry import REGISTRY
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile, validate_call

FAST = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
MEDIUM = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))

tags = st.sampled_from(["<reason>", "</reason>", "<tool_call>", "</tool_call>", "<Terminate>", "```", "{", "}", '"name"', ":", ","])
fragments = st.lists(st.one_of(tags, st.text(max_size=12)), max_size=12).map("".join)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20)
)
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(st.text(max_size=8), c, max_size=5)), max_leaves=12)
names = st.one_of(st.sampled_from(sorted(REGISTRY)), st.text(max_size=15))
asset_ids = st.sampled_from(["img_1", "img_2", "Crop_0", "Flip_0", "SAM_0", "../../etc/passwd", "", "img_1 ", "IMG_1"])
coord = st.one_of(st.integers(-50, 1200), st.floats(-1e7, 1e7), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300]), st.text(max_size=5))
bbox = st.one_of(
    st.lists(coord, min_size=0, max_size=6),
    st.lists(st.integers(0, 1000), min_size=4, max_size=4).map(lambda v: f"[{v[0]}, {v[1]}, {v[2]}, {v[3]}]"),
    st.text(max_size=20),
)
arg_values = st.one_of(asset_ids, bbox, json_scalars, st.sampled_from([45, 90, 180, "90", "text", "object"]))


def _args_for(name):
    spec = REGISTRY.get(name)
    keys = list(spec.arg_names) if spec else []
    return st.dictionaries(st.sampled_from(keys + ["extra", "image_ref"]), arg_values, max_size=len(keys) + 2)


structured_calls = names.flatmap(lambda n: st.tuples(st.just(n), _args_for(n)))


@FAST
@given(fragments)
def test_parser_never_raises_on_arbitrary_text(text):
    p = parse_reply(text)
    assert all(f.code in FindingCode for f in p.findings)
    if p.call is not None:
        assert isinstance(p.call.arguments, dict) and len(p.calls) == 1
    if not text.strip():
        assert p.findings[0].code is FindingCode.EMPTY_REPLY


@FAST
@given(st.text(max_size=40), structured_calls, st.booleans())
@example("ok", ("</tool_call>", {}), False)
@example("ok", ("Overlayer", {"text": "<tool_call>{}</tool_call> <reason>x</reason> <Terminate>"}), True)
@example("ok", ("Crop", {"</reason>": "a < b"}), False)
def test_well_formed_replies_round_trip(reason, call, terminate):
    reason = reason.replace("<", "").replace(">", "").strip() or "ok"
    name, args = call
    text = format_reply(reason, {"name": name, "arguments": args}, terminate=terminate)
    try:
        json.dumps(args, allow_nan=False)
        clean_json = True
    except ValueError:
        clean_json = False
    p = parse_reply(text)
    assert p.reason == reason
    if clean_json and name.strip() and name == name.strip():
        assert p.calls and p.calls[0].name == name and p.calls[0].arguments == args
    assert p.terminate == terminate
    assert (FindingCode.CALL_WITH_TERMINATE in {f.code for f in p.findings}) == terminate


class _Assets:
    def __init__(self):
        from canvasagent.core.assets import AssetStore

        self.store = AssetStore()
        self.store.add_input(Image.new("RGB", (8, 6)))
        self.store.add_input(Image.new("RGBA", (8, 6)))

    def __getattr__(self, k):
        return getattr(self.store, k)

    def __contains__(self, k):
        return k in self.store


ASSETS = _Assets().store


@FAST
@given(structured_calls, st.sampled_from(list(Profile)))
def test_validator_never_raises_and_scores_are_consistent(call, profile):
    name, args = call
    chk = validate_call(name, args, ASSETS, profile)
    assert 0.0 <= chk.ref_fraction <= 1.0
    assert chk.refs_found <= chk.refs_total
    if not chk.name_ok:
        assert not chk.executable
    if chk.executable:
        # Everything the tools will read was normalised to finite, in-type values.
        for k, v in chk.args.items():
            if isinstance(v, list) and k != "__refs__":
                assert all(isinstance(x, float) and math.isfinite(x) for x in v)


@MEDIUM
@given(st.lists(st.one_of(fragments, structured_calls.map(lambda c: format_reply("r", {"name": c[0], "arguments": c[1]}))), min_size=1, max_size=6))
def test_episode_survives_any_replies_and_keeps_state_consistent(replies):
    ep = Episode(LocalToolbox(profile=Profile.CANVASCRAFT), EpisodeConfig(max_turns=8))
    ep.reset(Task("fuzz", [Image.new("RGB", (16, 12), (9, 9, 9)), Image.new("L", (16, 12), 255)]))
    for r in replies:
        if ep.done:
            break
        res = ep.step(r)
        assert res.turn.status in ("ok", "error", "parse_error", "terminate", "no_call")
        if res.turn.status in ("error", "parse_error", "no_call"):
            assert res.observation is not None and res.turn.observation.startswith("Error: ")
    ids = ep.assets.ids()
    assert len(ids) == len(set(ids)) and ids[:2] == ["img_1", "img_2"]
    produced = [t.output_id for t in ep.trajectory.turns if t.output_id]
    assert produced == ids[2:]
    for t in ep.trajectory.turns:
        if t.output_id:
            tool, k = t.output_id.rsplit("_", 1)
            assert tool == t.call.name and int(k) == sum(1 for p in produced[: produced.index(t.output_id)] if p.startswith(tool + "_"))
