"""A warmup of the untrained tiny model before SFT (`model.tiny_warmup_steps`), text only but for fresh scenes.

Why: a random tiny model learns to copy a call's free arguments out of the instruction within
about 100 steps when the instruction stands alone, but not in 100 when the ~1,600-token system
turn that every SFT row opens with (the same in each row) stands before it; after such a warmup
it learns them behind that turn in 50-75 (`benchmarks/argument_learning.py`). A pretrained VLM
arrives at SFT able to read an instruction; this gives the tiny stand-in that much.

Examples come from the SFT rows themselves (nothing held out is seen): each row's first user
turn as text (image blocks dropped, the "img_1:" labels kept; fresh scenes below keep theirs) and its first assistant turn, both
through the model's own chat template without a system turn, with the loss on the assistant turn
alone. Training: AdamW at a constant `LEARNING_RATE`, `BATCH` examples a step, gradient norm
clipped to 1, examples drawn with `seed`.

Fresh boxes (`box_share` p > 0): each example is drawn from the rows whose first user turn states a
box (`[x1, y1, x2, y2]`, e.g. a Crop "to the area [280, 190, 770, 520]") with probability p, else
from the other rows, and every stated-box example gets a box drawn afresh (`fresh_box`) wherever its
first exchange writes the stated one. Why: digits are single tokens, and the random model
learns the few dozen stated boxes of the SFT rows by heart, instruction by instruction, before it
learns to copy one; it copies boxes it has not seen only when the box changes from draw to draw
(`benchmarks/box_copy.py`). A pretrained VLM arrives able to copy numbers
out of its prompt; the images are not shown here, so a box that no longer matches them costs
nothing.

Fresh scenes (`angle_share` q > 0): with probability q an example is drawn from the rows whose first
call is a Rotate with an angle the first user turn does not state (the picture shows which way it
is turned), and the row's picture is replaced by a scene drawn afresh (`fresh_scene`: the build's
procedural source, a sign turned by a rotation one Rotate call undoes under the rows' profile,
mirrored where the row goes on to Flip) and its angle, in the reply's text and call, by the one
that undoes that turn. These examples keep their image (the only ones that do). Why: the random
model learns the rows' own pictures by heart and reads a turn it has not seen at chance; with a
new scene every draw it learns to read the turn (`benchmarks/angle_reading.py`). A pretrained VLM
arrives able to tell which way a picture is turned.

p = q = 0 draws every row uniformly and uses it as written.

`warm_up` writes the weights and the processor to `out_dir` and, last, `WARMUP_MARKER` naming the
base weights, the examples, the steps, the seed, and (above 0) the box share with `FRESH_BOX_SCHEME`
and the angle share with `FRESH_SCENE_SCHEME` and the profile (a change to how `fresh_box` or
`fresh_scene` draws must bump its name); a folder whose marker
matches is reused as it is and any other is rebuilt, so an interrupted warmup starts over (it takes
minutes). It refuses a negative step count, rows that give no example, a share outside [0, 1] or
shares above 1 together, a share above 0 with no row of its kind, and shares below 1 together with
no other row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

from canvasagent.training.messages import decoded_tool_calls
from toolserver.validation import Profile

log = logging.getLogger(__name__)

LEARNING_RATE = 5e-4
BATCH = 8
WARMUP_MARKER = "canvasagent_warmup.json"
STATED_BOX = re.compile(r"\[(\d+), (\d+), (\d+), (\d+)\]")
# Names what `fresh_box` does, for the warm folder's marker: a folder warmed on boxes drawn or
# written another way must not be reused.
FRESH_BOX_SCHEME = "grid10-sorted-corners-any-spacing-and-int-lists/1"
# Names what `fresh_scene` does, for the same reason.
FRESH_SCENE_SCHEME = "procedural-sign-correctable-rotation-mirror-if-flip/1"


def stated_box(row: dict[str, Any]) -> str | None:
    """The box the first user turn of `row` states (as written there, e.g. "[280, 190, 770, 520]"), or None."""
    user = next((m for m in row.get("messages") or [] if m.get("role") == "user"), None)
    if user is None:
        return None
    content = user.get("content")
    text = content if isinstance(content, str) else " ".join(p.get("text") or "" for p in content or [] if p.get("type") == "text")
    m = STATED_BOX.search(text)
    return m.group(0) if m else None


def fresh_box(row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """`row` with the box its first user turn states replaced by a box drawn with `rng` (corners on
    the 0-1000 grid in steps of 10, x1 < x2 and y1 < y2), wherever a message writes it: in any
    string (text, call arguments as JSON text; any spacing, rewritten as `[x1, y1, x2, y2]`) and as a
    list of four integers (call arguments as objects). Images and other values are left as they
    are, and `row` itself is not changed. Refuses a row that states no box."""
    old = stated_box(row)
    if old is None:
        raise ValueError("the row's first user turn states no box")
    corners = [int(v) for v in STATED_BOX.fullmatch(old).groups()]
    written = re.compile(r"\[\s*" + r"\s*,\s*".join(map(str, corners)) + r"\s*\]")
    x1, x2 = sorted(rng.sample(range(101), 2))
    y1, y2 = sorted(rng.sample(range(101), 2))
    box = [x1 * 10, y1 * 10, x2 * 10, y2 * 10]
    text = f"[{box[0]}, {box[1]}, {box[2]}, {box[3]}]"

    def swap(x: Any) -> Any:
        if isinstance(x, str):
            return written.sub(text, x)
        if isinstance(x, dict):
            return {k: swap(v) for k, v in x.items()}
        if isinstance(x, list):
            if len(x) == 4 and all(type(v) is int for v in x) and x == corners:
                return list(box)
            return [swap(v) for v in x]
        return x

    return {**row, "messages": swap(row["messages"])}


def _first_exchange(row: dict[str, Any]) -> tuple[int, int] | None:
    """Indices of the first user turn and the assistant turn right after it, or None."""
    msgs = row.get("messages") or []
    user = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), None)
    if user is None or user + 1 >= len(msgs) or msgs[user + 1].get("role") != "assistant":
        return None
    return user, user + 1


def _text(content: Any) -> str:
    return content if isinstance(content, str) else " ".join(p.get("text") or "" for p in content or [] if p.get("type") == "text")


def _whole(number: int) -> re.Pattern:
    """`number` written as a whole number: not inside 190, 0.90, 90.5 or -90."""
    return re.compile(rf"(?<![\w.\-]){number}(?!\w|\.\d)")


def turned_angle(row: dict[str, Any]) -> int | None:
    """The angle of the row's first call when that call is a Rotate of the one image of the first
    user turn, the turn does not write the angle as a whole number (so the picture must show it)
    and the reply's text writes it at most once (so `fresh_scene` knows what to rewrite); None
    otherwise."""
    ex = _first_exchange(row)
    if ex is None:
        return None
    user, reply = (row["messages"][i] for i in ex)
    calls = decoded_tool_calls(reply)
    if not calls or calls[0]["function"]["name"] != "Rotate":
        return None
    if isinstance(user.get("content"), str) or sum(p.get("type") == "image" for p in user.get("content") or []) != 1:
        return None
    args = calls[0]["function"]["arguments"]
    angle = (json.loads(args) if isinstance(args, str) else args).get("angle")
    if isinstance(angle, bool) or not isinstance(angle, int):
        return None
    if _whole(angle).search(_text(user["content"])) or len(_whole(angle).findall(_text(reply.get("content")))) > 1:
        return None
    return angle


def fresh_scene(row: dict[str, Any], rng: random.Random, profile: Profile = Profile.CANVASCRAFT) -> dict[str, Any]:
    """The first exchange of `row` (its messages up to the first reply, `images` its one picture)
    with the picture replaced by a procedural scene drawn with `rng` (a sign, turned by a rotation
    that one Rotate call undoes under `profile`, mirrored when a later call of the row is a Flip,
    the width of the row's first picture, 256 where that is not a loaded image) and the reply's angle, wherever its text or first call writes
    it, by the angle that undoes the new turn. `row` itself is not changed. Refuses a row for which
    `turned_angle` is None."""
    from canvascraft.plan import correction_angle, correctable_rotations
    from canvascraft.sources import ProceduralSource

    old = turned_angle(row)
    if old is None:
        raise ValueError("the row's first call is not a Rotate of its picture by an angle left unstated")
    user, reply = _first_exchange(row)
    msgs = row["messages"]
    mirrored = any(c["function"]["name"] == "Flip" for m in msgs[reply + 1:] if m.get("role") == "assistant"
                   for c in decoded_tool_calls(m))
    first = (row.get("images") or [None])[0]
    size = first.size[0] if hasattr(first, "size") else 256
    scene = ProceduralSource(size, rotations=correctable_rotations(profile)).sample(
        rng, frozenset({"text"}), frozenset({"rotated", "mirrored"} if mirrored else {"rotated"}))
    new = correction_angle(int(scene.meta["rotation"]), profile)
    number = _whole(old)
    content = msgs[reply].get("content")
    content = number.sub(str(new), content) if isinstance(content, str) else [
        {**p, "text": number.sub(str(new), p["text"])} if p.get("type") == "text" and p.get("text") else p for p in content or []]
    calls = decoded_tool_calls(msgs[reply])
    args = dict(calls[0]["function"]["arguments"] if isinstance(calls[0]["function"]["arguments"], dict)
                else json.loads(calls[0]["function"]["arguments"]))
    args["angle"] = new
    calls = [{**calls[0], "function": {**calls[0]["function"], "arguments": args}}, *calls[1:]]
    answer = {**msgs[reply], "content": content, "tool_calls": calls}
    return {**row, "messages": [*msgs[:reply], answer], "images": [scene.image.convert("RGB")]}


def _text_only(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        content = [dict(type="text", text=p["text"]) for p in content if p.get("type") == "text" and p.get("text")]
    out = {"role": message["role"], "content": content}
    if calls := decoded_tool_calls(message):
        out["tool_calls"] = calls
    return out


def warmup_prompt(processor: Any, user: dict[str, Any]) -> str:
    """The text a warmup example's reply follows: the user message `user` as text (image blocks
    dropped), through the chat template without a system turn, up to the assistant's opening."""
    return processor.apply_chat_template([_text_only(user)], add_generation_prompt=True, tokenize=False)


