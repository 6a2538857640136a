"""The ONE message layout that SFT, GRPO and model evaluation render.

    system   : our system prompt (no tool list) + the chat template's tool block
    user     : "img_1:" <image> ... instruction          (as `canvasagent.core.episode.user_message`)
    assistant: "<reason>…</reason>" + tool_calls=[{name, arguments}]   or   "<reason>…</reason><Terminate>"
    tool     : [<image>] + observation text ending in the imglist echo

Under an image budget (`canvasagent.core.image_budget`, the `image_budget` setting) a tool image older
than the last K becomes its asset-ID text in place; SFT rows, GRPO rollouts and evaluation apply
the same function to the same conversation.

GRPO renders the prompt with `tools=` (TRL passes the environment's methods), so the template
writes the tool block itself. TRL's VLM SFT collator does not pass `tools=`, so SFT rows carry the
exact same system text, pre-rendered by `system_text()`; a test checks the two are byte-identical.
Assistant tool calls are kept structured so the template renders them exactly as the model will
generate them (`<reason>…</reason>\n<tool_call>\n{…}\n</tool_call>`), which our protocol parser
accepts as a well-formed reply.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from canvasagent.core.episode import user_content
from canvasagent.core.image_budget import apply_image_budget
from canvasagent.core.imageio import open_image
from canvasagent.core.protocol import parse_reply, render_system_prompt
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory

Message = dict[str, Any]


def _text(t: str) -> list[dict[str, Any]]:
    # Every content is a list of blocks: Arrow cannot store a column mixing strings and lists.
    return [{"type": "text", "text": t}]


def base_system_prompt(family: str = "canvasagent") -> str:
    """Our system prompt without its tool list (the chat template adds the tool block)."""
    return render_system_prompt(family, include_tools=False)


def system_text(processor: Any, tool_fns: list[Callable], family: str = "canvasagent") -> str:
    """The system turn exactly as the template renders it for GRPO (base prompt + tool block)."""
    rendered = processor.apply_chat_template(
        [{"role": "system", "content": _text(base_system_prompt(family))}, {"role": "user", "content": _text("x")}],
        tools=tool_fns,
        tokenize=False,
    )
    start = "<|im_start|>system\n"
    if not rendered.startswith(start):
        raise ValueError("the chat template does not open with a system turn; only Qwen3-VL-style templates are supported")
    return rendered[len(start) : rendered.index("<|im_end|>")]


def prompt_messages(task: Task, family: str = "canvasagent") -> list[Message]:
    """GRPO prompt: system (no tool block; TRL renders it from the env methods) + user."""
    return [
        {"role": "system", "content": _text(base_system_prompt(family))},
        {"role": "user", "content": user_content(task)},
    ]


def assistant_message(reply: str) -> Message:
    """A protocol reply as a structured assistant turn (one well-formed call -> `tool_calls`)."""
    parsed = parse_reply(reply)
    call = parsed.call
    if call is not None and not parsed.terminate and parsed.reason is not None and not parsed.findings:
        return {
            "role": "assistant",
            "content": _text(f"<reason>{parsed.reason}</reason>"),
            # Arguments as a JSON string: Arrow needs one struct type across rows (decoded in `fill_images`).
            "tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}],
        }
    return {"role": "assistant", "content": _text(reply)}


def sft_example(traj: Trajectory, system: str, image_budget: int | None = None) -> dict[str, Any]:
    """A trajectory as an SFT row: `messages` with image placeholders + `images` in placeholder order.
    `image_budget`: the last N tool images stay images, older ones their asset-ID text (None: all)."""
    messages: list[Message] = [
        {"role": "system", "content": _text(system)},
        {"role": "user", "content": user_content(traj.task)},
    ]
    images = list(traj.task.images)
    for turn in traj.turns:
        messages.append(assistant_message(turn.reply))
        if turn.observation is None:  # a terminate turn gets no observation
            continue
        content: list[dict[str, Any]] = []
        if turn.output_id is not None:
            content.append({"type": "image"})
            images.append(traj.assets.get(turn.output_id).image)
        content += _text(turn.observation)
        messages.append({"role": "tool", "name": turn.call.name if turn.call else "error", "content": content})
    messages, kept = apply_image_budget(messages, image_budget, images)
    return {"messages": messages, "images": kept}


def sharegpt_example(row: dict[str, Any], system: str, image_budget: int | None = None) -> dict[str, Any]:
    """A public ShareGPT row (`<image>` placeholders in string contents, `images` as byte cells) as
    an SFT row under `image_budget` (None: every image). Our system turn replaces the row's."""
    roles = {"human": "user", "gpt": "assistant", "observation": "tool", "function": "tool", "function_call": "assistant"}
    messages: list[Message] = [{"role": "system", "content": _text(system)}]
    for m in row["messages"]:
        role = roles.get(m["role"], m["role"])
        if role == "system":
            continue
        if role == "assistant":
            messages.append(assistant_message(m["content"]))
            continue
        content: list[dict[str, Any]] = []
        for i, part in enumerate(str(m["content"]).split("<image>")):
            if i:
                content.append({"type": "image"})
            if part:
                content.append({"type": "text", "text": part})
        messages.append({"role": role, "content": content})
    messages, images = apply_image_budget(messages, image_budget, [open_image(c["bytes"]) for c in row["images"]])
    return {"messages": messages, "images": images}


