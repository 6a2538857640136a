"""Tool-chain templates, declared as data (configs/canvascraft/chains.yaml).

A chain is an ordered list of registry tool names plus a mix weight. Everything the builders
need beyond that (how many input images, which source-image tags are indispensable) is derived
from the tools unless the YAML says otherwise, so a user adds a chain with one line.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from toolserver.config import find_config, load_yaml
from toolserver.registry import REGISTRY, OutputKind, unmet_needs

# Short names used in the paper's tables.
ALIASES = {"Gen": "ImageGeneration", "Edit": "ImageEdit", "Overlay": "Overlayer"}
SHORT = {v: k for k, v in ALIASES.items()}

# Tools that cannot do their job without something specific in the input image.
_TOOL_NEEDS = {"OCR": "text", "Grounding": "objects"}


def canonical_tool(name: str) -> str:
    tool = ALIASES.get(name.strip(), name.strip())
    if tool not in REGISTRY or REGISTRY[tool].family != "canvasagent":
        raise ValueError(f"unknown CanvasAgent tool {name!r} in a chain (known: {', '.join(REGISTRY)})")
    return tool


def chain_name(tools: Sequence[str]) -> str:
    return "+".join(SHORT.get(t, t) for t in tools)


@dataclass(frozen=True)
class Chain:
    tools: tuple[str, ...]
    weight: float = 1.0
    group: str = "single"
    inputs: int = 1
    needs: tuple[str, ...] = ()
    name: str = ""

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | str) -> "Chain":
        if isinstance(spec, str):
            spec = {"chain": spec}
        spec = dict(spec)
        raw = spec.pop("chain", None) or spec.pop("tools", None)
        if raw is None:
            raise ValueError(f"chain entry without 'chain' or 'tools': {spec}")
        parts = raw.split("+") if isinstance(raw, str) else list(raw)
        tools = tuple(canonical_tool(p) for p in parts)
        if not tools:
            raise ValueError("empty chain")
        unknown = set(spec) - {"weight", "group", "inputs", "needs", "name"}
        if unknown:
            raise ValueError(f"chain {raw!r}: unknown keys {sorted(unknown)}")
        inputs = spec.get("inputs")
        inputs = default_inputs(tools) if inputs is None else inputs
        needs = spec.get("needs")
        needs = default_needs(tools, inputs) if needs is None else needs
        weight = float(spec.get("weight", 1.0))
        if weight < 0:
            raise ValueError(f"chain {raw!r}: negative weight")
        return cls(
            tools=tools,
            weight=weight,
            group=str(spec.get("group", "user")),
            inputs=int(inputs),
            needs=tuple(needs),
            # As written in the YAML, so names match the paper's tables ("ImageEdit", "Edit+OCR+SR").
            name=spec.get("name") or (raw if isinstance(raw, str) else chain_name(tools)),
        )

    def unmet_needs(self) -> list[str]:
        """Registry needs (`ToolSpec.requires`) of the chain's tools that neither its inputs nor an
        earlier tool meets, e.g. ``"Extract: mask (mask)"``; empty for a chain that can run."""
        supplied = ({OutputKind.IMAGE} if self.inputs else set()) | ({OutputKind.RGBA} if "rgba" in self.needs else set())
        return [f"{self.tools[i]}: {n.kind.value} ({n.arg})" for i, n in unmet_needs(self.tools, supplied)]

    @property
    def distinct_tools(self) -> int:
        return len(set(self.tools))


def default_inputs(tools: Sequence[str]) -> int:
    if not REGISTRY[tools[0]].needs():
        return 0  # the chain makes its own image
    # A cut-out the chain makes is composited onto a second photo, as in the paper's compositing chains.
    made = next((i for i, t in enumerate(tools) if OutputKind.RGBA in REGISTRY[t].produces), None)
    if made is not None and any(n.kind is OutputKind.RGBA for t in tools[made:] for n in REGISTRY[t].requires):
        return 2
    return 1


def default_needs(tools: Sequence[str], inputs: int) -> tuple[str, ...]:
    if inputs == 0:
        return ()  # the generated image is whatever the prompt asked for
    return tuple(sorted({_TOOL_NEEDS[t] for t in tools if t in _TOOL_NEEDS}))


@dataclass
class ChainSet:
    chains: list[Chain] = field(default_factory=list)

    @classmethod
    def load(cls, sources: Iterable[str | Path] = ("chains",)) -> "ChainSet":
        """Load one or more chain files (config names under configs/canvascraft/ or paths)."""
        out: list[Chain] = []
        for src in sources:
            data = load_yaml(find_config(src, "canvascraft"))
            out.extend(Chain.from_spec(s) for s in data.get("chains") or [])
        broken = {c.name: c.unmet_needs() for c in out if c.unmet_needs()}
        if broken:
            raise ValueError(f"chains whose tools need what nothing before them produces: {broken}")
        names = [c.name for c in out]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate chain names: {sorted(dupes)}")
        return cls(out)

    def by_name(self, name: str) -> Chain:
        for c in self.chains:
            if c.name == name:
                return c
        raise KeyError(name)

    def subset(self, groups: Sequence[str] | None = None, names: Sequence[str] | None = None) -> "ChainSet":
        return ChainSet([c for c in self.chains if (not groups or c.group in groups) and (not names or c.name in names)])

    def with_weights(self, overrides: dict[str, float]) -> "ChainSet":
        """Override mix weights by chain name or by group (a chain name wins over its group).
        Refuses a key that names neither: a misspelt key would otherwise leave its weight as it was."""
        unknown = set(overrides) - {c.name for c in self.chains} - {c.group for c in self.chains}
        if unknown:
            raise ValueError(f"mix keys that name no chain or group: {sorted(unknown)}")
        out = []
        for c in self.chains:
            w = overrides.get(c.name, overrides.get(c.group, c.weight))
            out.append(Chain(c.tools, float(w), c.group, c.inputs, c.needs, c.name))
        return ChainSet(out)

    def sample(self, rng: random.Random) -> Chain:
        live = [c for c in self.chains if c.weight > 0]
        if not live:
            raise ValueError("no chain has a positive weight")
        return rng.choices(live, weights=[c.weight for c in live], k=1)[0]

    def __iter__(self):
        return iter(self.chains)

    def __len__(self) -> int:
        return len(self.chains)
