"""Typed assets and the per-episode asset store.

IDs follow the public CanvasAgent convention: inputs are `img_1, img_2, ...` in the order given,
and each image-producing tool output is `{Tool}_{k}` with k counting per tool from 0. A failed
call registers nothing and does not advance its tool's counter, so IDs stay aligned with
trajectories recorded by the public code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from PIL import Image

from toolserver.limits import image_kind
from toolserver.registry import OutputKind


class UnknownAssetError(KeyError):
    """Raised for an asset ID that is not in the store (never silently replaced by img_1)."""

    def __init__(self, asset_id: str, known: list[str]):
        super().__init__(asset_id)
        self.asset_id = asset_id
        self.known = known

    def __str__(self) -> str:
        return f"unknown image ID {self.asset_id!r}; the imglist is {{{', '.join(self.known)}}}"


@dataclass(frozen=True)
class Provenance:
    """Which call made an asset: turn index, tool name, arguments and the asset IDs it read."""

    turn: int | None = None
    tool: str | None = None
    arguments: dict | None = None
    inputs: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"turn": self.turn, "tool": self.tool, "arguments": self.arguments, "inputs": list(self.inputs)}

    @classmethod
    def from_dict(cls, d: dict) -> "Provenance":
        return cls(d.get("turn"), d.get("tool"), d.get("arguments"), tuple(d.get("inputs") or ()))


@dataclass
class Asset:
    id: str
    kind: OutputKind
    image: Image.Image
    provenance: Provenance = field(default_factory=Provenance)
    plumbing_only: bool = False  # made by a random-weight backend: not a real result

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


class AssetStore:
    """Assets of one episode in registration order."""

    def __init__(self) -> None:
        self._assets: dict[str, Asset] = {}
        self._counters: dict[str, int] = {}
        self._n_inputs = 0

    def add_input(self, image: Image.Image, asset_id: str | None = None) -> Asset:
        self._n_inputs += 1
        aid = asset_id or f"img_{self._n_inputs}"
        if aid in self._assets:
            raise ValueError(f"duplicate input ID {aid!r}")
        asset = Asset(aid, image_kind(image), image, Provenance())
        self._assets[aid] = asset
        return asset

    def next_id(self, tool: str) -> str:
        return f"{tool}_{self._counters.get(tool, 0)}"

    def register_output(
        self, tool: str, image: Image.Image, kind: OutputKind, provenance: Provenance, plumbing_only: bool = False
    ) -> Asset:
        aid = self.next_id(tool)
        self._counters[tool] = self._counters.get(tool, 0) + 1
        asset = Asset(aid, kind, image, provenance, plumbing_only)
        self._assets[aid] = asset
        return asset

    def get(self, asset_id: str) -> Asset:
        if not isinstance(asset_id, str) or asset_id not in self._assets:
            raise UnknownAssetError(str(asset_id), self.ids())
        return self._assets[asset_id]

    def __contains__(self, asset_id: object) -> bool:
        return isinstance(asset_id, str) and asset_id in self._assets

    def __iter__(self) -> Iterator[Asset]:
        return iter(self._assets.values())

    def __len__(self) -> int:
        return len(self._assets)

    def ids(self) -> list[str]:
        return list(self._assets)

    def input_ids(self) -> list[str]:
        return [a.id for a in self if a.provenance.tool is None]

    def last(self) -> Asset | None:
        """The final image of an episode: the last produced asset, else the last input."""
        return next(reversed(self._assets.values()), None)

    def last_produced(self) -> Asset | None:
        produced = [a for a in self if a.provenance.tool is not None]
        return produced[-1] if produced else None

    def imglist_text(self) -> str:
        return "{" + ", ".join(self._assets) + "}"

    def snapshot(self) -> "AssetStore":
        """A cheap copy for rollback: images are immutable by convention, so they are shared."""
        other = AssetStore()
        other._assets = dict(self._assets)
        other._counters = dict(self._counters)
        other._n_inputs = self._n_inputs
        return other

    def truncate_to(self, asset_id: str) -> None:
        """Roll back: drop every asset registered after `asset_id` and rewind the counters."""
        ids = self.ids()
        if asset_id not in self._assets:
            raise UnknownAssetError(asset_id, ids)
        keep = ids[: ids.index(asset_id) + 1]
        self._assets = {k: self._assets[k] for k in keep}
        self._counters = dict(Counter(a.provenance.tool for a in self._assets.values() if a.provenance.tool is not None))
