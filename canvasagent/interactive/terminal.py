"""The terminal front end of a `Session`: shows reason, call and result each step, asks the user."""

from __future__ import annotations

import builtins
import json
from typing import Callable

from canvasagent.core.episode import StepResult
from canvasagent.interactive.session import Proposal, Session, parse_edit
from canvasagent.core.policies.human import HELP, human_reply
from canvasagent.core.protocol import format_reply
from canvasagent.core.trajectory import Trajectory

CHOICES = "[a]pprove  [e]dit  [r]eject  [t]ake over  [q]uit"


def describe_proposal(p: Proposal) -> list[str]:
    lines = [f"reason: {p.parsed.reason or '(none)'}"]
    if p.call is not None:
        lines.append(f"call:   {p.call.name} {json.dumps(p.call.arguments, ensure_ascii=False)}")
    elif p.terminates:
        lines.append("call:   <Terminate> (the policy wants to finish)")
    else:
        issues = "; ".join(f.message for f in p.parsed.findings) or "no call"
        lines.append(f"call:   (none: {issues})")
        lines.append(f"raw:    {p.reply[:200]!r}")
    return lines


def describe_result(res: StepResult, session: Session) -> list[str]:
    t = res.turn
    if t.status == "ok":
        saved = f" -> {t.output_id}" if t.output_id else ""
        where = f" (saved to {session.out_dir / 'assets' / (t.output_id + '.png')})" if t.output_id and session.out_dir else ""
        return [f"result: ok{saved}{where}", f"        {t.tool_text or ''}".rstrip(), f"imglist: {session.episode.assets.imglist_text()}"]
    if t.status == "terminate":
        return ["result: finished"]
    return [f"result: {t.status} ({t.error_code}): {t.error}", f"imglist: {session.episode.assets.imglist_text()}"]


class TerminalChat:
    def __init__(self, session: Session, input_fn: Callable[[str], str] | None = None, show: Callable[[str], None] = print, auto: bool = False):
        self.session = session
        # Looked up at call time, so a replaced builtins.input (tests, embedding) is honoured.
        self.input = input_fn or (lambda prompt: builtins.input(prompt))
        self.show = show
        self.auto = auto

    def _ask(self, prompt: str) -> str:
        return self.input(prompt).strip()

    def _take_over(self) -> None:
        """Ask for the user's own call until it would run (a typo or an unknown asset asks again)."""
        self.show(HELP)
        while True:
            command = self._ask("you> ")
            problem = self.session.check(human_reply(command))
            if problem is None:
                break
            self.show(f"that would not run ({problem}); imglist: {self.session.episode.assets.imglist_text()}. Try again.")
        res = self.session.take_over(command)
        self._print(describe_result(res, self.session))

    def _print(self, lines: list[str]) -> None:
        for line in lines:
            self.show(line)

    def _edit(self, proposal: Proposal) -> None:
        """Ask for edited arguments until they would run; an empty line goes back to the choices."""
        while True:
            text = self._ask("new arguments as JSON, or Tool {json} (empty: back)> ")
            if not text:
                self.show("edit cancelled; nothing was executed")
                self._decide(proposal)
                return
            try:
                name, args = parse_edit(text, proposal)
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                self.show(f"could not use that edit ({e}); nothing was executed. Try again.")
                continue
            problem = self.session.check(format_reply("edit", {"name": name, "arguments": args}))
            if problem is None:
                break
            self.show(f"that edit would not run ({problem}); imglist: {self.session.episode.assets.imglist_text()}. Try again.")
        res = self.session.edit_arguments(proposal, args, name=name)
        self._print(describe_result(res, self.session))

    def step(self) -> None:
        s = self.session
        if s.policy is None:
            self._take_over()
            return
        proposal = s.propose()
        if proposal.error:
            self.show(f"the policy failed: {proposal.error}")
            choice = self._ask("[r]etry  [t]ake over  [q]uit > ").lower()[:1]
            if choice == "t":
                self._take_over()
            elif choice == "q":
                s.finish("user_closed")
            return
        self._print([f"--- step {len(s.trajectory.turns) + 1}", *describe_proposal(proposal)])
        self._decide(proposal)

    def _decide(self, proposal: Proposal) -> None:
        """Ask what to do with `proposal` until the user picks a valid choice."""
        s = self.session
        choice = "a" if self.auto else (self._ask(CHOICES + " > ").lower()[:1] or "a")
        while choice not in "aertq":
            self.show(f"unknown choice {choice!r}")
            choice = self._ask(CHOICES + " > ").lower()[:1] or "a"
        if choice == "a":
            self._print(describe_result(s.approve(proposal), s))
        elif choice == "e":
            self._edit(proposal)
        elif choice == "r":
            s.reject(proposal, self._ask("why (shown to the policy)> "))
            self.show("rejected; the policy will see your reason")
        elif choice == "t":
            self._take_over()
        elif choice == "q":
            s.finish("user_closed")

    def run(self) -> Trajectory:
        try:
            while not self.session.done:
                self.step()
        except (EOFError, KeyboardInterrupt):
            self.show("\nsession closed; saving what was done")
            self.session.finish("user_closed")
        traj = self.session.finish(self.session.trajectory.stop_reason if self.session.done else "user_closed")
        final = traj.final_asset_id
        where = f" in {self.session.out_dir}" if self.session.out_dir else ""
        self.show(f"done ({traj.stop_reason}); final image: {final or 'none'}; trajectory saved{where}")
        return traj
