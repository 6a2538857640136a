"""Export an evaluation as step-level, history-conditioned SFT records for the planner (EA-CoT style).

One record per planner decision, each conditioned on the question and every earlier step:

* the plan: `<think>reading of the question</think><plan>{property, conditions, axis, asked}</plan>`;
* each round: `<think>why these probes</think><tool>{"probe": [...]}</tool>`, whose measured
  result enters the later records' history as `<information>…</information>`;
* the stop: `<think>why the evidence suffices</think><summary>answer, boundary, summary</summary>`.

Records are ShareGPT (`messages` with system/user/assistant string contents, `images` empty),
which the SFT command reads with `data.format: sharegpt`:

    python -m canvasagent.train sft --config sft_tiny_cpu --set data.format=sharegpt --set data.path=RUN/ea_cot.json

That reader puts the agent's own system turn first, so the protocol is repeated at the top of
the user turn: a record stays self-describing whichever system text a trainer uses.
"""

from __future__ import annotations

import json
from typing import Any

from canvasagent.evaluation.agent.types import AgentResult, Round

EA_SYSTEM = (
    "You are an evaluation agent for image tools and policies. Given the user's question and the history "
    "of evaluation rounds, first write the test plan as <think>reasoning</think><plan>JSON</plan>; then "
    "choose each round's probes as <think>reasoning</think><tool>JSON</tool>; when the measured evidence "
    "settles the question, answer as <think>why it suffices</think><summary>answer (yes/no/partly), "
    "boundary and evidence</summary>."
)


def _plan_block(result: AgentResult) -> str:
    p = result.plan
    plan = json.dumps({"target": p.target, "property": p.property, "conditions": p.conditions, "axis": p.axis,
                       "asked": p.asked, "strata": p.strata}, ensure_ascii=False)
    return f"<think>{p.thought}</think><plan>{plan}</plan>"


def _round_block(r: Round) -> str:
    return f"<think>{r.thought}</think><tool>{json.dumps(r.action, ensure_ascii=False)}</tool>"


def _history(result: AgentResult, rounds: list[Round]) -> str:
    measured = (f"{_round_block(r)}\n<information>{r.observation}</information>" for r in rounds)
    return "\n".join([_plan_block(result), *measured])


def _record(result: AgentResult, history: str, n: int, answer: str, meta: dict[str, Any]) -> dict[str, Any]:
    user = f"Question: {result.question}\nTarget: {result.target}\nHistory ({n} steps):\n{history or '(none)'}"
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
    out = [_record(result, "", 0, _plan_block(result), {"kind": "plan", "step": 0, "source": result.plan.source})]
    for i, r in enumerate(result.rounds):
        out.append(_record(result, _history(result, result.rounds[:i]), i + 1, _round_block(r),
                           {"kind": "probe", "step": i + 1, "source": r.source}))
    verdict = f"Answer: {result.answer}" + (f"; boundary: {result.boundary}" if result.boundary else "")
    answer = f"<think>{result.stop}</think><summary>{verdict}\n{result.summary}</summary>"
    out.append(_record(result, _history(result, result.rounds), len(result.rounds) + 1, answer,
                       {"kind": "summary", "step": len(result.rounds) + 1, "source": result.planner, "answer": result.answer}))
    return out