def _with_image(message: dict[str, Any]) -> dict[str, Any]:
    out = _text_only(message)
    out["content"] = [{"type": "image"} if p.get("type") == "image" else dict(type="text", text=p["text"])
                      for p in message["content"] if p.get("type") == "image" or (p.get("type") == "text" and p.get("text"))]
    return out


def warmup_example(processor: Any, row: dict[str, Any], images: bool = False) -> tuple | None:
    """(token ids, labels with -100 outside the assistant turn) of a row's first exchange; None for
    a row without a user turn followed by an assistant turn. With `images`, the first user turn
    keeps its image blocks, filled from the row's `images` in order, and the tuple has a third
    item: the processor's image inputs (`pixel_values`, `image_grid_thw`, `mm_token_type_ids`)."""
    ex = _first_exchange(row)
    if ex is None:
        return None
    msgs = row["messages"]
    user, reply = msgs[ex[0]], msgs[ex[1]]
    tok = processor.tokenizer
    if images:
        pair = [_with_image(user), _text_only(reply)]
        head = processor.apply_chat_template(pair[:1], add_generation_prompt=True, tokenize=False)
        pics = list(row.get("images") or [])[: sum(p["type"] == "image" for p in pair[0]["content"])]
        full = processor.apply_chat_template(pair, tokenize=False)
        enc = processor(text=[full], images=pics or None, return_tensors="pt")
        ids, ids_head = enc["input_ids"][0].tolist(), processor(text=[head], images=pics or None, return_tensors="pt")["input_ids"][0].tolist()
        extra = {k: enc[k] for k in ("pixel_values", "image_grid_thw", "mm_token_type_ids") if k in enc}
    else:
        pair = [_text_only(user), _text_only(reply)]
        head = warmup_prompt(processor, user)
        full = processor.apply_chat_template(pair, tokenize=False)
        ids_head, ids = tok(head)["input_ids"], tok(full)["input_ids"]
    if not full.startswith(head) or ids[: len(ids_head)] != ids_head:
        raise ValueError("the chat template renders the assistant turn into the prompt's tokens")
    labels = [-100] * len(ids_head) + ids[len(ids_head):]
    return (ids, labels, extra) if images else (ids, labels)


