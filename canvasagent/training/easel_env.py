"""EASEL as a GRPO task source: rows, a TRL environment over the bench's canvas, S as the reward.

`data.format: easel` turns EASEL tasks (`canvasagent.easel.tasks`: the four reconstruction
categories, optionally the semantic tasks) into GRPO rows in `messages.grpo_row`'s layout: the prompt,
the images (`img_1` the reference, `img_2` the blank canvas; semantic tasks: `img_1` the canvas)
and the task JSON, whose `meta.easel` holds the spec `reset` rebuilds the EASEL task from.

`EaselEnv` runs the registry's `easel` tools (`brush_stroke`/`undo`/`submit`) as `stateful` handlers
over a `CanvasSession`, exactly as `canvasagent easel bench --policy agent:...` does: same budget,
undo and submit semantics, and an invalid stroke is an observation that costs a step, not an
exception. Every tool result carries the current canvas image and the text reply.

The reward (`canvasagent.evaluation.scoring.easel_scorer`) weights, by `easel.reward_weights`, the
final canvas's S against the reference (`easel_s`; semantic tasks: the task's own score) and the
rule reward's format and action-validity terms (preset `grpo.reward_preset`) into `hybrid`.

Coordinates (`easel.coords`): `unit` is the registry's [0, 1]; `int1000` (what EASEL-Data teaches)
is stated in the system prompt, and `EaselEnv` divides path coordinates by 1000 before the runner
validates the call, as the bench's `--coords int1000` does.

SFT on an EASEL-Data build (`data.format: easel-data`): see `sft_example`.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from typing import Any

from PIL import Image

from canvasagent.core.episode import Episode
from canvasagent.core.protocol import format_reply, parse_reply, render_system_prompt
from canvasagent.training.env import CanvasEnv, make_env_class, task_from_row
from canvasagent.training.messages import assistant_message, grpo_row, user_content

log = logging.getLogger(__name__)


def task_specs(easel_cfg: Any) -> list[dict[str, Any]]:
    """The JSON specs of the configured tasks (one per row), in category order."""
    from canvasagent.easel import tasks

    specs: list[dict[str, Any]] = []
    for cat in easel_cfg.categories:
        c = tasks.CATEGORIES[cat]
        for i in range(easel_cfg.n_per_category):
            specs.append({
                "kind": "reconstruction", "category": cat, "seed": easel_cfg.seed * 1000 + i,
                "resolution": easel_cfg.resolution or c.resolution, "budget": easel_cfg.budget or c.budget,
            })
    for name in easel_cfg.semantic:
        spec: dict[str, Any] = {"kind": "semantic", "name": name, "seed": easel_cfg.seed}
        if easel_cfg.budget:
            spec["budget"] = easel_cfg.budget
        specs.append(spec)
    return specs


@lru_cache(maxsize=256)
def _easel_task(spec_json: str) -> Any:
    from canvasagent.easel.tasks import task_from_spec

    return task_from_spec(json.loads(spec_json))


def easel_task(spec: dict[str, Any]) -> Any:
    """The EASEL task of a spec (cached: TRL resets one env per generation of the same row)."""
    return _easel_task(json.dumps(spec, sort_keys=True))


def agent_task_of(spec: dict[str, Any]):
    """The episode's `canvasagent.core.tasks.Task`, as the bench's agent runner builds it."""
    from canvasagent.easel import agent

    task = easel_task(spec)
    budget = int(spec.get("budget") or task.budget)
    tid = agent.task_id_of(task, int(spec.get("seed", 0)))
    t = agent.agent_task(task, budget, tid)
    t.meta["easel"] = {**t.meta["easel"], **spec, "budget": budget}
    return t


def with_coords(system: str, coords: str) -> str:
    """A system text (base prompt, with or without the template's tool block) for `coords`.
    SFT's `messages.system_text` and GRPO's `messages.prompt_messages` both render the unit
    convention; swapping the whole base prompt keeps the two byte-identical for int1000 too."""
    if coords == "unit":
        return system
    unit = render_system_prompt("easel", include_tools=False)
    if unit not in system:
        raise ValueError("the system text does not contain the EASEL base prompt; cannot set its coordinates")
    return system.replace(unit, render_system_prompt("easel", include_tools=False, coords=coords))


def grpo_rows(easel_cfg: Any) -> list[dict[str, Any]]:
    rows = [grpo_row(agent_task_of(s)) for s in task_specs(easel_cfg)]
    if not rows:
        raise ValueError("easel: no tasks (empty categories and semantic, or n_per_category 0)")
    for row in rows:
        system = row["prompt"][0]["content"][0]
        system["text"] = with_coords(system["text"], easel_cfg.coords)
    return rows


def build_sft_data(easel_cfg: Any, out: Any, n_strokes: int | None = None, painter_cfg: Any = None,
                   workers: int = 1) -> dict[str, int]:
    """An EASEL-Data build (`canvasagent.easel.data.build_dataset`: the painter's trajectories) of the
    configured reconstruction references, at `easel.resolution`; `n_strokes` defaults to the budget."""
    from canvasagent.easel import data

    refs = [(t.task_id, t.reference) for t in (easel_task(s) for s in task_specs(easel_cfg) if s["kind"] == "reconstruction")]
    if not refs:
        raise ValueError("easel: no reconstruction references to paint")
    return data.build_dataset(refs, out, n_strokes=n_strokes or easel_cfg.budget or 32, painter_cfg=painter_cfg,
                              workers=workers)


def sft_example(record: dict[str, Any], root: Any, system: str, strokes: Any, env_cls: type[EaselEnv],
                budget: int | None, coords: str) -> dict[str, Any] | None:
    """One EASEL-Data record (`canvasagent.easel.data`) as an SFT row in the layout of a GRPO rollout.

    A sample at state t (reference R, canvas C_t -> stroke a_t) is the rollout that reaches C_t: GRPO's
    opening prompt (`img_1` R, `img_2` the blank canvas), then for each earlier stroke a_k its EASEL-Data
    reply and the tool reply an `EaselEnv` gives for it (the canvas image and `stroke applied. step
    k/B. S=...`), then a_t. So every turn the policy meets in GRPO, not only the first, is one SFT has
    shown it. States at or past the budget do not occur in a GRPO episode: None.
    """
    import numpy as np

    from canvasagent.easel import agent, data, tasks

    t, n = int(record["step"]), int(record["n_strokes"])
    steps = int(budget or n)
    if t >= steps:
        return None
    ref = _load_rgb(root / record["images"][0])
    res = ref.size[0]
    easel_t = tasks.reference_task(np.asarray(ref, np.float32) / 255.0, budget=steps, task_id=str(record["ref_id"]))
    task = agent.agent_task(easel_t, steps, easel_t.task_id)  # GRPO's opening prompt, bit for bit
    env = env_cls()
    env._open(task, easel_t, steps)
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": system}]},
                                      {"role": "user", "content": user_content(task)}]
    images = list(task.images)
    have = record.get("coord_format", "int1000")
    for k in range(t):
        reply = _in_coords(data.assistant_turn(strokes[k], k, n, res), have, coords)
        msg = assistant_message(reply)
        obs = env._call("brush_stroke", json.loads(msg["tool_calls"][0]["function"]["arguments"]))
        messages += [msg, {"role": "tool", "name": "brush_stroke",
                           "content": [{"type": "image"}, {"type": "text", "text": obs[1]["text"]}]}]
        images.append(obs[0]["image"])
    messages.append(assistant_message(_in_coords(record["messages"][-1]["content"], have, coords)))
    return {"messages": messages, "images": images}


def _in_coords(reply: str, have: str, want: str) -> str:
    """An EASEL-Data reply with its path coordinates in the policy's convention."""
    from canvasagent.easel import data

    if have == want:
        return reply
    parsed = parse_reply(reply)
    args = parsed.call.arguments
    args = data.path_to_unit(args) if have == "int1000" else data.path_to_int1000(args)
    return format_reply(parsed.reason or "", {"name": parsed.call.name, "arguments": args})


def _load_rgb(path: Any) -> Image.Image:
    with Image.open(path) as im:
        # A copy holds the pixels only: `datasets` would otherwise store the file path.
        return im.convert("RGB").copy()


def sft_rows(cfg: Any, system: str) -> list[dict[str, Any]]:
    """`data.format: easel-data`: the build at `data.path`, curricula `easel.curricula`, in file order."""
    from pathlib import Path

    import numpy as np

    root = Path(cfg.resolve(cfg.data.path))
    system = with_coords(system, cfg.easel.coords)
    with open(root / "trajectories.jsonl") as f:
        strokes = {d["ref_id"]: np.asarray(d["strokes"], np.float64) for d in map(json.loads, f) if d}
    env_cls = make_easel_env_class(cfg.grpo.max_turns, cfg.easel.coords)
    rows: list[dict[str, Any]] = []
    skipped = 0
    for cur in cfg.easel.curricula:
        with open(root / f"{cur.lower()}.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
        for r in records:
            ex = sft_example(r, root, system, strokes[r["ref_id"]], env_cls, cfg.easel.budget, cfg.easel.coords)
            if ex is None:
                skipped += 1
            else:
                rows.append(ex)
    if skipped:
        log.info("EASEL-Data SFT: %d samples at or past easel.budget=%s skipped", skipped, cfg.easel.budget)
    if not rows:
        raise FileNotFoundError(f"no EASEL-Data samples in {root} (curricula {cfg.easel.curricula})")
    log.info("EASEL-Data SFT: %d rows from %s (%s, coords %s)", len(rows), root, "+".join(cfg.easel.curricula), cfg.easel.coords)
    return rows


def _no_toolbox() -> Any:
    """An EASEL env's toolbox: no model or pure tools (the bench's `NoToolbox`); strokes run on the session."""
    from canvasagent.easel.agent import NoToolbox

    return NoToolbox()


class EaselEnv(CanvasEnv):
    """One EASEL rollout: `reset(**row)` opens a canvas session; tool methods come from the registry."""

    coords = "unit"  # easel.coords; set by make_easel_env_class

    def __init__(self) -> None:
        super().__init__()
        self.easel_task: Any = None
        self.session: Any = None

    def reset(self, **row: Any) -> None:
        task = task_from_row(row)
        spec = task.meta["easel"]
        self._open(task, easel_task(spec), int(spec["budget"]))
        return None  # the prompt already holds the reference and the canvas

    def _open(self, task: Any, easel_task: Any, budget: int) -> None:
        """A fresh episode of `easel_task` shown as `task` (SFT replays EASEL-Data prefixes through it);
        private, as TRL offers every public method of an environment to the policy as a tool."""
        from canvasagent.easel.canvas import CanvasSession

        self.easel_task = easel_task
        self.session = CanvasSession.for_task(easel_task)
        self.session.budget = int(budget)
        self.episode = Episode(self.toolbox(), self.episode_config, stateful=self.session.handlers())
        self.episode.reset(task)
        self._trajectory = None
        self.scores = None

    def _call(self, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        ep = self.episode
        assert ep is not None, "reset() first"
        if ep.done:
            text = f"Error: the episode has ended ({ep.trajectory.stop_reason}); the canvas is final."
        else:
            if self.coords == "int1000" and name == "brush_stroke" and isinstance(arguments, dict):
                # The registry (and so the runner's validator) takes [0, 1]; the policy writes 0-1000.
                from canvasagent.easel.data import path_to_unit

                arguments = path_to_unit(arguments)
            res = ep.call_tool(name, arguments)
            text = "".join(p.get("text", "") for p in (res.observation or {}).get("content") or [] if p.get("type") == "text")
        # Always the canvas, also after a rejected stroke or an undo: the policy paints from what it sees.
        return [{"type": "image", "image": self._state_image()}, {"type": "text", "text": text}]

    def _state_image(self) -> Image.Image:
        from canvasagent.easel.canvas import to_pil

        return to_pil(self.session.canvas)

    def _outcome(self) -> dict[str, Any]:
        """The final canvas's scores (what the `easel_s` reward reads); private, or TRL would offer it
        as a fourth tool, one SFT (the registry's three) never shows."""
        sess, task = self.session, self.easel_task
        out: dict[str, Any] = {
            "kind": "reconstruction" if getattr(task, "reference", None) is not None else "semantic",
            "steps_used": sess.steps_used, "budget": sess.budget, "submitted": sess.submitted,
            "strokes": len(sess.strokes), "s_curve": [float(v) for v in sess.s_curve],
        }
        if out["kind"] == "reconstruction":
            from canvasagent.easel.agent import outcome_scores

            sim = sess.similarity()
            out.update(score=sim.s, s=sim.s, ssim=sim.ssim, l1=sim.l1, edge_iou=sim.edge_iou,
                       s_blank=outcome_scores(task, sess.canvas)["s_blank"])
        else:
            out["score"] = float(task.score(sess.canvas))
        return out

    def _finalize(self, completion: list[dict[str, Any]]):
        fresh = self._trajectory is None
        traj = super()._finalize(completion)
        if fresh:  # after the final reply was stepped through: the canvas is final now
            traj.meta["easel"] = self._outcome()
        return traj


def make_easel_env_class(max_turns: int, coords: str = "unit") -> type[EaselEnv]:
    """`EaselEnv` with the registry's easel tool methods (generated by `env.make_env_class`)."""
    tools = make_env_class(None, _no_toolbox, max_turns, "easel")
    return type("EaselToolEnv", (EaselEnv, tools), {"coords": coords})
