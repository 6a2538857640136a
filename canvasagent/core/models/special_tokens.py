"""Protocol tokens of the CanvasAgent action format: the single source of truth.

An assistant turn looks like ``<reason>...</reason><tool_call>{json}</tool_call>`` (or ends the
episode with ``<Terminate>``). Everything that emits, parses, masks or tokenizes these markers
imports them from here, so the tokenizer builder, the parsers and the trainers cannot drift apart.

The tokens are registered as *added but not special* tokens: each encodes to a single id, yet
``decode(..., skip_special_tokens=True)`` keeps them, which the episode parser relies on when it
reads generated text back (TRL decodes completions with ``skip_special_tokens=True``).
"""

from __future__ import annotations

from typing import Final

REASON_START: Final = "<reason>"
REASON_END: Final = "</reason>"
TOOL_CALL_START: Final = "<tool_call>"
TOOL_CALL_END: Final = "</tool_call>"
TERMINATE: Final = "<Terminate>"

#: Our protocol markers, in a stable order (tests and builders rely on the order).
PROTOCOL_TOKENS: Final[tuple[str, ...]] = (
    REASON_START,
    REASON_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TERMINATE,
)

#: Qwen control tokens, *special* (skipped by skip_special_tokens=True) as in the released Qwen3-VL
#: tokenizer. ``<|endoftext|>`` is the pad token and ``<|im_end|>`` the end-of-turn/eos token.
QWEN_SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

#: Markers Qwen ships as added, non-special tokens (the chat template emits the tool ones).
#: ``<tool_call>``/``</tool_call>`` are shared with :data:`PROTOCOL_TOKENS`.
QWEN_ADDED_TOKENS: Final[tuple[str, ...]] = (
    TOOL_CALL_START,
    TOOL_CALL_END,
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

PAD_TOKEN: Final = "<|endoftext|>"
EOS_TOKEN: Final = "<|im_end|>"


def non_special_added_tokens() -> tuple[str, ...]:
    """Qwen's added tokens followed by our protocol tokens, without duplicates, order kept."""
    return tuple(dict.fromkeys(QWEN_ADDED_TOKENS + PROTOCOL_TOKENS))


def missing_protocol_tokens(tokenizer) -> list[str]:
    """Protocol tokens that the tokenizer does not know as a single added token.
    Real checkpoints (e.g. Qwen3-VL-8B) already have ``<tool_call>`` but not ``<reason>`` or
    ``<Terminate>``; callers add the missing ones before training."""
    vocab = tokenizer.get_vocab()
    return [tok for tok in PROTOCOL_TOKENS if tok not in vocab]


def add_protocol_tokens(tokenizer) -> list[str]:
    """Add missing protocol tokens as non-special added tokens; return the ones added.
    Idempotent: a tokenizer saved after this call reloads with the same ids."""
    from tokenizers import AddedToken

    missing = missing_protocol_tokens(tokenizer)
    if missing:
        # normalized=False: match the literal marker; special=False: survive skip_special_tokens.
        tokenizer.add_tokens(
            [AddedToken(tok, special=False, normalized=False) for tok in missing],
            special_tokens=False,
        )
    return missing
