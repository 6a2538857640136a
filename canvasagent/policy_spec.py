"""Parse a policy SPEC string and build policies from it.

    replay:PATH            recorded replies (a trajectory dir/JSON, a dir of per-task trajectory dirs,
                           a JSON list of replies, or JSONL/ShareGPT records keyed by task id)
    hf:PATH_OR_ID          a local Hugging Face checkpoint (transformers generate); `layout=train`
                           (with `tools=Crop,Flip`) renders the prompt as `canvasagent.train` did
    openai:MODEL@BASE_URL  an OpenAI-compatible chat endpoint
    human                  a person typing at the terminal
    scripted:NAME          a named scripted policy (see canvasagent.core.policies.scripted)

Options may follow as a query string, e.g. `hf:ckpt?max_new_tokens=64&temperature=0.7` or
`openai:qwen@http://127.0.0.1:8000/v1?timeout_s=5&max_retries=1`. Numbers are parsed; unknown
option names are rejected so a typo fails loudly.

Evaluation builds one policy per task, so a spec becomes a `PolicyFactory`: heavy resources (a
model, an HTTP client) are created once and shared, per-task state (a replay cursor) is not.
"""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from canvasagent.core.policies.human import HumanPolicy
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.policies.scripted import SCRIPT_NAMES, scripted_policy
from canvasagent.core.tasks import Task

log = logging.getLogger(__name__)

KINDS = ("replay", "hf", "openai", "human", "scripted")


class PolicySpecError(ValueError):
    pass


@dataclass(frozen=True)
class PolicySpec:
    kind: str
    target: str = ""  # path, checkpoint, model name or script name
    base_url: str | None = None  # openai only
    options: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    def __str__(self) -> str:
        return self.text or f"{self.kind}:{self.target}"