def _digest(base_dir: Path, examples: list[tuple[list[int], list[int]]]) -> dict[str, str]:
    weights = hashlib.sha256()
    for f in sorted(base_dir.glob("*.safetensors")):
        weights.update(f.read_bytes())
    data = hashlib.sha256(json.dumps(examples).encode()).hexdigest()
    return {"base": weights.hexdigest(), "examples": data}


def pad_batch(examples: list[tuple[list[int], list[int]]], pad: int):
    """(input ids, labels, attention mask) tensors of (ids, labels) pairs, right-padded."""
    import torch

    n = max(len(x) for x, _ in examples)
    ids = torch.full((len(examples), n), pad)
    labels = torch.full((len(examples), n), -100)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, labels, mask


def image_inputs(examples: list[tuple], length: int) -> dict[str, Any]:
    """The image inputs of a right-padded batch of `examples` (`warmup_example` tuples, some with
    a third item): pixel values and grids in batch order, token types padded to `length`; {} when
    no example has an image."""
    import torch

    with_images = [e[2] for e in examples if len(e) > 2]
    if not with_images:
        return {}
    types = torch.zeros((len(examples), length), dtype=torch.long)
    for i, e in enumerate(examples):
        if len(e) > 2 and "mm_token_type_ids" in e[2]:
            types[i, : e[2]["mm_token_type_ids"].shape[1]] = e[2]["mm_token_type_ids"][0]
    return {"pixel_values": torch.cat([x["pixel_values"] for x in with_images]),
            "image_grid_thw": torch.cat([x["image_grid_thw"] for x in with_images]), "mm_token_type_ids": types}


