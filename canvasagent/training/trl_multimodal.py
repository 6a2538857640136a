"""`CanvasGRPOTrainer`: TRL's GRPOTrainer, made safe for Qwen-VL policies that sample vision tokens.

Vision placeholders (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``...) are input-only
tokens: TRL rebuilds the multimodal token types from token ids over the whole sequence once a tool
returns an image, so a sampled placeholder desynchronises image tokens, ``pixel_values`` and
``image_grid_thw`` (Qwen3-VL's ``get_rope_index`` then fails, or TRL's truncation safety drops
every image of the batch). Contract: no completion this trainer scores holds a vision placeholder.
``_generate_single_turn``, the one place every sampled turn comes from, (1) adds every vision
placeholder to the transformers backend's ``suppress_tokens`` (merged with TRL's and the user's),
and (2) cuts a turn that still holds one (a backend that ignores ``suppress_tokens``, e.g. vLLM)
just before it, as if the length limit had hit there: a prefix of a sample is a sample, so the kept
tokens' log-probs stay valid, and the cut turn makes no tool call.

Concurrent tool calls: TRL's ``_tool_call_loop`` runs the tool calls of a turn rollout after
rollout, so a generation step waits ``rollouts x latency`` per turn and a batching tool server never
sees more than one call per process. The override keeps TRL's loop (masks, rollback of overlong
results, multimodal fields) and changes only *when* the environment methods run: TRL's first call in
a turn starts every pending call of that turn (the tool calls of each rollout's newest assistant
message not yet run) in a bounded thread pool, and TRL then consumes the results in its own order.
One rollout's calls run in order on its own environment; different rollouts run at once, each under
its tool's concurrency cap (``ToolConcurrency``, from the tools config). Standalone ``tools=``
functions (shared, maybe not thread-safe) run as TRL runs them.

Image-context budget: with ``image_budget`` K (``canvasagent.core.image_budget``), a rollout's
conversation is kept, after every tool turn, as ``apply_image_budget`` renders it: the tool images
older than the last K become their asset-ID text. TRL builds each turn's input by appending the new
tool turn's tokens (``_get_tool_suffix_ids``) to the rollout's ids, so the override of that method
(1) applies the budget to the rollout's messages, (2) re-renders each earlier tool turn that lost an
image with the same method and splices it into the rollout's ids (and sampling log-probs), and (3)
leaves the dropped images out of the images the next generation and the loss forward get, so image
placeholders and images always agree. Tool turns are tool tokens (mask 0), so no sampled token
changes; the tool mask is re-spliced when the loop returns. A tool turn TRL is about to roll back as
overlong evicts nothing. The loss forward scores the final sequence (see the budget module on what
that means for early turns).

Greedy members: with ``greedy_members`` k > 0 the first k rollouts of every group are decoded
greedily, every turn (a logits processor keeps only the argmax on their rows; the other rows sample
as before), so each group holds the policy's argmax next to its samples and GRPO's advantage moves
the argmax itself: up where it beats the samples, down where a sample beats it. Which rollout a
tool-loop generation row serves is tracked as for the image budget. The transformers backend only;
the greedy members' reward and its margin over their group's samples are logged (``greedy/*``).

Per-turn credit: with ``credit="turn"`` the scored batch's (B,) advantages are replaced by (B, T)
ones (``canvasagent.training.turn_credit``): each model turn is judged against the group's rollouts
that reached that turn. The rewards come from TRL's own ``_calculate_rewards`` of the same batch.

Checked against TRL 1.16.0 only (`CHECKED_TRL_VERSIONS`). On another version a changed signature
of an overridden method refuses to build; unchanged ones run with a warning to re-check the overrides.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from transformers import LogitsProcessor, LogitsProcessorList, Trainer
from trl import GRPOTrainer

from canvasagent.core.image_budget import apply_image_budget, check_budget
from canvasagent.training.config import CREDITS
from canvasagent.training.turn_credit import model_turns, token_advantages, turn_table

log = logging.getLogger(__name__)

CHECKED_TRL_VERSIONS: tuple[str, ...] = ("1.16.0",)

# The TRL methods overridden here, with the parameters the override was written against.
_OVERRIDDEN: dict[str, tuple[str, ...]] = {
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
    "_tool_call_loop": (
        "self", "prompts", "prompt_ids", "completion_ids", "completions", "logprobs", "images", "multimodal_fields",
    ),
    "_get_tool_suffix_ids": ("self", "tool_messages"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("self", "inputs"),
}
# TRL attributes the overrides read (set in GRPOTrainer.__init__; the tool loop's per-batch
# `_sync_tool_dicts` and `environments` are checked where they are used).
_USED_ATTRS = (
    "_tokenizer", "_is_vlm", "use_vllm", "environment_factories",
    "reward_weights", "scale_rewards", "num_generations", "multi_objective_aggregation",
    "use_transformers_continuous_batching", "_metrics",
)

VISION_TOKENS: tuple[str, ...] = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")
_CONFIG_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def check_trl_compat(base: type = GRPOTrainer) -> None:
    """Refuse a TRL whose overridden methods changed shape; warn on a merely unchecked version."""
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

    Takes token ids as any sequence of ints (vLLM's may be a tuple or an array) and returns lists,
    which TRL concatenates with the prompt ids. A turn cut to nothing becomes a lone EOS (TRL
    cannot hold an empty first turn) with sampling log-prob None, which TRL's importance-sampling
    correction treats as "no correction".
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
        out_ids.append(list(ids))
        if out_lps is not None:
            out_lps.append(None if lps is None else list(lps))
    return out_ids, out_lps, n_cut


@dataclass(frozen=True)
class ToolConcurrency:
    """How many environment tool calls one training process runs at once. `max_workers`: the pool
    size (None: one thread per rollout of the batch); `per_tool`: caps for single tools under it
    (a tool absent from it is capped only by the pool). `enabled=False` keeps TRL's serial loop."""

    max_workers: int | None = None
    per_tool: Mapping[str, int] = field(default_factory=dict)
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_workers is not None and self.max_workers < 1:
            raise ValueError(f"max_workers must be >= 1 or None, got {self.max_workers}")
        bad = {k: v for k, v in self.per_tool.items() if not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"per-tool concurrency caps must be integers >= 1, got {bad}")

    @classmethod
    def from_tools_config(cls, cfg: Any, enabled: bool = True) -> ToolConcurrency:
        """From a `toolserver.config.ToolsConfig` (`max_concurrent_calls`, `concurrency`)."""
        return cls(getattr(cfg, "max_concurrent_calls", None), dict(getattr(cfg, "concurrency", None) or {}), enabled)


