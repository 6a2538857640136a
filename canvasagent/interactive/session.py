"""A human-in-the-loop session: the policy proposes, the user approves, edits, rejects or takes over.

`Session` drives a core `Episode` one proposal at a time instead of `run_episode`'s closed loop:

    proposal = session.propose()         # ask the policy (nothing is executed yet)
    session.approve(proposal)            # execute it as written
    session.approve(proposal, edited)    # execute the user's edit instead
    session.reject(proposal, "why")      # record it as refused; the policy sees why
    session.take_over("Crop {...}")      # the user's own call
    session.rollback("Flip_0")           # back to an earlier asset, as if later turns never happened
    session.check(reply)                 # why a user's reply would not run (None: it would)

The trajectory is saved after every change (when `out_dir` is set), so closing the terminal or the
browser mid-episode loses nothing. Rollback truncates the asset store (`AssetStore.truncate_to`),
the turns and the conversation together, so the policy never sees assets that no longer exist.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canvasagent.core.episode import Episode, EpisodeConfig, StepResult, observation_message
from canvasagent.core.policies.human import human_reply
from canvasagent.core.protocol import ParsedReply, echo_plain, format_reply, parse_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, Turn
from toolserver.toolbox import Toolbox
from toolserver.validation import validate_call

log = logging.getLogger(__name__)


@dataclass
class Proposal:
    reply: str
    parsed: ParsedReply
    policy_s: float = 0.0
    error: str | None = None  # the policy failed to produce a reply (endpoint down, …)

    @property
    def call(self):
        return self.parsed.call

    @property
    def terminates(self) -> bool:
        return self.parsed.terminate and self.parsed.call is None


def parse_edit(text: str, proposal: Proposal) -> tuple[str, dict[str, Any]]:
    """A person's edit of a proposed call: `{json}` (new arguments for the proposed tool) or
    `Tool {json}` (another tool). Raises ValueError, naming what to write, for anything else."""
    text = text.strip()
    if text.startswith("{"):
        name, args = (proposal.call.name if proposal.call else ""), json.loads(text)
    else:
        name, _, rest = text.partition(" ")
        args = json.loads(rest or "{}")
    if not name:
        raise ValueError("the proposal has no call to edit; give Tool {json}")
    if not isinstance(args, dict):
        raise ValueError("the arguments must be a JSON object")
    return name, args


class Session:
    def __init__(self, task: Task, toolbox: Toolbox, policy: Any = None, config: EpisodeConfig | None = None, out_dir: str | Path | None = None):
        self.policy = policy
        self.toolbox = toolbox
        self.episode = Episode(toolbox, config or EpisodeConfig())
        self.episode.reset(task)
        self.out_dir = Path(out_dir) if out_dir else None
        self.trajectory.meta["policy"] = getattr(policy, "name", "human") if policy is not None else "human"
        self.trajectory.meta["interactive"] = True
        self.save()

    @property
    def trajectory(self) -> Trajectory:
        assert self.episode.trajectory is not None
        return self.episode.trajectory

    @property
    def done(self) -> bool:
        return self.episode.done

    def save(self) -> Path | None:
        if self.out_dir is None:
            return None
        return self.trajectory.save(self.out_dir)

    def propose(self) -> Proposal:
        """Ask the policy for its next reply without executing it."""
        if self.policy is None:
            raise RuntimeError("this session has no policy; use take_over()")
        t0 = time.perf_counter()
        try:
            reply = self.policy.act(self.episode.context(), self.episode)
        except Exception as e:  # shown to the user, who can retry or take over
            log.warning("policy failed: %s", e)
            return Proposal("", parse_reply(""), time.perf_counter() - t0, f"{type(e).__name__}: {e}")
        return Proposal(reply, parse_reply(reply), time.perf_counter() - t0)

    def check(self, reply: str) -> str | None:
        """Why the user's `reply` (a protocol reply) could not run as a tool call, or None when it
        would: a malformed reply, no call and no <Terminate>, or a call the validator refuses (an
        unknown tool or asset, bad arguments). Nothing is executed or recorded; the front ends ask
        the user again, so only decisions reach the trajectory."""
        parsed = parse_reply(reply)
        if parsed.blocked:
            return "; ".join(f.message for f in parsed.findings if f.blocking)
        if parsed.call is None:
            return None if parsed.terminate else "no tool call: write Tool {json arguments}, or 'done'"
        check = validate_call(parsed.call.name, parsed.call.arguments, self.episode.assets, self.episode.profile)
        return None if check.executable else check.error_message()

    def approve(self, proposal: Proposal, edited_reply: str | None = None) -> StepResult:
        reply = edited_reply if edited_reply is not None else proposal.reply
        res = self.episode.step(reply, policy_s=proposal.policy_s)
        if edited_reply is not None:
            res.turn.result_data.setdefault("user", "edited")
            self.trajectory.meta.setdefault("edits", []).append({"turn": res.turn.index, "proposed": proposal.reply})
        self.save()
        return res

    def edit_arguments(self, proposal: Proposal, arguments: dict[str, Any], name: str | None = None) -> StepResult:
        """Approve the proposed call with the user's arguments (and optionally another tool)."""
        call = proposal.call
        tool = name or (call.name if call else None)
        if not tool:
            raise ValueError("the proposal has no call to edit; take over instead")
        reason = (proposal.parsed.reason or "Proposed call") + " (arguments edited by the user)"
        return self.approve(proposal, format_reply(reason, {"name": tool, "arguments": arguments}))

    def reject(self, proposal: Proposal, feedback: str = "") -> Turn:
        """Record the proposal as refused; the policy reads the user's reason on its next turn."""
        ep, traj = self.episode, self.trajectory
        msg = "the user rejected this call" + (f": {feedback}" if feedback else "")
        turn = Turn(
            index=len(traj.turns),
            reply=proposal.reply,
            reason=proposal.parsed.reason,
            findings=list(proposal.parsed.findings),
            call=proposal.call,
            n_calls=len(proposal.parsed.calls),
            status="error",
            error_code="user_rejected",
            error=msg,
            observation=echo_plain(f"Error: {msg}", ep.assets.imglist_text()),
            imglist=ep.assets.ids(),
            policy_s=proposal.policy_s,
        )
        traj.turns.append(turn)
        ep.messages.append({"role": "assistant", "content": [{"type": "text", "text": proposal.reply}]})
        ep.messages.append(observation_message(turn.observation or "", None))
        if len(traj.turns) >= ep.config.max_turns:
            ep.finish("max_turns")
        self.save()
        return turn

    def take_over(self, command: str) -> StepResult:
        """Execute the user's own command (`Tool {json}`, a protocol reply, or 'done')."""
        res = self.episode.step(human_reply(command))
        res.turn.result_data.setdefault("user", "took_over")
        self.save()
        return res

    def finish(self, reason: str = "user_closed") -> Trajectory:
        """End the session (the user closed it); everything so far stays saved."""
        self.episode.finish(reason)  # a no-op when the episode already ended
        self.save()
        return self.trajectory

    def rollback(self, asset_id: str) -> None:
        """Return to the state right after `asset_id` was made (or the start, for an input)."""
        traj, ep = self.trajectory, self.episode
        asset = ep.assets.get(asset_id)  # raises UnknownAssetError with the imglist
        keep_turns = 0 if asset.provenance.turn is None else asset.provenance.turn + 1
        ep.assets.truncate_to(asset_id)
        dropped = traj.turns[keep_turns:]
        del traj.turns[keep_turns:]
        ep.messages[:] = ep.messages[:2] + _messages_for(traj.turns, ep.assets)
        ep.done = False
        traj.stop_reason = "running"
        traj.meta.setdefault("rollbacks", []).append({"to": asset_id, "dropped_turns": len(dropped)})
        if self.out_dir is not None:  # drop the files of assets that no longer exist
            for f in (self.out_dir / "assets").glob("*.png"):
                if f.stem not in ep.assets:
                    f.unlink()
        self.save()


def _messages_for(turns: list[Turn], assets: Any) -> list[dict[str, Any]]:
    """Rebuild the conversation after the user message from recorded turns."""
    out: list[dict[str, Any]] = []
    for t in turns:
        out.append({"role": "assistant", "content": [{"type": "text", "text": t.reply}]})
        if t.observation is not None:
            image = assets.get(t.output_id).image if t.output_id and t.output_id in assets else None
            out.append(observation_message(t.observation, image))
    return out
