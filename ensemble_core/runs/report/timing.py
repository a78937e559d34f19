"""The report's ``timing.stages``: where a run's wall time went, stage by stage.

:func:`ensemble_core.runs.run` times every stage it calls (the Prefect flow's task runs
included, orchestration and all); training and evaluation report their own parts
(:class:`~ensemble_core.runs.results.TrainingTiming`, ``Evaluation.timing``), and the report
stage times itself up to the moment ``report.json`` is written. docs/evaluation.md lists
the keys; docs/benchmarks.md ("Where a run's time goes") measures them.
"""

from __future__ import annotations

from typing import Any

from ensemble_core.runs.results import Evaluation, TrainingSummary
from ensemble_core.timing import OTHER

#: The stages of :func:`ensemble_core.runs.run`, in the order they run (a run has those it
#: needs: no ``stratify`` without ``ensemble.stratify``, no ``drift_check``/``promote``
#: without promotion, no checks when it resumes a checkpoint).
STAGES = (
    "preflight",
    "prepare",
    "class_map_check",
    "unchanged_check",
    "drift_check",
    "train",
    "stratify",
    "select",
    "evaluate",
    "promote",
    "report",
)


def with_other(seconds: float, parts: dict[str, Any]) -> dict[str, Any]:
    """``{"seconds": seconds, "parts": parts + {"other": the rest}}`` (the rest clipped at
    0): a stage's parts that add up to its seconds. ``parts`` maps names to seconds or to
    ``{"seconds": ..., "parts": ...}``; an ``other`` already in it is replaced."""
    parts = {k: v if isinstance(v, dict) else {"seconds": float(v)} for k, v in parts.items() if k != OTHER}
    covered = sum(p["seconds"] for p in parts.values())
    return {"seconds": seconds, "parts": {**parts, OTHER: {"seconds": max(0.0, seconds - covered)}}}


def training_parts(training: TrainingSummary) -> dict[str, float]:
    """The training stage's parts (seconds): ``compile`` (lowering and compiling the step),
    ``steps`` (every optimizer step, steady state), ``validation`` (the validation split after
    each epoch), ``checkpoint writes``. Member groups trained side by side: each the longest group's."""
    t = training.timing
    return {
        "compile": t.compile_seconds,
        "steps": t.train_seconds,
        "validation": t.validation_seconds,
        "checkpoint writes": t.checkpoint_seconds,
    }


def timing_section(
    stage_seconds: dict[str, float],
    wall_seconds: float,
    training: TrainingSummary,
    evaluation: Evaluation,
    stratification_steps: float = 0.0,
) -> dict[str, Any]:
    """``report.json -> timing``'s new keys.

    Args:
      stage_seconds: wall seconds of every stage run so far, by :data:`STAGES` name (the
        report's own included).
      wall_seconds: from the start of :func:`ensemble_core.runs.run` to now.
      training, evaluation: the stages' results (their own parts).
      stratification_steps: optimizer-step seconds of a hyper-deep ensemble's stratified pool.

    Returns:
      ``stages`` (name -> ``{"seconds", "parts"?}``; ``train`` and ``evaluate`` with their
      parts and ``other``), ``wall_seconds``, ``training_steps_seconds`` (the optimizer steps,
      stratified pool included) and ``not_training_steps_fraction`` (1 - steps / wall).
    """
    stages: dict[str, Any] = {}
    for name, seconds in stage_seconds.items():
        if name == "train":
            stages[name] = with_other(seconds, training_parts(training))
        elif name == "evaluate" and evaluation.timing:
            stages[name] = with_other(seconds, evaluation.timing.get("parts", {}))
            if evaluation.timing.get("background"):  # overlapping the parts: not one of them
                stages[name]["background"] = evaluation.timing["background"]
        else:
            stages[name] = {"seconds": seconds}
    steps = training.timing.train_seconds + stratification_steps
    return {
        "wall_seconds": wall_seconds,
        "stages": stages,
        "training_steps_seconds": steps,
        "not_training_steps_fraction": 1.0 - steps / wall_seconds if wall_seconds > 0 else None,
    }


def timing_lines(timing: dict[str, Any]) -> list[str]:
    """One line per stage (seconds and share of the run; training and evaluation with their
    largest parts), then the share that is not optimizer steps: the CLI's closing lines and
    the report's timing section. ``timing``: :func:`timing_section`'s result."""
    wall = timing["wall_seconds"] or float("nan")
    lines = []
    for name, stage in timing["stages"].items():
        parts = stage.get("parts") or {}
        detail = ", ".join(
            f"{part} {p['seconds']:.1f} s" for part, p in sorted(parts.items(), key=lambda kv: -kv[1]["seconds"])[:4]
        )
        lines.append(
            f"{name}: {stage['seconds']:.1f} s ({100 * stage['seconds'] / wall:.0f}%)"
            + (f": {detail}" if detail else "")
        )
    if timing.get("retention_seconds") is not None:
        lines.append(f"retention (after the report): {timing['retention_seconds']:.1f} s")
    frac = timing.get("not_training_steps_fraction")
    lines.append(
        f"run: {timing['wall_seconds']:.1f} s, of which optimizer steps {timing['training_steps_seconds']:.1f} s"
        + (f" ({100 * frac:.0f}% of the run is not training steps)" if frac is not None else "")
    )
    return lines
