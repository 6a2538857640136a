"""Guards around any policy, so that a broken one ends its episode quickly with a clear reason.

`run_episode` already turns a policy exception into `stop_reason="policy_error"` with the message
in `trajectory.meta["error"]` and keeps every turn so far. These guards raise such exceptions
when a policy keeps emitting unparseable text or runs past a wall-clock budget, instead of
burning the whole turn budget on garbage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

INVALID_STATUSES = ("parse_error", "no_call")


class PolicyGaveUp(RuntimeError):
    """Raised by a guard; the message is what the user sees."""


@dataclass
class GuardConfig:
    max_consecutive_invalid: int = 4  # unparseable replies in a row before giving up (0: never)
    episode_timeout_s: float = 0.0  # wall-clock budget for one episode (0: none)


class GuardedPolicy:
    def __init__(self, policy: Any, config: GuardConfig | None = None):
        self.policy = policy
        self.config = config or GuardConfig()
        self.name = getattr(policy, "name", type(policy).__name__)
        self._t0: float | None = None

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        cfg = self.config
        if self._t0 is None:
            self._t0 = time.monotonic()
        turns = episode.trajectory.turns if episode is not None and episode.trajectory else []
        k = cfg.max_consecutive_invalid
        if k and len(turns) >= k and all(t.status in INVALID_STATUSES for t in turns[-k:]):
            raise PolicyGaveUp(f"the policy produced {k} invalid replies in a row (last: {turns[-1].error})")
        if cfg.episode_timeout_s and time.monotonic() - self._t0 > cfg.episode_timeout_s:
            raise PolicyGaveUp(f"the episode ran past its {cfg.episode_timeout_s:g}s budget")
        return self.policy.act(messages, episode)
