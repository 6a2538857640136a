"""Turn a round's samples into statistics and the observation text the planner reads."""

from __future__ import annotations

from canvasagent.evaluation.agent.types import Round, Sample


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def round_stats(samples: list[Sample]) -> dict[str, float]:
    measured = [s for s in samples if s.align_measured and "align" in s.scores]
    stats: dict[str, float] = {"n": float(len(samples)), "n_ok": float(sum(s.ok for s in samples)), "n_measured": float(len(measured))}
    for key, pool in (("align", measured), ("aes", [s for s in samples if s.ok]), ("overall", samples)):
        m = _mean([s.scores[key] for s in pool if key in s.scores])
        if m is not None:
            stats[key] = m
    checks: dict[str, list[float]] = {}
    for s in samples:
        for k, v in s.checks.items():
            checks.setdefault(k, []).append(v)
    for k, vs in checks.items():
        stats[f"check/{k}"] = sum(vs) / len(vs)
    return stats


def key_score(stats: dict[str, float]) -> float | None:
    """The number a round is judged by: measured alignment, else the overall reward."""
    return stats.get("align", stats.get("overall"))


def verdict(score: float | None) -> str:
    if score is None:
        return "no evidence"
    return "strong" if score >= 0.8 else "adequate" if score >= 0.5 else "weak"


def observation_text(rnd: Round) -> str:
    st = rnd.stats
    parts = [f"Round {rnd.index + 1} · {rnd.plan.sub_aspect}: {int(st['n_ok'])}/{int(st['n'])} samples produced an output"]
    if "align" in st:
        checks = ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in st.items() if k.startswith("check/"))
        parts.append(f"alignment {st['align']:.2f} measured on {int(st['n_measured'])} ({checks})" if checks else f"alignment {st['align']:.2f}")
    else:
        parts.append("alignment not measured (no verifiable check)")
    if "aes" in st:
        parts.append(f"aesthetic proxy {st['aes']:.2f}")
    if "overall" in st:
        parts.append(f"overall reward {st['overall']:.2f}")
    lines = ["; ".join(parts) + "."]
    for s in rnd.samples:
        detail = ", ".join(f"{k} {v:.2f}" for k, v in s.checks.items()) or (f"align {s.scores['align']:.2f}" if "align" in s.scores else "no check")
        err = f" — error: {s.error}" if s.error else ""
        lines.append(f"  · {s.prompt!r}: {detail}{err}")
    return "\n".join(lines)
