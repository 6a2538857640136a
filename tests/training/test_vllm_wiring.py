"""vLLM sampling for the paper GRPO config: both TRL modes reach GRPOConfig, and the vision
placeholder cut works on turns shaped as vLLM returns them (vLLM itself is not installed here:
its `RequestOutput`/`CompletionOutput` structure is built in the test and read by TRL's own
`extract_logprobs`, as TRL's vLLM path reads it)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.training.config import TrainConfig
from canvasagent.training.grpo import grpo_args
from canvasagent.training.trl_multimodal import cut_at_vision_tokens, vision_token_ids


@pytest.mark.parametrize("over, mode, url", [
    ({"grpo.use_vllm": True}, "colocate", None),
    ({"grpo.use_vllm": True, "grpo.vllm_mode": "server", "grpo.vllm_server_base_url": "http://10.0.0.5:8000"}, "server",
     "http://10.0.0.5:8000"),
])
def test_paper_config_reaches_grpo_config_in_both_vllm_modes(over, mode, url):
    args = grpo_args(TrainConfig.load("grpo_qwen3vl_8b", over), [1.0], with_deepspeed=False)
    assert args.use_vllm and args.vllm_mode == mode and args.vllm_server_base_url == url
    # The colocate engine's share of each GPU and its context length come from the config's trl_args.
    assert args.vllm_gpu_memory_utilization == 0.3 and args.vllm_max_model_length == 16384
    assert args.max_tool_calling_iterations == 12


def test_paper_config_samples_with_transformers_by_default():
    assert not grpo_args(TrainConfig.load("grpo_qwen3vl_8b"), [1.0], with_deepspeed=False).use_vllm


def _request_output(seqs: list[tuple[int, ...]], lps: list[list[float]]):
    """A vLLM RequestOutput: `.outputs` of CompletionOutput with `token_ids` and per-token logprob
    dicts {token_id: Logprob(logprob, rank, decoded_token)} (logprobs=0: the sampled token only)."""
    outs = []
    for k, (ids, lp) in enumerate(zip(seqs, lps)):
        logprobs = [{t: SimpleNamespace(logprob=v, rank=1, decoded_token=None)} for t, v in zip(ids, lp)]
        outs.append(SimpleNamespace(index=k, text="", token_ids=ids, cumulative_logprob=sum(lp), logprobs=logprobs,
                                    finish_reason="stop", stop_reason=None))
    return SimpleNamespace(request_id="0", prompt="", prompt_token_ids=[1, 2, 3], outputs=outs, finished=True)


def _as_trl_reads_vllm(outputs):
    # trl/generation/vllm_generation.py (colocate) and grpo_trainer._generate_single_turn.
    from trl.generation.vllm_generation import extract_logprobs

    completion_ids = [o.token_ids for r in outputs for o in r.outputs]
    logprobs, _ = extract_logprobs(outputs)
    return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]


@pytest.fixture(scope="module")
def tiny_tok(tiny_qwen3vl_dir):
    from canvasagent.core.models import load_processor

    return load_processor(str(tiny_qwen3vl_dir)).tokenizer


def test_cut_on_vllm_shaped_outputs(tiny_tok):
    vis = vision_token_ids(tiny_tok)
    video, image = tiny_tok.convert_tokens_to_ids("<|video_pad|>"), tiny_tok.convert_tokens_to_ids("<|image_pad|>")
    assert {video, image} <= vis
    text = tuple(tiny_tok.encode("<reason>ok</reason>", add_special_tokens=False))
    seqs = [text + (video,) + text, (image,) + text, text]  # tuples: vLLM's token_ids are not always lists
    lps = [[-0.5 - i for i in range(len(s))] for s in seqs]
    ids, logprobs = _as_trl_reads_vllm([_request_output(seqs[:2], lps[:2]), _request_output(seqs[2:], lps[2:])])
    out_ids, out_lps, n_cut = cut_at_vision_tokens(ids, logprobs, vis, tiny_tok.eos_token_id)
    assert n_cut == 2
    assert out_ids == [list(text), [tiny_tok.eos_token_id], list(text)]
    assert all(type(x) is list for x in out_ids) and [1, 2, 3] + out_ids[0]  # TRL adds prompt lists to them
    assert out_lps[0] == lps[0][: len(text)] and out_lps[1] == [None] and out_lps[2] == lps[2]
    assert [len(i) for i in out_ids] == [len(lp) for lp in out_lps]


def test_nan_logprob_from_vllm_stays_none_after_the_cut(tiny_tok):
    vis = vision_token_ids(tiny_tok)
    text = tuple(tiny_tok.encode("abc", add_special_tokens=False))
    ids, lps = _as_trl_reads_vllm([_request_output([text], [[math.nan] + [-1.0] * (len(text) - 1)])])
    out_ids, out_lps, n = cut_at_vision_tokens(ids, lps, vis, tiny_tok.eos_token_id)
    assert n == 0 and out_ids == [list(text)] and out_lps[0][0] is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=12), min_size=1, max_size=5), st.frozensets(st.integers(0, 40), max_size=4))
def test_cut_keeps_a_prefix_without_vision_tokens(seqs, vis):
    lps = [[-float(j) for j in range(len(s))] for s in seqs]
    out_ids, out_lps, n = cut_at_vision_tokens([tuple(s) for s in seqs], lps, vis, eos_id=99)
    assert n == sum(any(t in vis for t in s) for s in seqs)
    for s, o, lp in zip(seqs, out_ids, out_lps):
        assert not any(t in vis for t in o if t != 99)
        assert len(o) == len(lp)
        if any(t in vis for t in s) and s[0] in vis:
            assert o == [99] and lp == [None]
        else:
            assert o == s[: len(o)] and (o == s or s[len(o)] in vis)