def train_step(model: Any, opt: Any, examples: list[tuple], pad: int) -> float:
    """One optimiser step of `model` on `examples` (`warmup_example` tuples, padded with `pad`),
    the gradient norm clipped to 1; returns the loss."""
    import torch

    ids, labels, mask = pad_batch([e[:2] for e in examples], pad)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels, **image_inputs(examples, ids.shape[1])).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def train_on_draws(model: Any, draw: Any, steps: int, seed: int, pad: int, label: str) -> None:
    """`steps` steps of `train_step` on `BATCH` examples from `draw()` each, AdamW at
    `LEARNING_RATE`, torch seeded with `seed` (the caller's random state left as it was); logs the
    loss under `label` five times."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    t0, every = time.perf_counter(), max(1, steps // 5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(1, steps + 1):
            loss = train_step(model, opt, [draw() for _ in range(BATCH)], pad)
            if step % every == 0 or step == steps:
                log.info("%s: step %d/%d, loss %.3f (%.0f s)", label, step, steps, loss, time.perf_counter() - t0)


def save_beside(model: Any, base: Path, out: Path) -> None:
    """Write `model` to the new folder `out` with the processor's files of `base` as the builder
    wrote them (the processor's own save would rename classes), then the weights and config."""
    out.mkdir(parents=True)
    for f in base.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out)


