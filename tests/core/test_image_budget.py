"""The image-context budget rule (canvasagent.core.image_budget) on its own: counts, asset IDs, K=all."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.core.image_budget import apply_image_budget, check_budget, count_images, observation_asset_id, omitted_text
from canvasagent.core.protocol import echo_plain, echo_saved


def _img(k: int) -> Image.Image:
    return Image.new("RGB", (4, 4), (k % 256, 0, 0))


def _conversation(turns: list[str], n_inputs: int, placeholders: bool):
    """system + user (n_inputs images) + per turn an assistant reply and a tool observation:
    "saved" (a new asset), "error" (text only) or "state" (an error carrying the latest asset)."""
    images = []

    def image_part(k):
        images.append(_img(k))
        return {"type": "image"} if placeholders else {"type": "image", "image": images[-1]}

    user = []
    for i in range(1, n_inputs + 1):
        user += [{"type": "text", "text": f"img_{i}:"}, image_part(i)]
    user.append({"type": "text", "text": "do it"})
    msgs = [{"role": "system", "content": [{"type": "text", "text": "SYS"}]}, {"role": "user", "content": user}]
    ids = [f"img_{i}" for i in range(1, n_inputs + 1)]
    saved = []
    for t, kind in enumerate(turns):
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"<reason>{t}</reason>"}]})
        if kind == "saved":
            aid = f"Flip_{len(saved)}"
            ids.append(aid)
            saved.append(aid)
            content = [image_part(100 + t), {"type": "text", "text": echo_saved("Flipped.", aid, "{" + ", ".join(ids) + "}")}]
        elif kind == "state" and ids:
            content = [image_part(200 + t), {"type": "text", "text": echo_plain("Error: no", "{" + ", ".join(ids) + "}")}]
        else:
            content = [{"type": "text", "text": echo_plain("Error: no", "{" + ", ".join(ids) + "}")}]
        msgs.append({"role": "tool", "content": content})
    return msgs, images


def _texts(msgs) -> str:
    return "".join(p.get("text", "") for m in msgs for p in m["content"] if p.get("type") == "text")


def test_asset_id_round_trips_the_protocol_echo():
    assert observation_asset_id(echo_saved("Rotated.", "Rotate_3", "{img_1, Rotate_3}")) == "Rotate_3"
    assert observation_asset_id(echo_plain("Error: x", "{img_1, Flip_0}")) == "Flip_0"
    assert observation_asset_id("no echo at all") is None


def test_budget_values():
    assert check_budget(None) is None and check_budget(0) == 0 and check_budget(3) == 3
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            check_budget(bad)


def test_keep_all_returns_the_same_objects():
    msgs, images = _conversation(["saved"] * 5, 1, placeholders=True)
    out, kept = apply_image_budget(msgs, None, images)
    assert out is msgs and kept is images
    out, kept = apply_image_budget(msgs, 5, images)  # a budget the conversation fits in changes nothing
    assert out is msgs and kept is images


def test_two_of_five_in_place():
    msgs, _ = _conversation(["saved"] * 5, 1, placeholders=False)
    before = copy.deepcopy([[{k: v for k, v in p.items() if k != "image"} for p in m["content"]] for m in msgs])
    out, _ = apply_image_budget(msgs, 2)
    tool = [m for m in out if m["role"] == "tool"]
    assert [p["type"] for m in tool for p in m["content"]][::2] == ["text", "text", "text", "image", "image"]
    assert [m["content"][0]["text"] for m in tool[:3]] == [omitted_text(f"Flip_{k}") for k in range(3)]
    assert out[1] is msgs[1]  # the input image stays
    after = [[{k: v for k, v in p.items() if k != "image"} for p in m["content"]] for m in msgs]
    assert after == before  # the input conversation is not mutated


@settings(max_examples=200, deadline=None)
@given(
    turns=st.lists(st.sampled_from(["saved", "error", "state"]), max_size=14),
    n_inputs=st.integers(0, 2),
    budget=st.one_of(st.none(), st.integers(0, 5)),
    placeholders=st.booleans(),
)
def test_random_turns_never_exceed_the_budget(turns, n_inputs, budget, placeholders):
    msgs, images = _conversation(turns, n_inputs, placeholders)
    out, kept = apply_image_budget(msgs, budget, images if placeholders else None)
    n_tool = sum(p.get("type") == "image" for m in msgs if m["role"] == "tool" for p in m["content"])
    keep = n_tool if budget is None else min(budget, n_tool)
    assert count_images(out) == n_inputs + keep
    # The newest `keep` tool images are the ones kept, in order; inputs always stay.
    if placeholders:
        assert len(kept) == count_images(out)
        assert kept[:n_inputs] == images[:n_inputs]
        assert kept[n_inputs:] == images[len(images) - keep:]
    else:
        got = [p["image"] for m in out for p in m["content"] if p.get("type") == "image"]
        assert got == images[:n_inputs] + images[len(images) - keep:]
    # Every omitted image's asset ID is in the text, in its own placeholder.
    omitted_ids = []
    for m, o in zip(msgs, out):
        for p, q in zip(m["content"], o["content"]):
            if p.get("type") == "image" and q.get("type") == "text":
                aid = observation_asset_id(_texts([m]))
                assert q["text"] == omitted_text(aid)
                omitted_ids.append(aid)
    assert len(omitted_ids) == n_tool - keep
    assert all(omitted_text(a) in _texts(out) for a in omitted_ids)
