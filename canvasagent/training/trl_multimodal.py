"""`CanvasGRPOTrainer`: TRL's GRPOTrainer, made safe for Qwen-VL policies that sample vision tokens.

The bug (issue #5; TRL 1.16.0, transformers 5.24, Qwen3-VL)
------------------------------------------------------------
GRPO runs crashed now and then inside Qwen3-VL's ``get_rope_index`` with ``TypeError: 'NoneType'
object is not an iterator``: either in ``_tool_call_loop`` -> ``generate`` or in the loss forward
(``_get_per_token_logps_and_entropies``). The cause is not a text-only tool turn (that path is
grid-aware in 1.16.0: the TRL #6274 slicing bug is fixed there) but a token the *policy sampled*
(the same failure verl reports for Qwen3-VL GRPO, verl #5817 / #7038):

* Vision placeholders (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``...) are ordinary
  vocabulary entries, so a policy sampling at temperature 1 can emit them; a small or young policy
  does (the tiny one samples almost uniformly over ~1.8K tokens). TRL's transformers backend
  suppresses only ``config.image_token_id``; vLLM suppresses nothing.
* As soon as any tool in the batch returned an image, TRL rebuilds ``mm_token_type_ids`` from token
  ids over the *whole* sequence (``_generate_single_turn`` with ``has_tool_images`` and
  ``_generate_and_score_completions``, "For VLM tool images: build token type IDs"): every
  ``<|video_pad|>`` becomes a video token, sampled ones included. There is no ``video_grid_thw``,
  so ``get_rope_index`` calls ``next(None)``: in the next tool-loop generation if the rollout called
  another tool, else in the loss forward. A sampled ``<|image_pad|>`` (possible on vLLM or if
  ``generation_kwargs`` replaces TRL's ``suppress_tokens``) instead trips the "truncation safety",
  which silently drops every image of the batch, or the placeholder/feature count check.
* ``CanvasEnv.image_in_every_observation=True`` puts every tool call on that path, which is why the
  crash "moved" to the loss forward and came sooner; without tool images the processor's own
  ``mm_token_type_ids`` (prompt only) were used and a sampled placeholder went unnoticed.

The fix: vision placeholders are input-only tokens, so the policy must never produce one.
``_generate_single_turn`` is the one place every sampled turn comes from (first turn and each
post-tool turn), for all backends. The override (1) adds every vision placeholder to the
``suppress_tokens`` of the transformers backend, merged with TRL's and the user's own, so they are
not sampled; (2) cuts any turn that still holds one (a backend that ignores ``suppress_tokens``,
e.g. vLLM) just before it, as if the length limit had hit there: a prefix of a sample is a sample,
so the kept tokens' log-probs stay valid, and the cut turn makes no tool call. Then image tokens,
``pixel_values`` and ``image_grid_thw`` always agree and TRL's truncation safety never fires.

Checked against TRL 1.16.0 only, the newest release on PyPI when this was written, so upgrading is
no way out. On another version the override's signature is verified: a changed one refuses to
build, an unchanged one runs with a warning to re-check whether upstream fixed the bug.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from trl import GRPOTrainer

log = logging.getLogger(__name__)

CHECKED_TRL_VERSIONS: tuple[str, ...] = ("1.16.0",)

# The TRL methods overridden here, with the parameters the override was written against.
_OVERRIDDEN: dict[str, tuple[str, ...]] = {
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
}
# TRL attributes the override reads (set in GRPOTrainer.__init__).
_USED_ATTRS = ("_tokenizer", "_is_vlm", "use_vllm")

VISION_TOKENS: tuple[str, ...] = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")
_CONFIG_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def check_trl_compat(base: type = GRPOTrainer) -> None:
    """Refuse a TRL whose overridden methods changed shape; warn on a merely unchecked version."""
    import trl

    for name, params in _OVERRIDDEN.items():
        method = getattr(base, name, None)
        got = tuple(inspect.signature(method).parameters) if method is not None else None
        if got != params:
            raise RuntimeError(
                f"trl {trl.__version__}: GRPOTrainer.{name} is {got}, CanvasGRPOTrainer overrides {params} "
                f"(checked against trl {', '.join(CHECKED_TRL_VERSIONS)}); re-check canvasagent/training/trl_multimodal.py"
            )
    if trl.__version__ not in CHECKED_TRL_VERSIONS:
        log.warning(
            "trl %s: CanvasGRPOTrainer's vision-token fix was checked against trl %s only; the overridden "
            "signatures match, but re-check whether the upstream bug is still there",
            trl.__version__, ", ".join(CHECKED_TRL_VERSIONS),
        )


def vision_token_ids(tokenizer: Any, model_config: Any = None) -> frozenset[int]:
    """Ids of the vision placeholder tokens, from the tokenizer and the model config."""
    ids = set()
    for token in VISION_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == token:  # not the unk fallback
            ids.add(tid)
    for attr in _CONFIG_IDS:
        tid = getattr(model_config, attr, None)
        if isinstance(tid, int):
            ids.add(tid)
    return frozenset(ids)


def cut_at_vision_tokens(
    completion_ids: list[list[int]], logprobs: list[list[float]] | None, vision_ids: frozenset[int], eos_id: int
) -> tuple[list[list[int]], list[list[float]] | None, int]:
    """Cut each sampled turn just before its first vision token; return how many turns were cut.

    A turn cut to nothing becomes a lone EOS (TRL cannot hold an empty first turn), with an unknown
    sampling log-prob (None, which TRL's importance-sampling correction treats as "no correction").
    """
    n_cut = 0
    out_ids, out_lps = [], None if logprobs is None else []
    for i, ids in enumerate(completion_ids):
        pos = next((j for j, t in enumerate(ids) if t in vision_ids), None)
        lps = None if logprobs is None else logprobs[i]
        if pos is not None:
            n_cut += 1
            ids = ids[:pos] if pos else [eos_id]
            if lps is not None:
                lps = lps[:pos] if pos else [None]
        out_ids.append(ids)
        if out_lps is not None:
            out_lps.append(lps)
    return out_ids, out_lps, n_cut


class CanvasGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose sampled turns never hold a vision placeholder token (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_compat()
        super().__init__(*args, **kwargs)
        missing = [a for a in _USED_ATTRS if not hasattr(self, a)]
        if missing:
            raise RuntimeError(f"GRPOTrainer no longer sets {missing}; re-check canvasagent/training/trl_multimodal.py")
        self._vision_token_ids = (
            vision_token_ids(self._tokenizer, getattr(self.model, "config", None)) if self._is_vlm else frozenset()
        )
        gen_cfg = getattr(self, "generation_config", None)  # only the transformers backends have one
        if self._vision_token_ids and gen_cfg is not None:
            suppress = sorted(set(gen_cfg.suppress_tokens or ()) | self._vision_token_ids)
            gen_cfg.suppress_tokens = suppress
            # TRL also lays generation_kwargs over the model's own generation config while generating.
            self.generation_kwargs["suppress_tokens"] = suppress
            log.info("GRPO sampling suppresses the vision placeholder tokens %s", suppress)
        elif self._vision_token_ids:
            log.info("GRPO on vLLM: turns that sample a vision placeholder %s are cut before it", sorted(self._vision_token_ids))

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )
        if not self._vision_token_ids:
            return completion_ids, logprobs
        completion_ids, logprobs, n_cut = cut_at_vision_tokens(
            completion_ids, logprobs, self._vision_token_ids, self._tokenizer.eos_token_id
        )
        if n_cut:
            log.warning(
                "%d of %d sampled turns held a vision placeholder token (the backend ignored suppress_tokens); "
                "cut before it", n_cut, len(completion_ids),
            )
        return completion_ids, logprobs