def warm_up(
    base_dir: str | Path,
    rows: list[dict[str, Any]],
    steps: int,
    out_dir: str | Path,
    seed: int = 0,
    processor: Any = None,
    box_share: float = 0.0,
    angle_share: float = 0.0,
    profile: Profile = Profile.CANVASCRAFT,
) -> Path:
    """Warm the model in `base_dir` up on `rows` (SFT rows) for `steps` steps into `out_dir`; returns
    `out_dir`. `processor`: the base's, where the caller has it loaded (None: loaded here).
    `box_share`: the share of examples drawn from stated-box rows, each with a fresh box;
    `angle_share`: the share drawn from turned-picture rows, each with a fresh scene turned under
    `profile` (that of the toolbox the policy's calls run in, which decides which way a Rotate
    turns); 0: none singled out. See the module
    docstring for what is trained, reused and refused."""
    from canvasagent.core.models.loading import load_policy, load_processor

    if steps < 0:
        raise ValueError(f"tiny warmup steps must be >= 0, got {steps}")
    for name, share in (("box", box_share), ("angle", angle_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"tiny warmup {name} share must be in [0, 1], got {share}")
    if box_share + angle_share > 1.0:
        raise ValueError(f"tiny warmup box share {box_share} and angle share {angle_share} add up to more than 1")
    base, out = Path(base_dir), Path(out_dir)
    processor = processor if processor is not None else load_processor(str(base))
    pairs = [(r, e) for r in rows if (e := warmup_example(processor, r)) is not None]
    examples = [e for _, e in pairs]
    if not examples:
        raise ValueError(f"none of the {len(rows)} SFT rows has a user turn followed by an assistant turn to warm up on")
    # Drawn as rows, so each draw gets its own box or scene.
    kind = ["box" if box_share and stated_box(r) is not None else "angle" if angle_share and turned_angle(r) is not None
            else "other" for r, _ in pairs]
    boxed = [r for (r, _), k in zip(pairs, kind) if k == "box"]
    turned = [r for (r, _), k in zip(pairs, kind) if k == "angle"]
    others = [e for (_, e), k in zip(pairs, kind) if k == "other"]
    if box_share and not boxed:
        raise ValueError(f"tiny warmup box share {box_share}: none of the {len(rows)} SFT rows states a box in its first user turn")
    if angle_share and not turned:
        raise ValueError(f"tiny warmup angle share {angle_share}: no SFT row starts with a Rotate of its picture by an "
                         "angle its instruction leaves unstated (a row that states a box counts as a box row)")
    if box_share + angle_share < 1.0 and not others:
        raise ValueError(f"tiny warmup shares {box_share} + {angle_share}: every SFT row is singled out, so there is nothing else to draw")
    marker = {"steps": steps, "seed": seed, "batch": BATCH, "learning_rate": LEARNING_RATE, **_digest(base, examples)}
    if box_share:  # absent at 0, so warm folders from before the option stay valid
        marker["box_share"] = box_share
        marker["box_scheme"] = FRESH_BOX_SCHEME
    if angle_share:
        marker.update(angle_share=angle_share, scene_scheme=FRESH_SCENE_SCHEME, profile=profile.value)
    if (out / WARMUP_MARKER).exists() and json.loads((out / WARMUP_MARKER).read_text()) == marker:
        log.info("tiny warmup: %s is done already (%d steps), reusing it", out, steps)
        return out
    if out.exists():
        shutil.rmtree(out)
    model = load_policy(str(base))
    rng, pad = random.Random(seed), processor.tokenizer.pad_token_id or 0

    def draw() -> tuple:
        if not box_share and not angle_share:
            return rng.choice(examples)
        r = rng.random()
        if r < box_share:
            return warmup_example(processor, fresh_box(rng.choice(boxed), rng))
        if r < box_share + angle_share:
            return warmup_example(processor, fresh_scene(rng.choice(turned), rng, profile), images=True)
        return rng.choice(others)

    t0 = time.perf_counter()
    train_on_draws(model, draw, steps, seed, pad, "tiny warmup")
    save_beside(model, base, out)
    (out / WARMUP_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    log.info("tiny warmup: %d steps on %d examples in %.0f s -> %s", steps, len(examples), time.perf_counter() - t0, out)
    return out
