"""Per-process build context: toolbox, image source, writer, chains and phrasings.

Built once per worker process (or Ray worker) and reused by every shard it runs, because
loading a model backend or a dataset per shard would dominate small shards.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from canvasagent.config import make_toolbox
from canvascraft.build import BuildConfig
from canvascraft.chains import ChainSet
from canvascraft.sources import ImageSource, make_source
from canvascraft.writers import Phrasings, Writer, make_writer


@dataclass
class Context:
    toolbox: Any
    source: ImageSource
    writer: Writer
    phrasings: Phrasings
    chains: ChainSet


_CACHE: dict[str, Context] = {}


def context_for(cfg: BuildConfig) -> Context:
    key = json.dumps(asdict(cfg), sort_keys=True, default=str)
    ctx = _CACHE.get(key)
    if ctx is None:
        _CACHE.clear()  # one config per process at a time; drop the old toolbox's models
        ctx = Context(
            toolbox=make_toolbox(cfg.tools_config),
            source=make_source(cfg.images, cfg.image_size),
            writer=make_writer(cfg.writer, cfg.llm),
            phrasings=Phrasings.load(),
            chains=ChainSet.load(cfg.chains).with_weights(cfg.mix),
        )
        _CACHE[key] = ctx
    return ctx