def grpo_row(task: Task) -> dict[str, Any]:
    """A GRPO row: the prompt (TRL adds the tool block), the input images, the task for `reset`.
    Reference images (for the offline alignment judge) get their own column: task JSON holds no images."""
    meta = {k: v for k, v in task.meta.items() if k != "reference_images"}
    data = {**task.to_dict(), "meta": meta}
    return {
        "prompt": prompt_messages(task, task.family),
        "images": list(task.images),
        "reference_images": list(task.meta.get("reference_images") or []),
        "task": json.dumps(data, default=str),
    }


def decoded_tool_calls(message: Message) -> list[dict[str, Any]]:
    """A message's tool calls as chat templates take them (`{"type": "function", "function": {name,
    arguments}}`), with arguments stored as a JSON string (as `assistant_message` writes them for
    Arrow) decoded to a dict; copies, the message is not changed. [] for a message without calls."""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = dict(tc["function"])
        if isinstance(fn.get("arguments"), str):
            fn["arguments"] = json.loads(fn["arguments"])
        calls.append({**tc, "type": "function", "function": fn})
    return calls


def fill_images(batch: dict[str, list]) -> dict[str, list]:
    """`Dataset.with_transform`: embed tool-turn images as PIL (TRL fills placeholders only outside
    tool turns), keep user images in `images`, drop Arrow's None-valued keys (a `{"type": "image",
    "text": None}` block would otherwise render as text) and decode tool-call arguments."""
    from trl.trainer.utils import remove_none_values

    out = {k: v for k, v in batch.items()}
    out["messages"], out["images"] = [], []
    for msgs, imgs in zip(batch["messages"], batch["images"]):
        msgs = remove_none_values(msgs)
        it = iter(imgs)
        user_imgs = []
        for m in msgs:
            for part in m.get("content") or []:
                if part.get("type") == "image" and "image" not in part:
                    img = next(it)
                    if m["role"] == "tool":
                        part["image"] = img
                    else:
                        user_imgs.append(img)
            if m.get("tool_calls"):
                m["tool_calls"] = decoded_tool_calls(m)
        out["messages"].append(msgs)
        out["images"].append(user_imgs)
    return out


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")


def reply_text(message: Message) -> str:
    """The raw text a model generated for a TRL assistant message (inverse of the template's rendering)."""
    text = content_text(message.get("content"))
    for i, tc in enumerate(message.get("tool_calls") or []):
        fn = tc.get("function", tc)
        args = fn.get("arguments")
        args_json = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        if i > 0 or text:
            text += "\n"
        text += f'<tool_call>\n{{"name": "{fn.get("name")}", "arguments": {args_json}}}\n</tool_call>'
    return text


def policy_messages(episode_messages: list[Message], system: str) -> list[Message]:
    """Episode messages (raw assistant text) in the training layout, for generating with a model."""
    return [{"role": "system", "content": _text(system)}, *(m for m in episode_messages if m["role"] != "system")]


class LayoutPolicy:
    """Wraps a generation policy so it sees exactly the training layout (system text with the tool block)."""

    def __init__(self, inner: Any, system: str):
        self.inner = inner
        self.system = system
        self.name = getattr(inner, "name", "model")

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        return self.inner.act(policy_messages(messages, self.system), episode)