def _coerce(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        with suppress(ValueError):
            return cast(v)
    return v


def parse_policy_spec(text: str) -> PolicySpec:
    raw = text.strip()
    if not raw:
        raise PolicySpecError("empty policy spec")
    kind, sep, rest = raw.partition(":")
    kind = kind.lower()
    if kind not in KINDS:
        raise PolicySpecError(f"unknown policy kind {kind!r} in {text!r}; use one of {', '.join(KINDS)}")
    options: dict[str, Any] = {}
    if "?" in rest:
        rest, _, query = rest.rpartition("?")
        options = {k: _coerce(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    if kind == "human":
        return PolicySpec("human", options=options, text=raw)
    if not rest:
        raise PolicySpecError(f"policy spec {text!r} needs a target after '{kind}:'")
    if kind == "openai":
        model, at, url = rest.partition("@")
        if not at or not model or not url:
            raise PolicySpecError(f"openai spec must be openai:MODEL@BASE_URL, got {text!r}")
        if not url.startswith(("http://", "https://")):
            raise PolicySpecError(f"openai base URL must start with http:// or https://, got {url!r}")
        return PolicySpec("openai", model, url, options, raw)
    if kind == "scripted" and rest not in SCRIPT_NAMES:
        raise PolicySpecError(f"unknown scripted policy {rest!r}; known: {', '.join(SCRIPT_NAMES)}")
    return PolicySpec(kind, rest, None, options, raw)


def _checked_options(cls: type, options: dict[str, Any], spec: PolicySpec) -> dict[str, Any]:
    allowed = {f.name for f in fields(cls)}
    bad = set(options) - allowed
    if bad:
        raise PolicySpecError(f"{spec}: unknown option(s) {sorted(bad)}; allowed: {sorted(allowed)}")
    return options


def _replies_of_messages(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        if m.get("role") in ("assistant", "gpt"):
            c = m.get("content", m.get("value", ""))
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            out.append(c)
    return out


def _replies_of_record(rec: Any) -> list[str]:
    if isinstance(rec, list):
        return [str(x) for x in rec]
    if "replies" in rec:
        return [str(x) for x in rec["replies"]]
    if "turns" in rec:  # a trajectory.json
        return [t.get("reply", "") for t in rec["turns"]]
    if "messages" in rec or "conversations" in rec:  # ShareGPT
        return _replies_of_messages(rec.get("messages") or rec.get("conversations") or [])
    raise PolicySpecError("replay record has none of replies/turns/messages")


def _record_id(rec: dict[str, Any]) -> str | None:
    for key in ("id", "task_id"):
        if key in rec:
            return str(rec[key])
    for key in ("task", "extra_info"):  # our trajectory.json, a CanvasCraft-RL record
        inner = rec.get(key)
        if isinstance(inner, dict) and "id" in inner:
            return str(inner["id"])
    return None


@dataclass
class ReplaySource:
    """Replies for each task id; `default` serves every task when the source holds one episode."""

    by_id: dict[str, list[str]] = field(default_factory=dict)
    default: list[str] | None = None

    def replies_for(self, task: Task | None) -> list[str]:
        if task is not None and task.id in self.by_id:
            return self.by_id[task.id]
        if self.default is not None:
            return self.default
        log.warning("replay source has no replies for task %r; the policy will terminate at once", getattr(task, "id", None))
        return []

    @classmethod
    def load(cls, path: str | Path) -> "ReplaySource":
        p = Path(path)
        if not p.exists():
            raise PolicySpecError(f"replay path {p} does not exist")
        if p.is_dir():
            if (p / "trajectory.json").exists():
                return cls(default=_replies_of_record(json.loads((p / "trajectory.json").read_text())))
            by_id: dict[str, list[str]] = {}
            for sub in sorted(p.rglob("trajectory.json")):
                rec = json.loads(sub.read_text())
                by_id[_record_id(rec) or sub.parent.name] = _replies_of_record(rec)
            if not by_id:
                raise PolicySpecError(f"replay dir {p} holds no trajectory.json")
            return cls(by_id=by_id)
        text = p.read_text()
        if p.suffix == ".jsonl":
            recs = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            if isinstance(data, list) and all(isinstance(x, str) for x in data):
                return cls(default=list(data))
            recs = data if isinstance(data, list) else [data]
        if len(recs) == 1:
            return cls(default=_replies_of_record(recs[0]))
        return cls(by_id={_record_id(rec) or str(i): _replies_of_record(rec) for i, rec in enumerate(recs)})


class PolicyFactory:
    """Builds the policy for each task of an evaluation from one spec."""

    def __init__(self, spec: PolicySpec | str, input_fn: Any = None):
        self.spec = parse_policy_spec(spec) if isinstance(spec, str) else spec
        self._shared: Any = None
        self._replay: ReplaySource | None = None
        self._input_fn = input_fn
        s = self.spec
        if s.kind == "replay":
            self._replay = ReplaySource.load(s.target)
        elif s.kind == "hf":
            from canvasagent.core.policies.hf_local import HFGenerationConfig, HFLocalPolicy

            opts = dict(s.options)
            layout = str(opts.pop("layout", "episode"))
            tools = str(opts.pop("tools", ""))
            cfg = HFGenerationConfig(**_checked_options(HFGenerationConfig, opts, s))
            self._shared = HFLocalPolicy(s.target, cfg)
            if layout == "train":
                self._shared = _training_layout(self._shared, [t for t in tools.split(",") if t])
            elif layout != "episode":
                raise PolicySpecError(f"{s}: layout must be 'episode' or 'train', got {layout!r}")
        elif s.kind == "openai":
            from canvasagent.core.policies.openai_compat import OpenAICompatConfig, OpenAICompatPolicy

            opts = _checked_options(OpenAICompatConfig, s.options, s)
            self._shared = OpenAICompatPolicy(OpenAICompatConfig(model=s.target, base_url=s.base_url or "", **opts))

    @property
    def name(self) -> str:
        return str(self.spec)

    def for_task(self, task: Task | None = None) -> Any:
        s = self.spec
        if s.kind == "replay":
            assert self._replay is not None
            return ReplayPolicy(self._replay.replies_for(task), name=f"replay:{Path(s.target).name}")
        if s.kind == "scripted":
            return scripted_policy(s.target, task)
        if s.kind == "human":
            return HumanPolicy(self._input_fn or input, show=None)
        return self._shared

    def close(self) -> None:
        close = getattr(self._shared, "close", None)
        if callable(close):
            close()


def _training_layout(policy: Any, tools: list[str]) -> Any:
    """Show a checkpoint trained by `canvasagent.train` exactly the prompt layout it was trained on
    (system text with the chat template's tool block for `tools`), via the training package."""
    from canvasagent.training.env import tool_functions
    from canvasagent.training.messages import LayoutPolicy, system_text

    wrapped = LayoutPolicy(policy, system_text(policy.processor, tool_functions(tools or None), "canvasagent"))
    wrapped.name = policy.name
    return wrapped


def build_policy(spec: str | PolicySpec, task: Task | None = None) -> Any:
    """One policy from a spec (a convenience for single sessions: chat, UI, evaluate)."""
    return PolicyFactory(spec).for_task(task)
