"""Records of the evaluation agent's loop: aspects, probes, plans, samples and rounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from PIL import Image


@dataclass
class Probe:
    """One prompt written for a sub-aspect, with the checks that turn its output into evidence."""

    prompt: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    args: dict[str, dict[str, Any]] = field(default_factory=dict)  # per target tool: argument overrides
    image: dict[str, Any] | None = None  # input canvas {size: [w, h], color: [r, g, b]}

    def input_images(self) -> list[Image.Image]:
        if not self.image:
            return []
        w, h = self.image.get("size", [256, 256])
        return [Image.new("RGB", (int(w), int(h)), tuple(self.image.get("color", [255, 255, 255])))]


@dataclass
class Aspect:
    name: str
    description: str = ""
    keywords: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # tool names or "policy"; empty: any target
    probes: list[Probe] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Aspect":
        probes = [Probe(**p) for p in d.get("probes") or []]
        return cls(d["name"], d.get("description", ""), list(d.get("keywords") or []), list(d.get("targets") or []), probes)


@dataclass
class PlanStep:
    """The planner's decision: probe `sub_aspect` next, or stop with a justification."""

    thought: str
    sub_aspect: str | None = None
    stop: bool = False
    justification: str = ""
    source: str = "planner"  # which planner decided (a fallback is recorded as such)


@dataclass
class Sample:
    prompt: str
    ok: bool
    scores: dict[str, float] = field(default_factory=dict)  # overall, align, aes, … from the hybrid reward
    checks: dict[str, float] = field(default_factory=dict)  # per check type, from the alignment judge
    align_measured: bool = False
    error: str | None = None
    output: str | None = None  # path of the saved output image, relative to the run dir


@dataclass
class Round:
    index: int
    plan: PlanStep
    probes: list[Probe] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    observation: str = ""  # the evidence, as text the planner reads
    stats: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgentResult:
    question: str
    target: str
    rounds: list[Round]
    stop: PlanStep
    summary: str
    planner: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "target": self.target,
            "planner": self.planner,
            "rounds": [r.to_dict() for r in self.rounds],
            "stop": asdict(self.stop),
            "summary": self.summary,
        }
