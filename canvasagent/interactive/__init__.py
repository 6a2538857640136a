"""Interactive sessions (terminal chat and web UI) over the one episode loop."""

from canvasagent.interactive.session import Proposal, Session

__all__ = ["Proposal", "Session"]
