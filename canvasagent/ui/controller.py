"""What the web UI does, without the web: one `Session` per browser tab, as plain Python.

Keeping Gradio out of this module lets the behaviour be tested directly and keeps `app.py` a
thin layout. Every action returns a `View`, the full state to render: the transcript (one message
per turn: the reason, the call with its arguments, the observation with its image), the step log,
the asset gallery (imglist IDs with provenance), the rollback choices and the download files.

`PaintController` does the same for the EASEL Paint tab: a `PaintSession` per tab, and a
`PaintView` (canvas, reference, S curve, status) after every command.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from canvasagent.core.episode import EpisodeConfig, StepResult
from canvasagent.core.imageio import load_image
from canvasagent.interactive.session import Proposal, Session, parse_edit
from canvasagent.core.policies.guards import GuardConfig, GuardedPolicy
from canvasagent.core.policies.human import human_reply
from canvasagent.policy_spec import build_policy
from canvasagent.ui.rollouts import md_text
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from toolserver.client import make_toolbox

log = logging.getLogger(__name__)


@dataclass
class UIConfig:
    policy: str | None = None  # default policy spec; the page can override it
    tools: str = "offline"
    runs_dir: str = "runs/ui"
    max_turns: int = 12
    max_invalid: int = 4
    rollouts: str | None = None  # a GRPO dump or eval run the Rollouts tab opens at start
    scale_rewards: str = "group"  # how the viewer recomputes GRPO advantages (the run's grpo.scale_rewards)


@dataclass
class View:
    log_md: str
    gallery: list[tuple[Any, str]]  # (image file path, caption)
    asset_ids: list[str]
    final_image: Any  # file path of the final image, or None
    files: list[str]
    status: str
    transcript: list[dict[str, Any]] = field(default_factory=list)  # chat messages (role, content parts)


@dataclass(frozen=True)
class Example:
    """An offline example: a scikit-image sample photo, an instruction and how to drive it."""

    label: str
    sample: str  # a skimage.data function name
    instruction: str
    policy: str  # "" = you type every call
    command: str  # a take-over command that does the task with the offline tools


EXAMPLES: tuple[Example, ...] = (
    Example("Astronaut · mirror it (scripted policy)", "astronaut", "Mirror the photo left to right.", "scripted:flip", ""),
    Example("Cat · keep the left half (you drive)", "chelsea", "Keep only the left half of the photo.", "",
            'Crop {"image": "img_1", "bbox": [0, 0, 500, 1000]}'),
    Example("Coffee · turn it a quarter (you drive)", "coffee", "Rotate the photo by 90 degrees.", "",
            'Rotate {"image": "img_1", "angle": 90}'),
)


def write_once(path: Path, write: Callable[[Path], Any]) -> Path:
    """`path`, made by `write(temp file)` and a rename unless it exists: the files the page serves
    are never rewritten, so a browser fetching one never gets half of it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write(tmp)
        tmp.replace(path)
    return path


def example_files(example: Example, folder: str | Path) -> list[str]:
    """The example's image written once under `folder` (no network: the photos ship with scikit-image)."""
    import skimage.data

    path = Path(folder) / f"{example.sample}.png"
    return [str(write_once(path, lambda tmp: Image.fromarray(getattr(skimage.data, example.sample)()).save(tmp, format="PNG")))]


@dataclass
class UIState:
    session: Session | None = None
    log: list[str] = field(default_factory=list)
    dir: Path | None = None
    pending: Proposal | None = None  # proposed by the policy, waiting for the user's decision


def provenance_caption(asset: Any) -> str:
    p = asset.provenance
    if p.tool is None:
        return f"{asset.id} · input"
    args = json.dumps(p.arguments, ensure_ascii=False)
    if len(args) > 80:
        args = args[:77] + "…"
    src = ", ".join(p.inputs) or "–"
    return f"{asset.id} · {p.tool} (turn {p.turn + 1 if p.turn is not None else '?'}) from {src} · {args}"


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _file(path: Any) -> dict[str, Any]:
    return {"path": str(path)}  # Gradio fills in the image MIME type, so the chat shows it inline