@dataclass
class _Ran:
    name: str
    arguments: dict[str, Any]
    value: Any = None
    error: BaseException | None = None


class ConcurrentToolRunner:
    """Runs groups of tool calls at once: the groups in parallel, each group's calls in order.

    Thread-safe per group only: a group must own what its calls touch (one rollout's env).
    `turn_wait_s` records the wall time of each `run` (one per tool-loop turn).
    """

    def __init__(self, limits: ToolConcurrency | None = None):
        self.limits = limits or ToolConcurrency()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._caps = {tool: threading.BoundedSemaphore(n) for tool, n in self.limits.per_tool.items()}
        self.turn_wait_s: list[float] = []

    def _executor(self, n_groups: int) -> ThreadPoolExecutor:
        want = self.limits.max_workers or n_groups
        if self._pool is None or (self.limits.max_workers is None and want > self._pool_size):
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool, self._pool_size = ThreadPoolExecutor(max_workers=want, thread_name_prefix="tool-call"), want
        return self._pool

    def _run_group(self, calls: list[tuple[str, Callable[..., Any], dict[str, Any]]]) -> list[_Ran]:
        out = []
        for name, fn, arguments in calls:
            ran = _Ran(name, arguments)
            try:
                with self._caps.get(name) or nullcontext():  # the tool's concurrency cap, if it has one
                    ran.value = fn(**arguments)
            except Exception as e:  # noqa: BLE001  (TRL turns any raising tool into an error message; so do we, later)
                ran.error = e
            out.append(ran)
        return out

    def run(self, groups: list[list[tuple[str, Callable[..., Any], dict[str, Any]]]]) -> list[list[_Ran]]:
        """Run every group; returns each group's outcomes in call order."""
        t0 = time.perf_counter()
        if len(groups) <= 1:
            results = [self._run_group(g) for g in groups]
        else:
            pool = self._executor(len(groups))
            results = [f.result() for f in [pool.submit(self._run_group, g) for g in groups]]
        self.turn_wait_s.append(time.perf_counter() - t0)
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _TurnPrefetch:
    """Stands in for TRL's per-rollout sync tool dicts during one `_tool_call_loop`.

    The first call TRL makes in a turn runs all pending env calls of the turn at once: for each
    rollout, the calls of its newest message if that is an assistant message with tool calls not
    yet run (exactly the calls TRL is about to make, in its order). Each later call returns the
    outcome already computed, matched by rollout, name and arguments; anything unmatched is
    called directly, as TRL would have.
    """

    def __init__(self, completions: list[list[dict[str, Any]]], tool_dicts: list[dict[str, Callable]],
                 environments: list[Any], runner: ConcurrentToolRunner):
        self.completions, self.tool_dicts, self.environments = completions, tool_dicts, environments
        self.runner = runner
        # id(message) -> (message, outcomes); the message is kept so its id is never reused.
        self._ran: dict[int, tuple[dict[str, Any], list[_Ran]]] = {}

    def _env_tools(self, i: int) -> dict[str, Callable]:
        env = self.environments[i] if i < len(self.environments) else None
        return {n: f for n, f in self.tool_dicts[i].items() if env is not None and getattr(f, "__self__", None) is env}

    def dicts(self) -> list[dict[str, Callable]]:
        return [{**tools, **{name: self._proxy(i, name, fn) for name, fn in self._env_tools(i).items()}}
                for i, tools in enumerate(self.tool_dicts)]

    def _proxy(self, i: int, name: str, fn: Callable) -> Callable:
        def call(**arguments: Any) -> Any:
            return self._result(i, name, fn, arguments)

        call.__name__ = name
        return call

    def _pending(self) -> tuple[list[int], list[list[tuple[str, Callable, dict[str, Any]]]]]:
        rows, groups = [], []
        for i, comp in enumerate(self.completions):
            msg = comp[-1] if comp else None
            if not msg or msg.get("role") != "assistant" or not msg.get("tool_calls") or id(msg) in self._ran:
                continue
            env_tools = self._env_tools(i)
            calls = []
            for tc in msg["tool_calls"]:
                fn_call = tc.get("function") if isinstance(tc, dict) and tc.get("type") == "function" else None
                # Only calls TRL will route to an env method with keyword arguments reach us.
                if fn_call and fn_call.get("name") in env_tools and isinstance(fn_call.get("arguments"), dict):
                    calls.append((fn_call["name"], env_tools[fn_call["name"]], dict(fn_call["arguments"])))
            self._ran[id(msg)] = (msg, [])
            if calls:
                rows.append(i)
                groups.append(calls)
        return rows, groups

    def _result(self, i: int, name: str, fn: Callable, arguments: dict[str, Any]) -> Any:
        comp = self.completions[i]
        msg = comp[-1] if comp else None
        if msg is not None and id(msg) not in self._ran:
            rows, groups = self._pending()
            for row, outcomes in zip(rows, self.runner.run(groups)):
                self._ran[id(self.completions[row][-1])][1].extend(outcomes)
        outcomes = self._ran.get(id(msg), (None, []))[1] if msg is not None else []
        for k, ran in enumerate(outcomes):
            if ran.name == name and ran.arguments == arguments:
                del outcomes[k]
                if ran.error is not None:
                    raise ran.error
                return ran.value
        log.debug("tool call %s of rollout %d was not prefetched; calling it directly", name, i)
        return fn(**arguments)


