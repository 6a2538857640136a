"""The paper's rule-based reward (Eqs. 2-7), computed from a recorded trajectory.

    R_rule   = w_f·R_format + w_a·R_action − λ·P_eff              (Eq. 2, w = 0.4 / 0.6)
    R_action = mean_i q_i,  q_i = 0.25·name + 0.25·schema + 0.20·ref + 0.20·spec + 0.10·exec
    A_i      = A_{i−1} ∪ {OutputID(f_i)} after a successful image-producing call    (Eq. 6)
    P_eff    = P_error + P_repeat + P_length + P_cost + P_miss                      (Eq. 7)

Inputs, and why nothing is parsed or validated twice:

* R_format reads the typed `Finding`s the protocol parser stored on each `Turn`; each finding
  maps to one of the paper's five checks through `Finding.check`.
* q_i is scored by replaying the asset state from the task's inputs: the one validator
  (`toolserver.validation.validate_call`) re-runs each call against A_{i−1}, and an output ID is
  added only after a call that really succeeded. Replaying (not trusting the stored `Turn.check`)
  makes the score independent of how the trajectory was recorded; disagreements with the stored
  check are counted as `rule/replay_mismatch`.
* A reply the runner refused (two calls in a turn, say) is re-read with the same parser,
  `parse_reply`, so its calls are still scored, with exec = 0.

Nothing here raises on a malformed trajectory: every degenerate case has a defined score and a
reason in `RuleBreakdown.reasons`, which is also logged at debug level.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from canvasagent.core.assets import AssetStore
from canvasagent.core.protocol import FormatCheck, ToolCall, parse_reply
from canvasagent.core.trajectory import Trajectory, Turn
from rewards.config import RuleConfig
from toolserver.registry import REGISTRY, OutputKind
from toolserver.validation import CallCheck, Profile, validate_call

log = logging.getLogger(__name__)

_FORMAT_KEYS: tuple[tuple[FormatCheck, str], ...] = (
    (FormatCheck.REASON, "reason"),
    (FormatCheck.JSON, "json"),
    (FormatCheck.ONE_CALL, "one_call"),
    (FormatCheck.TERMINATE, "terminate"),
    (FormatCheck.CLEAN, "clean"),
)
ACTION_TERMS = ("name", "schema", "ref", "spec", "exec")
PENALTY_TERMS = ("error", "repeat", "length", "cost", "miss")

# Rough token count without a tokenizer: each word, punctuation mark or CJK character is one.
_TOKEN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]|[A-Za-z0-9_]+|[^\sA-Za-z0-9_]")
_PUNCT = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum() and chr(c) != "_")
_DROP_PUNCT = str.maketrans("", "", _PUNCT)
_PUNCT_TO_SPACE = str.maketrans(_PUNCT, " " * len(_PUNCT))


def estimate_tokens(text: str | None) -> int:
    if not text:
        return 0
    if text.isascii():
        # The regex's count, with C-speed string methods: words plus one per punctuation mark.
        return len(text.translate(_PUNCT_TO_SPACE).split()) + len(text) - len(text.translate(_DROP_PUNCT))
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class _Ghost:
    """Stand-in for an asset that is no longer in the store (rolled back): kind known, size not."""

    id: str
    kind: OutputKind
    size: tuple[int, int] | None = None


class ReplayAssets:
    """A_{i−1}: the asset IDs available before call i, looked up in the episode's store.

    Implements the validator's `AssetLookup` protocol, so `validate_call` sees exactly the
    state the paper's Eq. 6 defines instead of the final store.
    """

    def __init__(self, store: AssetStore, initial: list[str]):
        self._store = store
        self._ids: list[str] = list(initial)
        self._set = set(initial)
        self._ghosts: dict[str, _Ghost] = {}
        self._counters: dict[str, int] = {}

    def __contains__(self, asset_id: object) -> bool:
        return isinstance(asset_id, str) and asset_id in self._set

    def get(self, asset_id: str) -> Any:
        if asset_id in self._ghosts:
            return self._ghosts[asset_id]
        return self._store.get(asset_id)

    def ids(self) -> list[str]:
        return list(self._ids)

    def add_output(self, tool: str, recorded_id: str | None) -> str | None:
        """Register the output of a successful image-producing call; returns its ID."""
        k = self._counters.get(tool, 0)
        self._counters[tool] = k + 1
        aid = recorded_id or f"{tool}_{k}"  # OutputID(f_i): the per-tool counter of the public code
        if aid in self._set:
            return aid
        if aid not in self._store:
            if recorded_id is None:
                return None  # the runner registered nothing (no image came back)
            self._ghosts[aid] = _Ghost(aid, REGISTRY[tool].output)
        self._ids.append(aid)
        self._set.add(aid)
        return aid


@dataclass
class CallScore:
    """q_i and its five terms for one parsed call."""

    turn: int
    tool: str
    name: float
    schema: float
    ref: float
    spec: float
    exec: float
    q: float
    issues: list[str] = field(default_factory=list)
    output_id: str | None = None
    key: tuple[str, str] = ("", "")  # (tool, canonical args) for the repeat penalty
    refs: tuple[str, ...] = ()
    numbers: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "tool": self.tool,
            "q": self.q,
            **{t: getattr(self, t) for t in ACTION_TERMS},
            "issues": self.issues,
            "output_id": self.output_id,
        }


@dataclass
class RuleBreakdown:
    r_rule: float
    r_rule_raw: float
    r_format: float
    r_action: float
    p_eff: float
    format_checks: dict[str, float]
    action_terms: dict[str, float]
    penalties: dict[str, float]
    amounts: dict[str, float]
    calls: list[CallScore]
    n_turns: int
    n_format_turns: int
    n_errors: int
    replay_mismatch: int
    reasons: list[str] = field(default_factory=list)

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    @property
    def n_executable(self) -> int:
        """Calls whose name, schema, references and tool-specific checks all passed."""
        return sum(1 for c in self.calls if c.name and c.schema and c.ref >= 1.0 and c.spec)

    def to_flat(self, prefix: str = "rule") -> dict[str, float]:
        out = {
            prefix: self.r_rule,
            f"{prefix}/raw": self.r_rule_raw,
            f"{prefix}/format": self.r_format,
            f"{prefix}/action": self.r_action,
            f"{prefix}/p_eff": self.p_eff,
            f"{prefix}/n_calls": float(self.n_calls),
            f"{prefix}/n_errors": float(self.n_errors),
            f"{prefix}/n_turns": float(self.n_turns),
            f"{prefix}/replay_mismatch": float(self.replay_mismatch),
        }
        out.update({f"{prefix}/format/{k}": v for k, v in self.format_checks.items()})
        out.update({f"{prefix}/action/{k}": v for k, v in self.action_terms.items()})
        out.update({f"{prefix}/p_eff/{k}": v for k, v in self.penalties.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**self.to_flat(), "calls": [c.to_dict() for c in self.calls], "amounts": self.amounts, "reasons": self.reasons}


def _canonical(value: Any) -> str:
    with suppress(TypeError, ValueError):
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    try:
        return repr(value)
    except ValueError:  # an int past Python's int -> str digit limit has neither form
        return f"<{type(value).__name__} without a printable form>"


def _numeric_lists(args: Any) -> dict[str, list[float]]:
    """The all-numeric list arguments as floats, for near-repeat detection. A list holding a
    number no float can hold (a 400-digit int) is left out: the validator already refused it."""
    out: dict[str, list[float]] = {}
    if not isinstance(args, dict):
        return out
    for k, v in args.items():
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            with suppress(OverflowError):
                out[k] = [float(x) for x in v]
    return out


def _score_call(
    turn: Turn, call: ToolCall, executed: bool, state: ReplayAssets, profile: Profile, cfg: RuleConfig
) -> tuple[CallScore, CallCheck]:
    chk = validate_call(call.name, call.arguments, state, profile)
    args_ok = isinstance(call.arguments, dict)
    w = cfg.action
    name = 1.0 if chk.name_ok else 0.0
    schema = 1.0 if chk.schema_ok else 0.0
    # With an unknown tool or non-object arguments there is no schema to say which arguments are
    # asset references, so no reference can be verified: r_ref = 0 rather than a vacuous 1.
    ref = chk.ref_fraction if (chk.name_ok and args_ok) else 0.0
    spec = 1.0 if chk.spec_ok else 0.0
    ex = 1.0 if executed else 0.0
    q = w.name * name + w.schema * schema + w.ref * ref + w.spec * spec + w.exec * ex
    norm = {k: v for k, v in chk.args.items() if k != "__refs__"} if chk.name_ok else call.arguments
    numbers = _numeric_lists(norm)
    score = CallScore(
        turn=turn.index,
        tool=chk.tool,
        name=name,
        schema=schema,
        ref=ref,
        spec=spec,
        exec=ex,
        q=q,
        issues=[i.code for i in chk.issues],
        key=(chk.tool, _canonical(norm)),
        refs=tuple(chk.referenced_ids()),
        numbers=numbers,
    )
    return score, chk


def _stored_disagrees(stored: dict[str, Any] | None, chk: CallCheck) -> bool:
    if not stored:
        return False
    same_flags = all(bool(stored.get(k)) == getattr(chk, k) for k in ("name_ok", "schema_ok", "spec_ok"))
    return not same_flags or any(int(stored.get(k, 0)) != getattr(chk, k) for k in ("refs_found", "refs_total"))


def _turn_calls(turn: Turn) -> list[tuple[ToolCall, bool, bool]]:
    """(call, executed, is_the_runner's_call) for each call written in the turn."""
    if turn.call is not None:
        return [(turn.call, turn.status == "ok", True)]
    if turn.n_calls > 0 and turn.reply:
        # The runner refused the whole reply (e.g. two calls): score what the parser recovers, unexecuted.
        return [(c, False, False) for c in parse_reply(turn.reply).calls]
    return []


def _near_repeat(a: CallScore, b: CallScore, tol: float) -> bool:
    """Same tool on the same inputs, same text arguments, numbers within `tol` (not exact)."""
    if a.tool != b.tool or a.refs != b.refs or a.numbers.keys() != b.numbers.keys():
        return False
    for k, va in a.numbers.items():
        vb = b.numbers[k]
        if len(va) != len(vb) or any(abs(x - y) > tol for x, y in zip(va, vb)):
            return False
    try:
        da, db = json.loads(a.key[1]), json.loads(b.key[1])
    except (TypeError, ValueError):
        return False
    if not isinstance(da, dict) or not isinstance(db, dict) or da.keys() != db.keys():
        return False
    for k in da:
        if k in a.numbers:
            continue
        va, vb = da[k], db[k]
        if isinstance(va, str) and isinstance(vb, str):
            if " ".join(va.lower().split()) != " ".join(vb.lower().split()):
                return False
        elif va != vb:
            return False
    return True


def _cost(tool: str, weighted: bool) -> float:
    return (REGISTRY[tool].cost if tool in REGISTRY else 1.0) if weighted else 1.0


def score_rule(traj: Trajectory, cfg: RuleConfig | None = None) -> RuleBreakdown:
    """R_rule of one trajectory with every term; never raises on a malformed trajectory."""
    cfg = cfg or RuleConfig()
    try:
        return _score_rule(traj, cfg)
    except Exception as e:  # a bug or an object we do not understand must not stop training
        log.exception("rule reward failed on trajectory %s", getattr(getattr(traj, "task", None), "id", "?"))
        return _failed(f"rule_reward_exception: {type(e).__name__}: {e}")


def _failed(reason: str) -> RuleBreakdown:
    return RuleBreakdown(
        r_rule=0.0, r_rule_raw=0.0, r_format=0.0, r_action=0.0, p_eff=0.0,
        format_checks={k: 0.0 for _, k in _FORMAT_KEYS},
        action_terms={k: 0.0 for k in ACTION_TERMS},
        penalties={k: 0.0 for k in PENALTY_TERMS},
        amounts={k: 0.0 for k in PENALTY_TERMS},
        calls=[], n_turns=0, n_format_turns=0, n_errors=0, replay_mismatch=0, reasons=[reason],
    )


def _score_rule(traj: Trajectory, cfg: RuleConfig) -> RuleBreakdown:
    reasons: list[str] = []
    profile = Profile(traj.meta.get("profile", Profile.CANVASCRAFT.value))
    state = ReplayAssets(traj.assets, traj.assets.input_ids())

    fw = cfg.format
    format_pass = {k: 0 for _, k in _FORMAT_KEYS}
    n_format = 0
    calls: list[CallScore] = []
    mismatch = 0
    n_errors = 0
    length_amount = 0.0
    limit = max(1, cfg.penalties.length.max_reason_tokens)

    for turn in traj.turns:
        observed = bool(turn.reply) or bool(turn.findings)
        if observed:
            n_format += 1
            failed = {f.check for f in turn.findings}
            for check, key in _FORMAT_KEYS:
                if check not in failed:
                    format_pass[key] += 1
        # Every token has at least one character, so a short reason cannot exceed the limit.
        if turn.reason and len(turn.reason) > limit:
            excess = estimate_tokens(turn.reason) - limit
            if excess > 0:
                length_amount += excess / limit
        if turn.status == "error":
            n_errors += 1
        for call, executed, is_runner_call in _turn_calls(turn):
            score, chk = _score_call(turn, call, executed, state, profile, cfg)
            if is_runner_call and _stored_disagrees(turn.check, chk):
                mismatch += 1
            if executed and chk.name_ok and REGISTRY[chk.tool].output.registers_asset:
                score.output_id = state.add_output(chk.tool, turn.output_id)
            calls.append(score)

    # R_format: per check, the fraction of observed turns that pass it; termination also needs the
    # episode to have ended with <Terminate> (or an EASEL submit).
    if n_format:
        checks = {k: format_pass[k] / n_format for _, k in _FORMAT_KEYS}
        if not traj.terminated:
            checks["terminate"] = 0.0
            reasons.append(f"not_terminated:{traj.stop_reason}")
        wsum = fw.reason + fw.json + fw.one_call + fw.terminate + fw.clean
        r_format = sum(getattr(fw, k) * v for k, v in checks.items()) / wsum if wsum > 0 else 0.0
    else:
        checks = {k: fw.unobserved_score for _, k in _FORMAT_KEYS}
        r_format = fw.unobserved_score
        reasons.append("format_unobserved" if traj.turns else "no_turns")

    if calls:
        r_action = sum(c.q for c in calls) / len(calls)
        terms = {t: sum(getattr(c, t) for c in calls) / len(calls) for t in ACTION_TERMS}
    else:
        r_action = cfg.action.no_calls_score
        terms = {t: 0.0 for t in ACTION_TERMS}
        reasons.append("no_tool_call")

    pc = cfg.penalties
    exact = near = 0
    for prev, cur in zip(calls, calls[1:]):
        if cur.key == prev.key:
            exact += 1
        elif _near_repeat(prev, cur, pc.repeat.near_tolerance):
            near += 1
    repeat_amount = exact + pc.repeat.near_weight * near

    expected = [t for t in traj.task.expected_tools if isinstance(t, str)]
    budget: float | None = sum(_cost(t, pc.cost.weighted) for t in expected) if expected else pc.cost.default_budget
    if budget is None:
        cost_amount = 0.0
    else:
        spent = sum(_cost(c.tool, pc.cost.weighted) for c in calls)
        cost_amount = max(0.0, spent - budget - pc.cost.grace)

    if expected:
        ran = {c.tool for c in calls if c.exec or not pc.miss.require_success}
        want = set(expected)
        miss_amount = len(want - ran) / len(want)
    else:
        miss_amount = 0.0

    amounts = {
        "error": float(n_errors),
        "repeat": float(repeat_amount),
        "length": float(length_amount),
        "cost": float(cost_amount),
        "miss": float(miss_amount),
    }
    penalties = {k: getattr(pc, k).apply(v) for k, v in amounts.items()}
    p_eff = sum(penalties.values())

    raw = cfg.format_weight * r_format + cfg.action_weight * r_action - pc.lam * p_eff
    r_rule = min(1.0, max(0.0, raw)) if cfg.clip else raw
    if mismatch:
        reasons.append(f"replay_mismatch:{mismatch}")
    if reasons:
        log.debug("rule reward %s: %s", traj.task.id, "; ".join(reasons))
    return RuleBreakdown(
        r_rule=r_rule,
        r_rule_raw=raw,
        r_format=r_format,
        r_action=r_action,
        p_eff=p_eff,
        format_checks=checks,
        action_terms=terms,
        penalties=penalties,
        amounts=amounts,
        calls=calls,
        n_turns=len(traj.turns),
        n_format_turns=n_format,
        n_errors=n_errors,
        replay_mismatch=mismatch,
        reasons=reasons,
    )
