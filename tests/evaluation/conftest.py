from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from canvasagent.evaluation.tasks_io import write_tasks
from canvasagent.core.tasks import Task
from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: F401  (session fixture)


def make_tasks(n: int = 3) -> list[Task]:
    colours = ["red", "green", "blue", "yellow", "purple"]
    tasks = []
    for i in range(n):
        img = Image.new("RGB", (48, 32), colours[i % len(colours)])
        img.putpixel((1, 1), (255, 255, 255))
        tasks.append(
            Task(
                f"Mirror the picture and crop the centre ({i})",
                [img],
                id=f"t{i}",
                expected_tools=["Flip", "Crop"],
                labels={"R": "easy", "L": "easy" if i % 2 else "medium"},
            )
        )
    return tasks


@pytest.fixture
def eval_split(tmp_path: Path) -> Path:
    d = tmp_path / "split"
    write_tasks(make_tasks(3), d)
    return d


def fake_score(traj) -> dict[str, float]:
    """A deterministic stand-in for the hybrid reward: rewards ok calls and termination."""
    ok = sum(1 for t in traj.turns if t.status == "ok")
    calls = max(1, len(traj.calls))
    rule = ok / calls
    align = 1.0 if traj.terminated and traj.final_asset() is not None else 0.0
    return {"hybrid": 0.3 * align + 0.1 * 0.5 + 0.2 * rule + 0.4 * rule, "align": align, "aes": 0.5, "traj": rule, "rule": rule}


@pytest.fixture
def scorer():
    return fake_score
