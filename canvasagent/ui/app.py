"""The Gradio page: upload images, type an instruction, watch steps stream, browse and roll back assets.

All behaviour lives in `UIController`; this module only lays out components and wires events.
"""

from __future__ import annotations

from typing import Any

from canvasagent.ui.controller import UIConfig, UIController, UIState, View


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
    )


def build_app(config: UIConfig | None = None):
    import gradio as gr

    ctl = UIController(config)
    cfg = ctl.config
    with gr.Blocks(title="CanvasAgent", analytics_enabled=False) as demo:
        state = gr.State(UIState(), delete_callback=UIController.close)  # runs when the tab goes away
        gr.Markdown("## CanvasAgent — interactive session")
        with gr.Row():
            with gr.Column(scale=1):
                uploads = gr.File(label="Input images (img_1, img_2, … in order)", file_count="multiple", file_types=["image"], type="filepath", elem_id="uploads")
                instruction = gr.Textbox(label="Instruction", lines=2, elem_id="instruction")
                policy = gr.Textbox(label="Policy spec (empty: you type every call)", value=cfg.policy or "", elem_id="policy")
                with gr.Row():
                    start = gr.Button("Start", variant="primary", elem_id="start")
                    step = gr.Button("Step", elem_id="step")
                    run = gr.Button("Run", elem_id="run")
                    stop = gr.Button("Stop", elem_id="stop")
                with gr.Row():
                    propose = gr.Button("Propose", elem_id="propose")
                    approve = gr.Button("Approve", elem_id="approve")
                    reject = gr.Button("Reject", elem_id="reject")
                decision = gr.Textbox(label="Edited arguments (JSON or Tool {json}) to approve, or the reason to reject", elem_id="decision")
                command = gr.Textbox(label="Take over: Tool {json arguments}, or 'done'", elem_id="command")
                execute = gr.Button("Execute", elem_id="execute")
                with gr.Row():
                    target = gr.Dropdown(label="Roll back to asset", choices=[], elem_id="rollback-target")
                    rollback = gr.Button("Roll back", elem_id="rollback")
                status = gr.Textbox(label="Status", interactive=False, elem_id="status")
            with gr.Column(scale=2):
                steps = gr.Markdown(elem_id="steps")
                gallery = gr.Gallery(label="Assets (imglist ID · provenance)", columns=4, height="auto", elem_id="asset-gallery")
                asset_ids = gr.Textbox(label="imglist", interactive=False, elem_id="asset-ids")
                final = gr.Image(label="Final image", type="pil", interactive=False, elem_id="final-image")
                downloads = gr.File(label="Download: trajectory JSON and final image", file_count="multiple", interactive=False, elem_id="downloads")

        outs = [state, steps, gallery, target, final, downloads, status, asset_ids]

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

        demo.unload(on_unload)  # the tab was closed or reloaded: end its episode, keep everything saved
        start.click(on_start, [state, uploads, instruction, policy], outs)
        step.click(lambda st: _outputs(ctl.step(st), st), [state], outs)
        run.click(on_run, [state], outs)
        stop.click(lambda st: _outputs(ctl.stop(st), st), [state], outs)
        propose.click(lambda st: _outputs(ctl.propose(st), st), [state], outs)
        approve.click(lambda st, d: _outputs(ctl.approve(st, d or ""), st), [state, decision], outs)
        reject.click(lambda st, d: _outputs(ctl.reject(st, d or ""), st), [state, decision], outs)
        execute.click(lambda st, c: _outputs(ctl.execute(st, c or ""), st), [state, command], outs)
        rollback.click(lambda st, a: _outputs(ctl.rollback(st, a), st), [state, target], outs)
    return demo


def launch(config: UIConfig, host: str = "127.0.0.1", port: int = 7860, block: bool = True):
    from pathlib import Path

    demo = build_app(config)
    demo.queue(default_concurrency_limit=4)
    Path(config.runs_dir).mkdir(parents=True, exist_ok=True)
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        ssr_mode=False,  # SSR needs Node; plain client rendering works everywhere
        prevent_thread_lock=not block,
        allowed_paths=[str(Path(config.runs_dir).resolve())],  # downloads come from the session dirs
        quiet=True,
    )
    return demo
