"""Records of an evaluation: the plan parsed from the question, probes, evidence, rounds, result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Plan:
    """What the question asks: which property of which target, under which conditions.

    `conditions` are fixed for every probe (rotation 30, bg navy, …); `axis` is the condition the
    agent searches along (text_height, contrast), `asked` the range of it the question is about
    (`[lo, hi]`, equal for one value, None: the whole axis). `strata` are categorical settings
    probed separately (the angles of Rotate). `unsupported` set means no probe can answer it.
    """

    target: str
    target_kind: str  # tool | policy | generator
    tool: str | None
    property: str | None
    conditions: dict[str, Any] = field(default_factory=dict)
    axis: str | None = None
    asked: list[float] | None = None
    strata: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # per-question measurement settings
    thought: str = ""
    source: str = "offline"
    unsupported: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["settings"] = {k: v for k, v in self.settings.items() if not k.startswith("_")}
        return d


@dataclass
class Evidence:
    """One probe's measurement against its ground truth."""

    probe_id: str
    conditions: dict[str, Any]
    value: float | None  # the axis value probed, if there is an axis
    truth: dict[str, Any]
    metrics: dict[str, float]
    passed: bool
    output: str | None = None  # saved output image, relative to the run dir
    inputs: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Round:
    index: int
    thought: str
    action: dict[str, Any]  # what was probed: {"axis": ..., "values": [...]} or {"strata": [...], "n": k}
    evidence: list[Evidence] = field(default_factory=list)
    observation: str = ""
    source: str = "offline"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgentResult:
    question: str
    target: str
    plan: Plan
    rounds: list[Round]
    answer: str  # yes | no | partly | "cannot evaluate: …"
    boundary: str | None
    summary: str
    stop: str  # why the evaluation stopped
    planner: str
    probes_used: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence(self) -> list[Evidence]:
        return [e for r in self.rounds for e in r.evidence]

    def to_dict(self) -> dict[str, Any]:
        head = ("question", "target", "answer", "boundary", "summary", "stop", "planner", "probes_used")
        return {**{k: getattr(self, k) for k in head}, "plan": self.plan.to_dict(), "details": self.details,
                "evidence": [asdict(e) for e in self.evidence], "rounds": [r.to_dict() for r in self.rounds]}
