"""Export an evaluation as step-level, history-conditioned SFT records (EA-CoT style).

Each planner decision becomes one record whose prompt holds the query and every earlier round
(`<think>` reasoning, `<tool>` the sub-aspect probed, `<information>` the observation) and whose
target is the next decision: `<think>…</think><tool>sub-aspect</tool>` while probing, or
`<think>justification</think><summary>…</summary>` at the stop. Records are ShareGPT
(`messages` with system/user/assistant and string contents, `images` empty), which the SFT
command reads with `data.format: sharegpt`:

    python -m canvasagent.train sft --config sft_tiny_cpu --set data.format=sharegpt --set data.path=RUN/ea_cot.json

That reader puts the agent's own system turn first, so the protocol is repeated at the top of
the user turn: a record stays self-describing whichever system text a trainer uses.
"""

from __future__ import annotations

from typing import Any

from canvasagent.evaluation.agent.types import AgentResult, Round

EA_SYSTEM = (
    "You are an evaluation agent for visual generative models and tools. Given the user's question and "
    "the history of evaluation rounds, either choose the next sub-aspect to probe as "
    "<think>reasoning</think><tool>sub-aspect</tool>, or, when the evidence suffices, answer as "
    "<think>why the evidence suffices</think><summary>evidence-grounded answer</summary>."
)


def _history(rounds: list[Round]) -> str:
    blocks = [
        f"<think>{r.plan.thought}</think><tool>{r.plan.sub_aspect}</tool>\n<information>{r.observation}</information>"
        for r in rounds
    ]
    return "\n".join(blocks)


def _record(question: str, target: str, history: list[Round], answer: str, meta: dict[str, Any]) -> dict[str, Any]:
    user = f"Question: {question}\nTarget: {target}\nHistory ({len(history)} rounds):\n{_history(history) or '(none)'}"
    return {
        "messages": [
            {"role": "system", "content": EA_SYSTEM},
            {"role": "user", "content": f"{EA_SYSTEM}\n\n{user}"},
            {"role": "assistant", "content": answer},
        ],
        "images": [],
        "ea_cot": meta,
    }


def ea_cot_records(result: AgentResult) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(result.rounds):
        answer = f"<think>{r.plan.thought}</think><tool>{r.plan.sub_aspect}</tool>"
        out.append(_record(result.question, result.target, result.rounds[:i], answer, {"kind": "decision", "step": i, "source": r.plan.source}))
    stop = result.stop
    answer = f"<think>{stop.thought} {stop.justification}".rstrip() + f"</think><summary>{result.summary}</summary>"
    out.append(_record(result.question, result.target, result.rounds, answer, {"kind": "summary", "step": len(result.rounds), "source": stop.source}))
    return out