class _RolloutBudget:
    """The image budget over the rollouts of one `_tool_call_loop` call (see the module doc), and
    which rollouts each of its generations serves (`active`); with `budget` None only the latter.

    Holds TRL's per-batch lists (`prompts[i]` is rollout i's whole conversation, sharing its tool
    message dicts with `completions[i]`) and, per rollout, where each tool turn sits in
    `completion_ids[i]` and which of TRL's collected tool images (in collection order) were dropped.
    """

    def __init__(self, budget: int, prompts, prompt_ids, completion_ids, completions, logprobs, images,
                 render: Callable[[list[dict[str, Any]]], list[int]], overlong: Callable[[int, int], bool]):
        self.budget = budget
        self.prompts, self.prompt_ids, self.completion_ids = prompts, prompt_ids, completion_ids
        self.completions, self.logprobs = completions, logprobs
        self.render, self.overlong = render, overlong
        n = len(completion_ids)
        self.n_inputs = [len(images[i] or []) if images is not None else 0 for i in range(n)]
        self.segments: list[list[list[Any]]] = [[] for _ in range(n)]  # [start, length, tool messages]
        self.slots: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (id(message), part) per tool image
        self.dropped: list[set[int]] = [set() for _ in range(n)]
        self.splices: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (start, old len, new len)
        # Rollouts whose new tool turn TRL keeps this iteration, in TRL's order (cleared by the
        # iteration's generation).
        self.active: list[int] = []

    def rollout_of(self, tool_messages: list[dict[str, Any]]) -> int | None:
        last = tool_messages[-1] if tool_messages else None
        return next((i for i, c in enumerate(self.completions) if c and c[-1] is last), None)

    def suffix(self, i: int, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Apply the budget to rollout i after its new tool turn; returns the turn's token ids."""
        if self.budget is None:  # rows only: TRL's own suffix, kept unless TRL drops the turn
            suffix = self.render(tool_messages)
            if not self.overlong(i, len(self.completion_ids[i]) + len(suffix)):
                self.active.append(i)
            return suffix
        conv = self.prompts[i]
        budgeted, _ = apply_image_budget(conv, self.budget)
        changed = {id(conv[k]): (conv[k], conv[k]["content"], budgeted[k]["content"])
                   for k in range(len(conv)) if budgeted[k] is not conv[k]}
        new_slots = [(id(m), p) for m in tool_messages for p, part in enumerate(m.get("content") or [])
                     if isinstance(m.get("content"), list) and isinstance(part, dict) and part.get("type") == "image"]
        for msg, _, content in changed.values():
            msg["content"] = content
        ids, lps = list(self.completion_ids[i]), None if self.logprobs is None else list(self.logprobs[i])
        segments = [list(s) for s in self.segments[i]]
        splices = []
        shift = 0
        for seg in segments:
            seg[0] += shift
            if any(id(m) in changed for m in seg[2]):
                start, old_len = seg[0], seg[1]
                new = self.render(seg[2])
                ids[start:start + old_len] = new
                if lps is not None:
                    lps[start:start + old_len] = [0.0] * len(new)
                splices.append((start, old_len, len(new)))
                seg[1] = len(new)
                shift += len(new) - old_len
        suffix = self.render(tool_messages)
        if self.overlong(i, len(ids) + len(suffix)):
            # TRL drops this tool turn: leave the rollout as it was and hand TRL its own suffix.
            for msg, content, _ in changed.values():
                msg["content"] = content
            return self.render(tool_messages)
        self.completion_ids[i] = ids
        if lps is not None:
            self.logprobs[i][:] = lps
        segments.append([len(ids), len(suffix), list(tool_messages)])
        self.segments[i] = segments
        self.splices[i] += splices
        self.slots[i] += new_slots
        gone = {(id(m), p) for m, old, new in changed.values() for p, (a, b) in enumerate(zip(old, new)) if a is not b}
        self.dropped[i] |= {k for k, slot in enumerate(self.slots[i]) if slot in gone}
        self.active.append(i)
        return suffix

    def kept_images(self, i: int, images: list[Any] | None) -> list[Any] | None:
        """Rollout i's images (inputs first, then TRL's collected tool images) without the dropped ones."""
        if not images:
            return images
        n_in = self.n_inputs[i]
        if len(images) != n_in + len(self.slots[i]):
            raise RuntimeError(
                f"rollout {i}: {len(images)} images for {n_in} inputs and {len(self.slots[i])} tool images; "
                "re-check CanvasGRPOTrainer's image budget against this TRL"
            )
        return list(images[:n_in]) + [im for k, im in enumerate(images[n_in:]) if k not in self.dropped[i]]

    def fix_tool_mask(self, tool_mask: list[list[int]]) -> None:
        """Apply the recorded splices to TRL's tool mask (it was extended, never spliced)."""
        for i, splices in enumerate(self.splices):
            for start, old_len, new_len in splices:
                if any(tool_mask[i][start:start + old_len]):
                    raise RuntimeError(f"rollout {i}: an image budget splice covers model tokens")
                tool_mask[i][start:start + old_len] = [0] * new_len

    def filter_tool_images(self, tool_images: list[list[Any]]) -> list[list[Any]]:
        return [[im for k, im in enumerate(imgs) if k not in self.dropped[i]] for i, imgs in enumerate(tool_images)]


class _ArgmaxRows(LogitsProcessor):
    """Keeps only the highest score on the given batch rows, so sampling them picks their argmax
    (greedy decoding inside a sampled batch); `calls` counts the steps it saw."""

    def __init__(self, rows: list[int]):
        self.rows, self.calls = torch.tensor(rows), 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.calls += 1
        rows = self.rows.to(scores.device)
        kept = scores[rows]
        top = kept.argmax(dim=-1, keepdim=True)
        scores = scores.clone()
        scores[rows] = torch.full_like(kept, -float("inf")).scatter(-1, top, kept.gather(-1, top))
        return scores


class CanvasGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose sampled turns never hold a vision placeholder token and whose environment
    tool calls run concurrently across rollouts (see the module doc).

    `tool_concurrency`: pool size and per-tool caps (default: one thread per rollout, no caps);
    `ToolConcurrency(enabled=False)` keeps TRL's serial tool loop. `image_budget`: keep the last N
    tool images of each rollout, older ones as their asset-ID text (None: every image).
    `greedy_members`: rollouts of each group decoded greedily (0 to num_generations - 1; the
    transformers backend only).
    """

    def __init__(self, *args: Any, tool_concurrency: ToolConcurrency | None = None, image_budget: int | None = None,
                 credit: str = "sequence", greedy_members: int = 0, **kwargs: Any) -> None:
        check_trl_compat()
        self.image_budget = check_budget(image_budget)
        if credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {credit!r}")
        self.credit = credit
        self.greedy_members = greedy_members
        self._scored_rewards: Any = None
        self._budget_state: _RolloutBudget | None = None
        super().__init__(*args, **kwargs)
        limits = tool_concurrency or ToolConcurrency()
        self.tool_runner: ConcurrentToolRunner | None = ConcurrentToolRunner(limits) if limits.enabled else None
        missing = [a for a in _USED_ATTRS if not hasattr(self, a)]
        if missing:
            raise RuntimeError(f"GRPOTrainer no longer sets {missing}; re-check canvasagent/training/trl_multimodal.py")
        if credit == "turn" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("credit: turn needs TRL's multi_objective_aggregation sum_then_normalize")
        if not 0 <= greedy_members < self.num_generations:
            raise ValueError(f"greedy_members must be 0 to num_generations - 1 ({self.num_generations - 1}), got {greedy_members}")
        if greedy_members and (self.use_vllm or self.use_transformers_continuous_batching):
            raise ValueError("greedy_members needs the transformers generation backend (not vLLM or continuous batching)")
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

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored_rewards = rewards_per_func  # every process's rollouts, in group order
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.credit == "turn" and self.model.training and output.get("tool_mask") is not None:
            output["advantages"] = self._turn_advantages(output)
        if self.greedy_members and self.model.training:
            self._log_greedy_members()
        return output

    def _rewards(self) -> torch.Tensor:
        """The scored batch's weighted reward per rollout (every process's, in group order); NaN
        where no reward function could score it, as TRL marks them."""
        per_func = self._scored_rewards
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        return rewards

    def _log_greedy_members(self) -> None:
        groups = self._rewards().cpu().view(-1, self.num_generations)
        greedy, sampled = groups[:, :self.greedy_members], groups[:, self.greedy_members:]
        margin = greedy.nanmean(dim=1) - sampled.nanmean(dim=1)
        self._metrics["train"]["greedy/reward"].append(greedy.nanmean().item())
        self._metrics["train"]["greedy/minus_sampled"].append(margin.nanmean().item())

    def _turn_advantages(self, output: dict[str, Any]) -> Any:
        rewards = self._rewards()
        index, n_turns = model_turns(output["completion_mask"], output["tool_mask"])
        all_turns = self.accelerator.gather(n_turns)
        table = turn_table(rewards.cpu(), all_turns.cpu(), self.num_generations, self.scale_rewards)
        local = n_turns.shape[0]
        start = self.accelerator.process_index * local
        rows = table[start:start + local].to(output["advantages"].dtype)
        return token_advantages(index.cpu(), rows).to(output["advantages"].device)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        state = self._budget_state
        rollouts, n_local = list(range(len(prompt_ids))), len(prompt_ids)  # the first turn: every rollout
        if state is not None:
            if images is not None and any(state.dropped[i] for i in state.active):
                images, multimodal_fields = self._budgeted_images(state, images)
            rollouts, n_local, state.active = state.active, len(state.completion_ids), []
        with self._greedy_rows(rollouts, n_local):
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

    @contextmanager
    def _greedy_rows(self, rollouts: list[int], n_local: int) -> Iterator[None]:
        """While TRL generates a turn for `rollouts` (this process's rollout index per generation
        row; `n_local` rollouts on this process), the rows of greedy members keep only their argmax."""
        start = self.accelerator.process_index * n_local  # rollouts are gathered in process order
        rows = [row for row, i in enumerate(rollouts) if (start + i) % self.num_generations < self.greedy_members]
        if not rows or not self.model.training:
            yield
            return
        model, argmax = self.model, _ArgmaxRows(rows)
        own = vars(model).get("generate")  # a test's stand-in, or none (the class's)
        plain = model.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), argmax])
            return plain(*args, **kwargs)

        model.generate = generate
        try:
            yield
        finally:
            if own is None:
                del model.generate
            else:
                model.generate = own
        if not argmax.calls:
            raise RuntimeError("TRL generated without the model's generate: greedy members cannot be decoded; "
                               "re-check CanvasGRPOTrainer._greedy_rows against this TRL")

    def _budgeted_images(self, state: _RolloutBudget, images: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """A tool-loop generation's images without the dropped ones, and their processor fields
        (computed as TRL computes them for tool images)."""
        if len(images) != len(state.active):
            raise RuntimeError(f"{len(images)} image lists for {len(state.active)} rollouts in the tool loop")
        images = [state.kept_images(i, imgs) for i, imgs in zip(state.active, images)]
        flat = [im for imgs in images if imgs for im in imgs]
        if not flat:
            return images, {}
        fields = self.processing_class.image_processor(images=flat, return_tensors="pt")
        return images, dict(Trainer._prepare_inputs(self, fields))

    def _max_model_len(self) -> int:
        # As TRL's tool loop bounds a sequence.
        if self.use_vllm and self.vllm_mode == "colocate":
            return self.vllm_generation.llm.llm_engine.model_config.max_model_len
        config = self.model.config.text_config if self._is_vlm else self.model.config
        return config.max_position_embeddings

    def _get_tool_suffix_ids(self, tool_messages):
        state = self._budget_state
        i = state.rollout_of(tool_messages) if state is not None else None
        if i is None:
            return super()._get_tool_suffix_ids(tool_messages)
        return state.suffix(i, tool_messages)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        if self.image_budget is None and not self.greedy_members:
            return self._concurrent_tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
        max_len = self._max_model_len()

        def overlong(i: int, completion_len: int) -> bool:
            return completion_len > self.max_completion_length or len(prompt_ids[i]) + completion_len >= max_len

        state = _RolloutBudget(
            self.image_budget, prompts, prompt_ids, completion_ids, completions, logprobs, images,
            render=lambda msgs: GRPOTrainer._get_tool_suffix_ids(self, msgs), overlong=overlong,
        )
        self._budget_state = state
        try:
            out = self._concurrent_tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
        finally:
            self._budget_state = None
        tool_mask, completions, completion_ids, logprobs, n_calls, n_failed, tool_images = out
        state.fix_tool_mask(tool_mask)
        return tool_mask, completions, completion_ids, logprobs, n_calls, n_failed, state.filter_tool_images(tool_images)

    def _concurrent_tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images,
                                   multimodal_fields):
        runner = self.tool_runner
        tool_dicts = getattr(self, "_sync_tool_dicts", None)
        environments = getattr(self, "environments", None)
        if runner is None or self.environment_factories is None or not tool_dicts or not environments:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)
        prefetch = _TurnPrefetch(completions, tool_dicts, environments, runner)
        self._sync_tool_dicts = prefetch.dicts()
        try:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)
        finally:
            self._sync_tool_dicts = tool_dicts
