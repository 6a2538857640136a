"""The Gradio page: three tabs over the controllers, which hold all behaviour.

* **Session** — a human-in-the-loop episode: the transcript of every turn, the controls grouped
  into run, step and human in the loop, the assets with their provenance, offline examples.
* **Rollouts** — the rollout viewer for GRPO trajectory dumps and eval runs
  (`canvasagent.ui.rollouts`): step → group → rollout, the images of every turn, the reward per
  component, the advantage and tool errors, filter and sort, two rollouts side by side.
* **Paint (EASEL)** — paint a reference stroke by stroke with S after every stroke, undo, submit.

This module only lays out components and wires events.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from canvasagent.interactive.paint import EXAMPLE_STROKE, SAMPLES
from canvasagent.ui import rollouts as R
from canvasagent.ui.controller import (
    EXAMPLES,
    PaintController,
    PaintState,
    UIConfig,
    UIController,
    UIState,
    View,
    example_files,
    write_once,
)

ALL = "(all)"  # the Step and Group pickers' "no filter" choice


def _outputs(v: View, st: UIState) -> tuple[Any, ...]:
    import gradio as gr

    return (
        st,
        v.log_md,
        v.gallery,
        gr.Dropdown(choices=v.asset_ids, value=v.asset_ids[-1] if v.asset_ids else None),
        v.final_image,
        v.files or None,
        v.status,
        "\n".join(v.asset_ids),
        v.transcript,
    )


class _Viewer:
    """Glue between the Rollouts tab and `canvasagent.ui.rollouts`: images are served from
    content-named copies under the runs dir (the only folder the page may serve)."""

    def __init__(self, cache: Path, scale: str):
        self.cache = cache
        self.scale = scale

    def still(self, path: Path) -> str:
        data = path.read_bytes()
        out = self.cache / f"{hashlib.sha1(data).hexdigest()[:20]}{path.suffix or '.png'}"
        return str(write_once(out, lambda tmp: shutil.copyfile(path, tmp)))

    def load(self, folder: str, scale: str) -> tuple[R.RolloutSet | None, str]:
        try:
            rs = R.load(folder, scale or self.scale)
        except (R.RolloutError, ValueError, OSError) as e:
            return None, f"error: {e}"
        info = f"{rs.kind} · {len(rs.rollouts)} rollouts · {len(rs.steps())} step(s) · {len(rs.groups())} group(s) in `{rs.root}`"
        if rs.kind == "grpo":
            info += f" · advantage = hybrid reward minus its group mean{' over the group std' if (scale or self.scale) == 'group' else ' over the batch std' if (scale or self.scale) == 'batch' else ''}"
        if rs.problems:
            info += "\n\n**skipped:**\n" + "\n".join(f"- {p}" for p in rs.problems[:20])
        return rs, info

    def side(self, rs: R.RolloutSet | None, key: str | None) -> tuple[str, list[tuple[str, str]]]:
        if rs is None or not key:
            return "_choose a rollout_", []
        try:
            d = R.detail(rs.get(key))
        except KeyError as e:
            return f"error: {e}", []
        return d.markdown(), [(self.still(Path(p)), cap) for p, cap in d.gallery()]


def build_app(config: UIConfig | None = None):
    import gradio as gr

    ctl = UIController(config)
    cfg = ctl.config
    painter = PaintController(cfg.runs_dir)
    viewer = _Viewer(Path(cfg.runs_dir) / "viewer", cfg.scale_rewards)
    with gr.Blocks(title="CanvasAgent", analytics_enabled=False) as demo:
        gr.Markdown("## CanvasAgent")
        with gr.Tabs(selected="rollouts" if cfg.rollouts else "session"):
            with gr.Tab("Session", id="session"):
                state = gr.State(UIState(), delete_callback=UIController.close)  # runs when the tab goes away
                with gr.Row():
                    with gr.Column(scale=1):
                        with gr.Group(elem_id="examples"):
                            gr.Markdown("**Examples** (offline: scikit-image photos and the offline tools)")
                            example = gr.Dropdown(label="Example", choices=[e.label for e in EXAMPLES], value=None, elem_id="example")
                            use_example = gr.Button("Use example", size="sm", elem_id="use-example")
                        uploads = gr.File(label="Input images (img_1, img_2, … in order)", file_count="multiple", file_types=["image"], type="filepath", elem_id="uploads")
                        instruction = gr.Textbox(label="Instruction", lines=2, elem_id="instruction")
                        policy = gr.Textbox(label="Policy spec (empty: you type every call)", value=cfg.policy or "", elem_id="policy")
                        with gr.Group(elem_id="run-controls"):
                            gr.Markdown("**Run** — start a session and let the policy work")
                            with gr.Row():
                                start = gr.Button("Start", variant="primary", elem_id="start")
                                run = gr.Button("Run", elem_id="run")
                                stop = gr.Button("Stop", elem_id="stop")
                        with gr.Group(elem_id="step-controls"):
                            gr.Markdown("**Step** — one policy turn at a time")
                            step = gr.Button("Step", elem_id="step")
                        with gr.Group(elem_id="hitl-controls"):
                            gr.Markdown("**Human in the loop** — review each call, take over, roll back")
                            propose = gr.Button("Propose", elem_id="propose")
                            decision = gr.Textbox(label="Edited arguments (JSON or Tool {json}) to approve, or the reason to reject", elem_id="decision")
                            with gr.Row():
                                approve = gr.Button("Approve", elem_id="approve")
                                reject = gr.Button("Reject", elem_id="reject")
                            command = gr.Textbox(label="Take over: Tool {json arguments}, or 'done'", elem_id="command")
                            execute = gr.Button("Execute", elem_id="execute")
                            with gr.Row():
                                target = gr.Dropdown(label="Roll back to asset", choices=[], elem_id="rollback-target")
                                rollback = gr.Button("Roll back", elem_id="rollback")
                        status = gr.Textbox(label="Status", interactive=False, elem_id="status")
                    with gr.Column(scale=2):
                        transcript = gr.Chatbot(label="Transcript: reason, call, observation of every turn", height=560, elem_id="transcript",
                                                feedback_options=None, sanitize_html=True)
                        gallery = gr.Gallery(label="Assets (imglist ID · provenance)", columns=4, height="auto", elem_id="asset-gallery")
                        asset_ids = gr.Textbox(label="imglist", interactive=False, elem_id="asset-ids")
                        final = gr.Image(label="Final image", type="pil", interactive=False, elem_id="final-image")
                        downloads = gr.File(label="Download: trajectory JSON and final image", file_count="multiple", interactive=False, elem_id="downloads")
                        with gr.Accordion("Event log", open=False):
                            steps = gr.Markdown(elem_id="steps")

            with gr.Tab("Rollouts", id="rollouts"):
                rs_state = gr.State(None)
                with gr.Row():
                    folder = gr.Textbox(label="GRPO dump (run dir or its trajectories/) or eval run dir", value=cfg.rollouts or "", scale=4, elem_id="rollout-folder")
                    scale = gr.Dropdown(label="advantage scale (grpo.scale_rewards)", choices=list(R.SCALES), value=cfg.scale_rewards, scale=1, elem_id="rollout-scale")
                    load = gr.Button("Load", variant="primary", scale=1, elem_id="rollout-load")
                info = gr.Markdown(elem_id="rollout-info")
                with gr.Row():
                    f_step = gr.Dropdown(label="Step", choices=[ALL], value=ALL, elem_id="rollout-step")
                    f_group = gr.Dropdown(label="Group (a prompt's rollouts)", choices=[ALL], value=ALL, elem_id="rollout-group")
                    f_sort = gr.Dropdown(label="Sort", choices=list(R.SORTS), value=R.SORTS[0], elem_id="rollout-sort")
                    f_min = gr.Textbox(label="Min reward (empty: any)", value="", elem_id="rollout-min")
                    f_err = gr.Checkbox(label="Only with tool errors", value=False, elem_id="rollout-errors")
                table = gr.Dataframe(headers=R.TABLE_HEADERS, value=[], interactive=False, wrap=True, elem_id="rollout-table")
                with gr.Row():
                    pick_a = gr.Dropdown(label="Rollout A", choices=[], value=None, elem_id="rollout-a")
                    pick_b = gr.Dropdown(label="Rollout B", choices=[], value=None, elem_id="rollout-b")
                with gr.Row():
                    with gr.Column():
                        side_a = gr.Markdown(elem_id="side-a")
                        images_a = gr.Gallery(label="A: inputs and the image of every turn", columns=4, height=300, object_fit="contain", elem_id="images-a")
                    with gr.Column():
                        side_b = gr.Markdown(elem_id="side-b")
                        images_b = gr.Gallery(label="B: inputs and the image of every turn", columns=4, height=300, object_fit="contain", elem_id="images-b")

            with gr.Tab("Paint (EASEL)", id="paint"):
                p_state = gr.State(PaintState())
                with gr.Row():
                    p_sample = gr.Dropdown(label="Reference (scikit-image sample)", choices=list(SAMPLES), value=SAMPLES[0], elem_id="paint-sample")
                    p_upload = gr.Image(label="…or your own reference", type="filepath", elem_id="paint-upload")
                    with gr.Column():
                        p_budget = gr.Number(label="Budget (strokes + undos)", value=20, precision=0, elem_id="paint-budget")
                        p_size = gr.Number(label="Canvas side (px)", value=128, precision=0, elem_id="paint-size")
                        p_start = gr.Button("Start painting", variant="primary", elem_id="paint-start")
                p_stroke = gr.Textbox(label="brush_stroke: 13 numbers in [0, 1] as JSON (or in order), 'undo' or 'submit'",
                                      value=json.dumps(EXAMPLE_STROKE), elem_id="paint-stroke")
                with gr.Row():
                    p_go = gr.Button("Stroke", elem_id="paint-go")
                    p_undo = gr.Button("Undo", elem_id="paint-undo")
                    p_submit = gr.Button("Submit", elem_id="paint-submit")
                p_status = gr.Textbox(label="Step and S", interactive=False, elem_id="paint-status")
                with gr.Row():
                    p_ref = gr.Image(label="Reference", interactive=False, elem_id="paint-reference")
                    p_canvas = gr.Image(label="Canvas", interactive=False, elem_id="paint-canvas")
                    p_curve = gr.Image(label="S after each step", interactive=False, elem_id="paint-curve")
                p_log = gr.Markdown(elem_id="paint-log")

        outs = [state, steps, gallery, target, final, downloads, status, asset_ids, transcript]

        def on_start(st, files, text, spec, request: gr.Request):
            view = ctl.start(st, files, text or "", spec)
            ctl.track(getattr(request, "session_hash", None), st)
            return _outputs(view, st)

        def on_unload(request: gr.Request):
            ctl.tab_closed(getattr(request, "session_hash", None))

        # Gradio injects the request by type hint; postponed annotations are strings naming a
        # local import it cannot resolve, so hand it the class itself.
        on_start.__annotations__["request"] = on_unload.__annotations__["request"] = gr.Request

        def on_run(st):
            for v in ctl.run(st):
                yield _outputs(v, st)

        def on_example(label):
            ex = next((e for e in EXAMPLES if e.label == label), None)
            if ex is None:
                return gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return example_files(ex, Path(cfg.runs_dir) / "examples"), ex.instruction, ex.policy, ex.command

        demo.unload(on_unload)  # the tab was closed or reloaded: end its episode, keep everything saved
        use_example.click(on_example, [example], [uploads, instruction, policy, command])
        start.click(on_start, [state, uploads, instruction, policy], outs)
        step.click(lambda st: _outputs(ctl.step(st), st), [state], outs)
        run.click(on_run, [state], outs)
        stop.click(lambda st: _outputs(ctl.stop(st), st), [state], outs)
        propose.click(lambda st: _outputs(ctl.propose(st), st), [state], outs)
        approve.click(lambda st, d: _outputs(ctl.approve(st, d or ""), st), [state, decision], outs)
        reject.click(lambda st, d: _outputs(ctl.reject(st, d or ""), st), [state, decision], outs)
        execute.click(lambda st, c: _outputs(ctl.execute(st, c or ""), st), [state, command], outs)
        rollback.click(lambda st, a: _outputs(ctl.rollback(st, a), st), [state, target], outs)

        def refilter(rs, step_, group_, sort_, min_, err_, a=None, b=None):
            if rs is None:
                return [], gr.Dropdown(choices=[ALL], value=ALL), gr.Dropdown(choices=[], value=None), gr.Dropdown(choices=[], value=None)
            step_ = None if step_ in (None, ALL) else step_
            groups = rs.groups(step_)
            group_ = group_ if group_ in groups else None
            try:
                lowest = float(min_) if str(min_ or "").strip() else None
            except ValueError:  # a half-typed number filters nothing
                lowest = None
            rows = R.select(rs, step_, group_, lowest, bool(err_), sort_ or R.SORTS[0])
            keys = [r.key for r in rows]
            # Default A and B: the first and last rollout of the first group (best and worst under reward ↓).
            first = [k for k, r in zip(keys, rows) if r.group == rows[0].group] if rows else []
            a = a if a in keys else (first[0] if first else None)
            b = b if b in keys and b != a else (first[-1] if len(first) > 1 else None)
            return (R.table(rows), gr.Dropdown(choices=[ALL, *groups], value=group_ or ALL),
                    gr.Dropdown(choices=keys, value=a), gr.Dropdown(choices=keys, value=b))

        def on_load(folder_, scale_):
            rs, msg = viewer.load(folder_ or "", scale_)
            steps_ = rs.steps() if rs else []
            table_, group_dd, a_dd, b_dd = refilter(rs, None, None, R.SORTS[0], "", False)
            return (rs, msg, gr.Dropdown(choices=[ALL, *steps_], value=ALL), group_dd, table_, a_dd, b_dd)

        def on_row(rs, evt: gr.SelectData):
            """Clicking a row of the table shows that rollout as A."""
            try:
                key = evt.row_value[0]
            except (AttributeError, IndexError, TypeError):
                return gr.skip()
            return gr.Dropdown(value=key)

        on_row.__annotations__["evt"] = gr.SelectData

        load_outs = [rs_state, info, f_step, f_group, table, pick_a, pick_b]
        load.click(on_load, [folder, scale], load_outs)
        folder.submit(on_load, [folder, scale], load_outs)
        if cfg.rollouts:
            demo.load(on_load, [folder, scale], load_outs)
        filters = [rs_state, f_step, f_group, f_sort, f_min, f_err, pick_a, pick_b]
        for comp in (f_step, f_group, f_sort, f_min, f_err):
            comp.change(refilter, filters, [table, f_group, pick_a, pick_b])
        table.select(on_row, [rs_state], [pick_a])
        pick_a.change(lambda rs, k: viewer.side(rs, k), [rs_state, pick_a], [side_a, images_a])
        pick_b.change(lambda rs, k: viewer.side(rs, k), [rs_state, pick_b], [side_b, images_b])

        p_outs = [p_state, p_canvas, p_ref, p_curve, p_status, p_log]

        def paint_out(v, st):
            return st, v.canvas, v.reference, v.curve, v.status, v.log_md

        p_start.click(lambda st, s, u, b, z: paint_out(painter.start(st, s, u, b, z), st), [p_state, p_sample, p_upload, p_budget, p_size], p_outs)
        p_go.click(lambda st, t: paint_out(painter.command(st, t or ""), st), [p_state, p_stroke], p_outs)
        p_stroke.submit(lambda st, t: paint_out(painter.command(st, t or ""), st), [p_state, p_stroke], p_outs)
        p_undo.click(lambda st: paint_out(painter.command(st, "undo"), st), [p_state], p_outs)
        p_submit.click(lambda st: paint_out(painter.command(st, "submit"), st), [p_state], p_outs)
    return demo


def launch(config: UIConfig, host: str = "127.0.0.1", port: int = 7860, block: bool = True):
    demo = build_app(config)
    demo.queue(default_concurrency_limit=4)
    Path(config.runs_dir).mkdir(parents=True, exist_ok=True)
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        ssr_mode=False,  # SSR needs Node; plain client rendering works everywhere
        prevent_thread_lock=not block,
        allowed_paths=[str(Path(config.runs_dir).resolve())],  # sessions, paintings and viewer copies live here
        quiet=True,
    )
    return demo
