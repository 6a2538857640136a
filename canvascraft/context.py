"""Per-process build context: toolbox, image source, writer, chains and phrasings.

Built once per worker process (or Ray worker) and reused by every shard it runs, because
loading a model backend or a dataset per shard would dominate small shards.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from canvascraft.chains import ChainSet
from canvascraft.sources import ImageSource, make_source
from canvascraft.writers import Phrasings, Writer, make_writer
from toolserver.client import make_toolbox
from toolserver.results import close_if_closable


@dataclass
class Context:
    toolbox: Any
    source: ImageSource
    writer: Writer
    phrasings: Phrasings
    chains: ChainSet


_CACHE: dict[str, Context] = {}


def context_for(cfg: Any) -> Context:
    """The context of `cfg` (a `canvascraft.build.BuildConfig`), built on first use. One config
    per process at a time: a context for another config releases the previous one's models first."""
    key = json.dumps(asdict(cfg), sort_keys=True, default=str)
    ctx = _CACHE.get(key)
    if ctx is None:
        release_contexts()
        ctx = Context(
            toolbox=make_toolbox(cfg.tools_config),
            source=make_source(cfg.images, cfg.image_size),
            writer=make_writer(cfg.writer, cfg.llm),
            phrasings=Phrasings.load(),
            chains=ChainSet.load(cfg.chains).with_weights(cfg.mix),
        )
        _CACHE[key] = ctx
    return ctx


def release_contexts() -> None:
    """Forget every cached context and close its toolbox, releasing the models it loaded (an SR
    network is about 1.2 GB resident) now rather than whenever garbage collection reaches them."""
    old = list(_CACHE.values())
    _CACHE.clear()
    for ctx in old:
        close_if_closable(ctx.toolbox)
