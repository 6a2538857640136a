"""Fuzz the whole episode pipeline with generated hostile input, and count uncaught exceptions.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fuzz.py --cases 100000 [--seed 0] [--out benchmarks/results/fuzz.md]

Every case is one generated input pushed as far down the pipeline as it goes:

- `episode` (most cases): 1-5 generated replies (protocol fragments, calls with hostile
  arguments: 400-digit integers, NaN/inf, lone surrogates, long and deeply nested values,
  path-like asset IDs) run by the real episode runner on small inputs (parse, validate, step),
  then `Trajectory.save`, `Trajectory.load`, the rule score, the hybrid reward with offline
  judges (every `--hybrid-every`-th case) and a replay of the loaded record;
- `record`: a public ShareGPT record (one of ours, mutated, or junk) read with `read_record`
  and replayed;
- `task`: an evaluation task record read with `task_from_record`;
- `trajfile`: a mutated `trajectory.json` read back with `Trajectory.load`.

An exception counts as uncaught when it escapes a stage whose contract is not to raise
(parse, validate, step, save, rewards, replay) or, for the readers, when it is not their
documented refusal (`FormatError`, `ImageLoadError`, `TaskLoadError`, `TrajectoryLoadError`).
Broken invariants (a loaded record that differs from the saved one, a reward outside [0, 1], a
replayed pure-tool turn with another status) are counted separately. The target is 0 of both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from PIL import Image

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.tasks_io import TaskLoadError, task_from_record
from canvasagent.core.formats.sharegpt import FormatError, read_record, to_record
from canvasagent.core.imageio import ImageLoadError
from canvasagent.core.policies import ReplayPolicy
from canvasagent.replay import from_public, from_trajectory, replay
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, TrajectoryLoadError
from rewards.config import RewardConfig
from rewards.hybrid import HybridReward
from rewards.rule import score_rule
from toolserver.registry import REGISTRY, Backend
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

RESULTS = Path(__file__).resolve().parent / "results" / "fuzz.md"
TOOLS = sorted(REGISTRY)
PURE = {n for n, s in REGISTRY.items() if s.backend is not Backend.MODEL}
PURE_CALLS = {n for n, s in REGISTRY.items() if s.backend is Backend.PURE}
READER_ERRORS = (FormatError, ImageLoadError, TaskLoadError, TrajectoryLoadError)

# -- generated values ------------------------------------------------------------------------------

WEIRD_TEXT = [
    "", " ", "\x00", "\ud800", "\udfff", "a\ud83dz", "\U0001F600", "\u202e", "é", "\n", "\t", "\\", '"', "'",
    "<reason>", "</reason>", "<tool_call>", "</tool_call>", "<Terminate>", "```json", "```", "{", "}", "[", "]",
    "img_1", "img_2", "IMG_1", "img_1 ", "img_0", "img_99", "Crop_0", "Flip_0", "Rotate_0", "SAM_0", "Flip_-1",
    "../../etc/passwd", "/etc/passwd", "C:\\x", "%s%n", "NaN", "Infinity", "-0", "1e999", "0x10", "  90 ",
]


class Gen:
    """Hostile values from one seeded RNG (same seed, same cases)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def text(self, max_len: int = 16) -> str:
        r = self.r
        k = r.random()
        if k < 0.4:
            return "".join(r.choice(WEIRD_TEXT) for _ in range(r.randint(0, 4)))
        if k < 0.8:
            return "".join(chr(r.choice([r.randint(32, 126), r.randint(0, 0x10FFFF)])) for _ in range(r.randint(0, max_len)))
        if k < 0.97:
            return r.choice(WEIRD_TEXT)
        return r.choice(["x", "\ud800", "é "]) * r.randint(1000, 20000)  # long text

    def number(self) -> Any:
        r = self.r
        return r.choice([
            lambda: r.randint(-10, 1010),
            lambda: r.randint(-10**18, 10**18),
            lambda: int("9" * r.randint(20, 400)) * r.choice([1, -1]),  # beyond float range
            lambda: r.uniform(-1e6, 1e6),
            lambda: r.choice([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, -0.0]),
            lambda: r.choice([0, 45, 90, 180, 270, 360, -90, 7]),
        ])()

    def scalar(self) -> Any:
        r = self.r
        k = r.random()
        if k < 0.35:
            return self.number()
        if k < 0.75:
            return self.text()
        return r.choice([None, True, False, [], {}])

    def value(self, depth: int = 0) -> Any:
        r = self.r
        k = r.random()
        if depth > 3 or k < 0.55:
            return self.scalar()
        if k < 0.7:
            return [self.scalar() for _ in range(r.randint(0, 6))]  # bbox-like lists
        if k < 0.8:
            return f"[{', '.join(str(self.number()) for _ in range(r.randint(0, 6)))}]"  # bbox as text
        if k < 0.9:
            return {self.text(6): self.value(depth + 1) for _ in range(r.randint(0, 3))}
        return [self.value(depth + 1) for _ in range(r.randint(0, 3))]

    def nested(self) -> Any:
        v: Any = self.scalar()
        for _ in range(self.r.choice([10, 100, 500, 2000])):
            v = [v] if self.r.random() < 0.5 else {"a": v}
        return v

    def plausible(self, arg: Any) -> Any:
        """A value of the argument's own type, in range: calls that run, so the tools get fuzzed."""
        r = self.r
        kind = arg.type.value
        if kind == "asset":
            return r.choice(["img_1"] * 6 + ["img_2", "Crop_0", "Flip_0", "Rotate_0", "Extract_0"])
        if kind == "choice":
            c = r.choice(arg.choices)
            return str(c) if r.random() < 0.2 else c
        if kind == "bbox":
            x0, x1 = sorted(r.randint(0, 1000) for _ in range(2))
            y0, y1 = sorted(r.randint(0, 1000) for _ in range(2))
            box = [x0, y0, x1, y1]
            return str(box) if r.random() < 0.3 else box
        if kind == "position":
            return [r.randint(0, 1000), r.randint(0, 1000)]
        if kind == "unit":
            return r.random()
        return self.text(30) if r.random() < 0.5 else r.choice(["object", "text", "SALE", "a red cat"])

    def arguments(self, name: str) -> dict[str, Any]:
        r = self.r
        spec = REGISTRY.get(name)
        keys = list(spec.arg_names) if spec else []
        args: dict[str, Any] = {}
        if spec is not None and r.random() < 0.7:
            args = {a.name: self.plausible(a) for a in spec.args if a.required or r.random() < 0.5}
            if r.random() < 0.8:
                return args
        for k in keys:
            if r.random() < 0.8:
                if k in ("image", "base_image", "content", "mask") and r.random() < 0.6:
                    args[k] = r.choice(["img_1", "img_2", "Flip_0", "Crop_0", "Rotate_0", "SAM_0"]) if r.random() < 0.8 else self.text()
                else:
                    args[k] = self.value()
        for _ in range(r.choice([0, 0, 0, 1, 2])):
            args[self.text(8)] = self.value()
        if r.random() < 0.02:
            args[r.choice(keys or ["x"])] = self.nested()
        return args

    def call_json(self) -> str:
        r = self.r
        name = r.choice(sorted(PURE_CALLS)) if r.random() < 0.5 else r.choice(TOOLS) if r.random() < 0.8 else self.text(10)
        call: Any = {"name": name, "arguments": self.arguments(name if isinstance(name, str) else "")}
        if r.random() < 0.05:
            call = r.choice([[call], "call", None, {"name": name}, {"arguments": call["arguments"]}, self.nested()])
        try:
            text = json.dumps(call, ensure_ascii=r.random() < 0.5)
        except (ValueError, RecursionError):  # deeper than json can write: send it as text
            text = "[" * 5000
        if r.random() < 0.1:  # cut short, or with junk around
            text = text[: r.randint(0, len(text))] if r.random() < 0.5 else self.text(4) + text + self.text(4)
        return text

    def reply(self) -> str:
        r = self.r
        k = r.random()
        if k < 0.75:  # protocol-shaped
            parts = []
            if r.random() < 0.9:
                parts.append(f"<reason>{self.text()}</reason>")
            for _ in range(r.choice([0, 1, 1, 1, 1, 2])):
                body = self.call_json()
                parts.append(f"<tool_call>{body}</tool_call>" if r.random() < 0.8 else f"```json\n{body}\n```")
            if r.random() < 0.15:
                parts.append("<Terminate>")
            if r.random() < 0.1:
                r.shuffle(parts)
            return self.text(3).join(parts) if r.random() < 0.2 else "".join(parts)
        if k < 0.93:  # fragment soup
            return "".join(r.choice([self.text(), r.choice(WEIRD_TEXT), self.call_json()[:20]]) for _ in range(r.randint(0, 10)))
        return self.text(200)

    def image(self) -> Image.Image:
        r = self.r
        mode = r.choice(["RGB", "RGB", "RGBA", "L", "LA", "P", "1", "I;16", "F", "CMYK"])
        w, h = r.choice([(1, 1), (1, 7), (9, 1), (8, 6), (16, 12), (23, 17)])
        img = Image.new(mode, (w, h))
        img.putpixel((w // 2, h // 2), img.getpixel((0, 0)))  # same mode, non-trivial size
        return img


# -- the stages --------------------------------------------------------------------------------


def _pairs(text: str) -> str:
    """`text` with each high+low surrogate pair joined into the character it encodes: how any
    JSON reader reads such a pair back (a lone surrogate stays as it is)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


class Tally:
    def __init__(self):
        self.cases: Counter[str] = Counter()
        self.stages: Counter[str] = Counter()  # stage passes reached
        self.uncaught: Counter[tuple[str, str, str]] = Counter()
        self.invariant: Counter[tuple[str, str]] = Counter()
        self.examples: dict[Any, str] = {}
        self.cpu0 = self.cpu_s = 0.0
        self.interrupted = False

    def crash(self, stage: str, e: BaseException, case: Any) -> None:
        tb = traceback.extract_tb(e.__traceback__)
        ours = [f for f in tb if "/site-packages/" not in f.filename and "/benchmarks/" not in f.filename] or tb
        where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno} {ours[-1].name}" if ours else "?"
        key = (stage, type(e).__name__, where)
        self.uncaught[key] += 1
        if key not in self.examples:
            self.examples[key] = f"{type(e).__name__}: {str(e)[:200]}\ninput: {repr(case)[:300]}"
            print(f"new uncaught: {key}\n{self.examples[key]}\n{''.join(traceback.format_tb(e.__traceback__)[-3:])}",
                  file=sys.stderr, flush=True)

    def broken(self, what: str, detail: str) -> None:
        key = ("invariant", what)
        self.invariant[key] += 1
        self.examples.setdefault(key, detail[:400])


def guarded(tally: Tally, stage: str, case: Any, fn: Callable[[], Any], allowed: tuple = ()) -> tuple[bool, Any]:
    """Run one stage; (True, value) when it returned, (False, None) when it refused or crashed."""
    try:
        out = fn()
    except allowed:
        return False, None
    except RecursionError as e:
        tally.crash(stage, e, case)
        return False, None
    except Exception as e:  # noqa: BLE001 - counting them is the point
        tally.crash(stage, e, case)
        return False, None
    tally.stages[stage] += 1
    return True, out


class Pipeline:
    def __init__(self, work: Path, hybrid_every: int):
        self.work = work
        self.hybrid_every = hybrid_every
        self.toolboxes = {p: LocalToolbox(profile=p) for p in Profile}
        self.hybrid = HybridReward(RewardConfig.load("paper")) if hybrid_every > 0 else None
        self.n = 0

    def close(self) -> None:
        if self.hybrid is not None:
            self.hybrid.close()

    def episode(self, g: Gen, t: Tally) -> None:
        r = g.r
        self.n += 1
        replies = [g.reply() for _ in range(r.randint(1, 5))]
        profile = r.choice(list(Profile))
        task = Task(g.text(40), [g.image() for _ in range(r.choice([1, 1, 2, 3]))], id=f"fz{self.n % 7}")
        ok, traj = guarded(t, "step", replies, lambda: run_episode(ReplayPolicy(replies), task, self.toolboxes[profile],
                                                                   EpisodeConfig(max_turns=r.randint(1, 7))))
        if not ok:
            return
        t.stages.update(f"turn: {x.status}" + (f" {x.error_code}" if x.error_code else "") for x in traj.turns)
        d = self.work / "ep"
        ok, _ = guarded(t, "save", replies, lambda: traj.save(d))
        if not ok:
            return
        ok, back = guarded(t, "load", replies, lambda: Trajectory.load(d))
        if not ok:
            return
        if [_pairs(x.reply) for x in back.turns] != [_pairs(x.reply) for x in traj.turns] or back.assets.ids() != traj.assets.ids():
            t.broken("load != save", repr([x.reply for x in traj.turns])[:300])
        ok, rule = guarded(t, "rule", replies, lambda: score_rule(back))
        if ok and not (0.0 <= rule.r_rule <= 1.0):
            t.broken("rule reward outside [0, 1]", f"{rule.r_rule} for {replies!r:.300}")
        if self.hybrid is not None and self.n % self.hybrid_every == 0:
            ok, flat = guarded(t, "hybrid", replies, lambda: self.hybrid.score(back))
            if ok and not (0.0 <= flat["hybrid"] <= 1.0):
                t.broken("hybrid total outside [0, 1]", f"{flat} for {replies!r:.300}")
        ok, rep = guarded(t, "replay", replies, lambda: replay(from_trajectory(back), self.toolboxes[profile]))
        if ok:
            again, _ = rep
            for a, b in zip(traj.turns, again.turns):
                if a.call is not None and a.call.name in PURE and a.status != b.status:
                    t.broken("replayed pure-tool turn changed status", f"{a.status} -> {b.status}: {a.reply!r:.300}")
                    break
        if r.random() < 0.3:
            self.record(g, t, traj)

    def record(self, g: Gen, t: Tally, traj: Trajectory | None = None) -> None:
        r = g.r
        d = self.work / "rec"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        rec: Any
        if traj is not None:
            ok, rec = guarded(t, "to_record", None, lambda: to_record(traj, d, image_prefix=""))
            if not ok:
                return
        else:
            Image.new("RGB", (6, 4), (1, 2, 3)).save(d / "a.png")
            rec = {"messages": [{"role": "user", "content": "img_1: <image>\n" + g.text()},
                                *({"role": r.choice(["assistant", "tool", "gpt", "observation", "x", None]), "content": g.reply()}
                                  for _ in range(r.randint(0, 4)))],
                   "images": ["a.png"]}
        rec = self.mutate(g, rec, paths=["../outside.png", "/etc/passwd", "a.png", "missing.png", "", 7, None, ["a.png"]])
        Image.new("RGB", (3, 3)).save(self.work / "outside.png")
        ok, pt = guarded(t, "read_record", rec, lambda: read_record(rec, base_dir=d), READER_ERRORS)
        if ok:
            guarded(t, "replay_public", rec, lambda: replay(from_public(pt), self.toolboxes[Profile.CANVASCRAFT]))

    def task(self, g: Gen, t: Tally) -> None:
        r = g.r
        d = self.work / "task"
        d.mkdir(exist_ok=True)
        Image.new("RGB", (5, 5)).save(d / "in.png")
        if r.random() < 0.5:
            rec: Any = {"path": [r.choice(TOOLS)], "image": ["in.png"], "prompt": g.text(), "extra_info": {"id": g.text(6)}}
        else:
            rec = {"id": g.text(6), "instruction": g.text(), "images": ["in.png"], "meta": {"reference_images": ["in.png"]}}
        rec = self.mutate(g, rec, paths=["../x.png", "/etc/hosts", "in.png", "", 3, None, {"a": 1}])
        if not isinstance(rec, dict):
            rec = {"prompt": rec}
        guarded(t, "task_record", rec, lambda: task_from_record(rec, d), READER_ERRORS)

    def trajfile(self, g: Gen, t: Tally) -> None:
        d = self.work / "tf"
        task = Task("x", [Image.new("RGB", (4, 4))], id="tf")
        traj = run_episode(ReplayPolicy(['<reason>r</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>']),
                           task, self.toolboxes[Profile.CANVASCRAFT], EpisodeConfig(max_turns=2))
        traj.save(d)
        data = self.mutate(g, json.loads((d / "trajectory.json").read_text()), paths=["../../x.png", "/etc/passwd", "assets/img_1.png", 5])
        try:
            (d / "trajectory.json").write_text(json.dumps(data), encoding="utf-8", errors="surrogatepass")
        except (ValueError, RecursionError):
            return
        guarded(t, "trajectory_load", data, lambda: Trajectory.load(d), READER_ERRORS)

    def mutate(self, g: Gen, obj: Any, paths: list[Any], rate: float | None = None) -> Any:
        """A copy of `obj` with some leaves and containers replaced by hostile values (a third of
        the records stay intact, so the readers' success path is fuzzed too)."""
        r = g.r
        if rate is None:
            rate = r.choice([0.0, 0.01, 0.03, 0.1])
        if rate == 0.0:
            return obj
        if r.random() < 0.02:
            return g.value()
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if r.random() < rate / 3:
                    continue  # drop a key
                if r.random() < rate:
                    v = r.choice(paths) if k in ("images", "image", "file", "reference_images", "reference_image") else g.value()
                out[k] = self.mutate(g, v, paths, rate)
            if r.random() < rate / 3:
                out[g.text(6)] = g.value()
            return out
        if isinstance(obj, list):
            out_l = [self.mutate(g, v, paths, rate) for v in obj if r.random() > rate / 4]
            if r.random() < rate / 3:
                out_l.insert(r.randint(0, len(out_l)), r.choice(paths) if r.random() < 0.5 else g.value())
            return out_l
        if isinstance(obj, str) and r.random() < rate / 2:
            return r.choice(paths) if obj.endswith(".png") else g.text()
        return obj


KINDS = (("episode", 0.7), ("record", 0.1), ("task", 0.1), ("trajfile", 0.1))


def run(cases: int, seed: int, hybrid_every: int, progress_every: int = 10000) -> tuple[Tally, float]:
    import logging

    logging.disable(logging.WARNING)  # the pipeline logs every refusal; we count them instead
    g = Gen(seed)
    tally = Tally()
    work = Path(tempfile.mkdtemp(prefix="canvasagent-fuzz-"))
    pipe = Pipeline(work, hybrid_every)
    names, weights = zip(*KINDS)
    t0 = time.perf_counter()
    tally.cpu0 = time.process_time()
    def stop(signum, frame):  # SIGTERM ends the run early; the report covers the cases done
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for i in range(cases):
            kind = g.r.choices(names, weights)[0]
            tally.cases[kind] += 1
            getattr(pipe, kind)(g, tally)
            if progress_every and (i + 1) % progress_every == 0:
                n_unc = sum(tally.uncaught.values())
                print(f"  {i + 1:,} cases, {n_unc} uncaught, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        tally.interrupted = True
        kind_done = tally.cases[kind] - 1  # the case under way when the run stopped is not counted
        tally.cases[kind] = kind_done
    finally:
        pipe.close()
        shutil.rmtree(work, ignore_errors=True)
    tally.cpu_s = time.process_time() - tally.cpu0
    return tally, time.perf_counter() - t0


def report(tally: Tally, seconds: float, seed: int, hybrid_every: int, commit: str) -> str:
    n = sum(tally.cases.values())
    unc = sum(tally.uncaught.values())
    inv = sum(tally.invariant.values())
    lines = [
        "# Pipeline fuzz (`benchmarks/fuzz.py`)",
        "",
        (f"Commit `{commit}`, seed {seed}, one process (OMP_NUM_THREADS=1), hybrid reward on every "
         f"{hybrid_every}th episode."),
        "",
        f"**{n:,} cases, {unc} uncaught exceptions, {inv} broken invariants** in {seconds:.0f} s wall, "
        f"{tally.cpu_s:.0f} s CPU ({n / max(tally.cpu_s, 1e-9):.0f} cases per CPU second; the machine was shared, "
        "so wall time is longer than CPU time)" + (", stopped early by SIGTERM/Ctrl-C." if tally.interrupted else "."),
        "",
        "| case kind | cases |",
        "|---|---:|",
        *(f"| {k} | {v:,} |" for k, v in sorted(tally.cases.items())),
        "",
        "| stage passed | times |",
        "|---|---:|",
        *(f"| {k} | {v:,} |" for k, v in sorted(tally.stages.items())),
        "",
    ]
    if tally.uncaught or tally.invariant:
        lines += ["## Uncaught exceptions and broken invariants", "", "| stage | exception | where | count |", "|---|---|---|---:|"]
        lines += [f"| {s} | {e} | `{w}` | {c:,} |" for (s, e, w), c in tally.uncaught.most_common()]
        lines += [f"| invariant | {w} | | {c:,} |" for (_, w), c in tally.invariant.most_common()]
        lines += ["", "First example of each:", ""]
        for key, ex in tally.examples.items():
            lines += [f"- `{key}`:", "", "  ```", *("  " + x for x in ex.splitlines()), "  ```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hybrid-every", type=int, default=10, help="score every Nth episode with the hybrid reward (0: never)")
    p.add_argument("--out", default=str(RESULTS), help="markdown report (default benchmarks/results/fuzz.md; '' for none)")
    args = p.parse_args(argv)
    tally, seconds = run(args.cases, args.seed, args.hybrid_every)
    try:
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                                cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    text = report(tally, seconds, args.seed, args.hybrid_every, commit)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8", errors="backslashreplace")
    n = sum(tally.cases.values())
    unc = sum(tally.uncaught.values())
    print(f"cases: {n}  uncaught exceptions: {unc}  broken invariants: {sum(tally.invariant.values())}  "
          f"({seconds:.0f} s wall, {tally.cpu_s:.0f} s CPU)")
    for (stage, exc, where), c in tally.uncaught.most_common(10):
        print(f"  {c:6d}  {stage}: {exc} at {where}")
    for (_, what), c in tally.invariant.most_common(10):
        print(f"  {c:6d}  invariant: {what}")
    return 0 if unc == 0 and not tally.invariant else 1


if __name__ == "__main__":
    sys.exit(main())