class UIController:
    def __init__(self, config: UIConfig | None = None):
        self.config = config or UIConfig()
        # Tab -> state, so closing a tab ends its episode at once (Gradio drops tab state an hour later).
        self._tabs: dict[str, UIState] = {}

    def track(self, tab: str | None, st: UIState) -> None:
        if tab:
            self._tabs[tab] = st

    def tab_closed(self, tab: str | None) -> None:
        st = self._tabs.pop(tab or "", None)
        if st is not None:
            self.close(st)

    def view(self, st: UIState, status: str = "") -> View:
        s = st.session
        if s is None:
            return View("_Upload images, type an instruction and press **Start**._", [], [], None, [], status or "idle")
        assets = list(s.episode.assets)
        final = s.trajectory.final_asset()
        files = self._exports(st) if st.dir is not None else []
        state = status or (f"finished ({s.trajectory.stop_reason})" if s.done else f"running · turn {len(s.trajectory.turns)}")
        return View(
            "\n\n".join(st.log) or "_Session started. Press **Step** or **Run**._",
            [(self._still(st, a.image), provenance_caption(a)) for a in assets],
            [a.id for a in assets],
            self._still(st, final.image) if final is not None else None,
            files,
            state,
            self.transcript(st),
        )

    def transcript(self, st: UIState) -> list[dict[str, Any]]:
        """The conversation so far, from the trajectory itself (so a rollback rewinds it): the
        task with its images, then per turn who decided, the reason, the call with its arguments
        and the observation with the image it made; then any proposal awaiting a decision."""
        s = st.session
        if s is None:
            return []
        task = s.trajectory.task
        assets = s.episode.assets
        user: list[dict[str, Any]] = [_text(f"**Task** — {md_text(task.instruction) or '_(no instruction)_'}  \nimglist: {assets.imglist_text()}")]
        user += [_file(self._still(st, img)) for img in task.images]
        msgs = [{"role": "user", "content": user}]
        for t in s.trajectory.turns:
            who = t.result_data.get("user")
            call = f"`{t.call.name} {json.dumps(t.call.arguments, ensure_ascii=False)}`" if t.call else ("`<Terminate>`" if t.status == "terminate" else "_no valid call_")
            if who == "took_over":
                msgs.append({"role": "user", "content": [_text(f"**Turn {t.index + 1} · you took over** — {call}")]})
            else:
                note = " _(arguments edited by you)_" if who == "edited" else ""
                msgs.append({"role": "assistant", "content": [_text(
                    f"**Turn {t.index + 1}** — reason: {md_text(t.reason) or '_(none)_'}  \ncall: {call}{note}")]})
            if t.error_code == "user_rejected":  # the user's decision, not a tool's observation
                msgs.append({"role": "user", "content": [_text(f"✗ **you rejected turn {t.index + 1}** — {md_text(t.error or '')}")]})
                continue
            if t.status == "terminate":
                obs = "↳ finished"
            elif t.status == "ok":
                obs = f"↳ observation: {md_text(t.observation or t.tool_text or '')}"
            else:
                obs = f"↳ **{t.status}** ({t.error_code}): {md_text(t.error or '')}"
            parts = [_text(obs)]
            if t.output_id and t.output_id in assets:
                parts.append(_file(self._still(st, assets.get(t.output_id).image)))
            msgs.append({"role": "assistant", "content": parts})
        p = st.pending
        if p is not None:
            call = f"`{p.call.name} {json.dumps(p.call.arguments, ensure_ascii=False)}`" if p.call else ("`<Terminate>`" if p.terminates else "_no valid call_")
            msgs.append({"role": "assistant", "content": [_text(
                f"**Proposed (turn {len(s.trajectory.turns) + 1})** — reason: {md_text(p.parsed.reason) or '_(none)_'}  \ncall: {call}  \n"
                "_awaiting your decision: Approve, edit then Approve, or Reject_")]})
        if s.done:
            msgs.append({"role": "assistant", "content": [_text(f"■ session finished ({s.trajectory.stop_reason})")]})
        return msgs

    @staticmethod
    def _still(st: UIState, image: Image.Image) -> Any:
        """An image as a write-once file named by its content. Gradio rewrites the cache file of a
        PIL output on every update, and a browser fetching it meanwhile gets a truncated image;
        a path is copied into the cache only once."""
        if st.dir is None:
            return image
        digest = hashlib.sha1(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()[:20]
        return str(write_once(st.dir / "view" / f"{digest}.png", lambda tmp: image.save(tmp, format="PNG")))

    @staticmethod
    def _exports(st: UIState) -> list[str]:
        """Download files as immutable snapshots: the live trajectory.json is rewritten every step,
        and a file that changes while the browser downloads it arrives corrupted."""
        s = st.session
        assert s is not None and st.dir is not None
        export = st.dir / "export"  # write_once makes it
        version = f"{len(s.trajectory.turns):03d}-{len(s.trajectory.meta.get('rollbacks', []))}-{s.trajectory.stop_reason}"
        traj_file = write_once(export / f"trajectory-{version}.json",
                               lambda tmp: tmp.write_text(json.dumps(s.trajectory.to_dict(), indent=2, ensure_ascii=False, default=str)))
        files = [str(traj_file)]
        final = s.trajectory.final_asset()
        if final is not None:
            files.append(str(write_once(export / f"final-{version}-{final.id}.png", lambda tmp: final.image.save(tmp, format="PNG"))))
        return files

    def _log_proposal(self, st: UIState, p: Proposal) -> None:
        n = len(st.session.trajectory.turns) + 1 if st.session else 0
        call = f"`{p.call.name}` `{json.dumps(p.call.arguments, ensure_ascii=False)}`" if p.call else ("`<Terminate>`" if p.terminates else "_no valid call_")
        st.log.append(f"**Step {n}** — reason: {p.parsed.reason or '_(none)_'}  \ncall: {call}")

    def _log_result(self, st: UIState, res: StepResult) -> None:
        t = res.turn
        if t.status == "ok":
            st.log.append(f"↳ ok{(' → **' + t.output_id + '**') if t.output_id else ''}: {t.tool_text or ''}")
        elif t.status == "terminate":
            st.log.append("↳ finished")
        else:
            st.log.append(f"↳ {t.status} ({t.error_code}): {t.error}")

    def start(self, st: UIState, image_paths: list[str] | None, instruction: str, policy_spec: str | None) -> View:
        if st.session is not None and not st.session.done:
            st.session.finish("user_restarted")
        images = [load_image(Path(p)) for p in (image_paths or [])]
        spec = (policy_spec or "").strip() or self.config.policy
        task = Task(instruction.strip(), images, id="ui")
        policy = None
        if spec:
            try:
                policy = GuardedPolicy(build_policy(spec, task), GuardConfig(max_consecutive_invalid=self.config.max_invalid))
            except Exception as e:  # a bad spec is shown on the page, not a server crash
                return self.view(UIState(), f"error: {e}")
        st.dir = Path(self.config.runs_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        st.session = Session(task, make_toolbox(self.config.tools), policy, EpisodeConfig(max_turns=self.config.max_turns), out_dir=st.dir)
        st.log = [f"Session started with {len(images)} image(s): {st.session.episode.assets.imglist_text()} · policy: {spec or 'you'}"]
        return self.view(st)

    def step(self, st: UIState) -> View:
        s = st.session
        if s is None or s.done:
            return self.view(st, "start a session first" if s is None else "")
        if s.policy is None:
            return self.view(st, "no policy: type a command and press Execute")
        if st.pending is not None:  # Step/Run accept what is already proposed
            return self.approve(st)
        p = s.propose()
        if p.error:
            st.log.append(f"⚠ the policy failed: {p.error}. Take over or press Step to retry.")
            return self.view(st, "policy error")
        self._log_proposal(st, p)
        self._log_result(st, s.approve(p))
        return self.view(st)

    def propose(self, st: UIState) -> View:
        s = st.session
        if s is None or s.done:
            return self.view(st, "start a session first" if s is None else "")
        if s.policy is None:
            return self.view(st, "no policy: type a command and press Execute")
        if st.pending is None:
            p = s.propose()
            if p.error:
                st.log.append(f"⚠ the policy failed: {p.error}. Take over or try again.")
                return self.view(st, "policy error")
            st.pending = p
            self._log_proposal(st, p)
            st.log.append("↳ _awaiting your decision: Approve (optionally with edited arguments) or Reject_")
        return self.view(st, "awaiting approval")

    def approve(self, st: UIState, edit: str = "") -> View:
        s, p = st.session, st.pending
        if s is None or p is None:
            return self.view(st, "nothing proposed: press Propose first")
        edit = edit.strip()
        if not edit:
            res = s.approve(p)
        else:
            try:
                name, args = parse_edit(edit, p)
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                return self.view(st, f"error: could not use that edit ({e}); nothing was executed")
            problem = s.check(format_reply("edit", {"name": name, "arguments": args}))
            if problem is not None:  # e.g. an unknown asset: the proposal stays pending, fix and retry
                return self.view(st, f"error: that edit would not run ({problem}); nothing was executed")
            res = s.edit_arguments(p, args, name=name)
        st.pending = None
        if edit:
            st.log.append(f"✎ you edited the call: `{edit}`")
        self._log_result(st, res)
        return self.view(st)

    def reject(self, st: UIState, reason: str = "") -> View:
        s, p = st.session, st.pending
        if s is None or p is None:
            return self.view(st, "nothing proposed: press Propose first")
        s.reject(p, reason.strip())
        st.pending = None
        st.log.append(f"✗ rejected{(': ' + reason.strip()) if reason.strip() else ''} (the policy sees this)")
        return self.view(st)

    def run(self, st: UIState) -> Iterator[View]:
        """Step until the episode ends, yielding after each step so the page streams."""
        try:
            while st.session is not None and not st.session.done:
                before = len(st.log)
                view = self.step(st)
                yield view
                if view.status == "policy error" or len(st.log) == before:
                    return
        except GeneratorExit:  # the browser went away mid-run: keep what was done
            if st.session is not None:
                st.session.save()
            raise

    def execute(self, st: UIState, command: str) -> View:
        s = st.session
        if s is None or s.done:
            return self.view(st, "start a session first" if s is None else "")
        problem = s.check(human_reply(command))
        if problem is not None:  # a typo or an unknown asset: nothing runs, nothing is recorded
            return self.view(st, f"error: that would not run ({problem}); fix it and press Execute again")
        st.pending = None  # taking over replaces any pending proposal
        st.log.append(f"**You** — `{command.strip()}`")
        self._log_result(st, s.take_over(command))
        return self.view(st)

    def rollback(self, st: UIState, asset_id: str | None) -> View:
        s = st.session
        if s is None or not asset_id:
            return self.view(st, "choose an asset to roll back to")
        st.pending = None
        try:
            s.rollback(asset_id)
        except KeyError as e:
            return self.view(st, f"error: {e}")
        st.log.append(f"↺ rolled back to **{asset_id}**; imglist is {s.episode.assets.imglist_text()}")
        return self.view(st)

    def stop(self, st: UIState) -> View:
        if st.session is not None:
            st.session.finish("user_closed")
            st.log.append("■ stopped by the user")
        return self.view(st)

    @staticmethod
    def close(st: UIState) -> None:
        """The tab was closed: end the episode, keeping everything saved."""
        if st is not None and st.session is not None and not st.session.done:
            log.info("UI session closed mid-episode; saved to %s", st.dir)
            st.session.finish("user_closed")


@dataclass
class PaintView:
    canvas: Any  # file path of the canvas image, or None before a start
    reference: Any
    curve: Any  # file path of the S curve plot, or None before the first step
    status: str
    log_md: str


@dataclass
class PaintState:
    session: Any = None  # a PaintSession
    dir: Path | None = None
    log: list[str] = field(default_factory=list)


class PaintController:
    """The Paint tab: start a painting of a reference, then one command per click (see
    `canvasagent.interactive.paint.parse_command`); S is shown after every stroke."""

    def __init__(self, runs_dir: str | Path = "runs/ui"):
        self.runs_dir = Path(runs_dir)

    def view(self, st: PaintState, status: str = "") -> PaintView:
        ps = st.session
        if ps is None:
            return PaintView(None, None, None, status or "choose a reference and press Start painting", "")
        d = st.dir
        assert d is not None
        curve = d / "s_curve.png"
        return PaintView(self._snapshot(d / "canvas.png", d), str(d / "reference.png"), self._snapshot(curve, d) if curve.exists() else None,
                         status or ps.status(), "\n\n".join(st.log))

    @staticmethod
    def _snapshot(path: Path, d: Path) -> str:
        """A write-once copy named by content: the live file is rewritten after every stroke, and a
        browser fetching it meanwhile would get a truncated image."""
        data = path.read_bytes()
        return str(write_once(d / "view" / f"{path.stem}-{hashlib.sha1(data).hexdigest()[:16]}.png", lambda tmp: tmp.write_bytes(data)))

    def start(self, st: PaintState, sample: str | None, upload: str | None, budget: Any, size: Any) -> PaintView:
        from canvasagent.interactive.paint import (
            PaintCommandError,
            PaintSession,
            load_reference,
        )

        try:
            ref = load_reference(upload or sample or "", int(size or 128))
            st.dir = self.runs_dir / f"paint-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            st.session = PaintSession(ref, int(budget or 20), out_dir=st.dir)
        except (PaintCommandError, ValueError, TypeError) as e:
            return self.view(st, f"error: {e}")
        st.log = [f"Painting {Path(upload).name if upload else sample} at {ref.shape[0]}×{ref.shape[1]}: {st.session.status()}"]
        return self.view(st)

    def command(self, st: PaintState, text: str) -> PaintView:
        from canvasagent.interactive.paint import PaintCommandError

        ps = st.session
        if ps is None:
            return self.view(st, "press Start painting first")
        try:
            step = ps.command(text)
        except PaintCommandError as e:  # nothing was done: fix it and try again
            return self.view(st, f"error: {e}")
        r = step.result
        st.log.append(f"**{step.tool}** — {r.message} · {ps.status()}")
        return self.view(st)
