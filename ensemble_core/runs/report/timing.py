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
    """The training stage's parts (seconds): ``setup`` (building the network, mesh and
    step), ``data`` (reading the splits, placing them on the devices), ``initialisation``
    (initial parameters, or a checkpoint restored), ``data order`` (each epoch's order and
    learning rates), ``compile`` (lowering and compiling the step), ``steps`` (every
    optimizer step, steady state), ``validation`` (the validation split after each epoch),
    ``checkpoint writes``. Member groups trained side by side: each
    the longest group's. Parts that were not measured (0 s) are left out."""
    t = training.timing
    parts = {
        "setup": t.setup_seconds,
        "data": t.data_seconds,
        "initialisation": t.initialisation_seconds,
        "data order": t.order_seconds,
        "compile": t.compile_seconds,
        "steps": t.train_seconds,
        "validation": t.validation_seconds,
        "checkpoint writes": t.checkpoint_seconds,
    }
    return {k: v for k, v in parts.items() if v > 0 or k in ("compile", "steps")}


#: The part of a stage outside its own code: Prefect's task run around it (created and its
#: states reported through the API) and the flow's lines about it.
TASK_RUN = "Prefect task run"


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
            parts: dict[str, Any] = training_parts(training)
            if training.timing.call_seconds > 0:
                parts[TASK_RUN] = max(0.0, seconds - training.timing.call_seconds)
            stages[name] = with_other(seconds, parts)
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


#: The command line's entries of ``timing.stages``, around the run's (:func:`command_timing`):
#: from the process's start to the flow's call (the interpreter, imports, the config, the
#: preflight, Prefect's temporary server) ...
COMMAND_START = "command start"
#: ... retention (after the report) ...
RETENTION = "retention"
#: ... the flow's call to its return less the run's stages and retention (Prefect's flow and
#: task engine: creating the runs, reporting their states, the gaps between stages) ...
FLOW_ENGINE = "flow engine"
#: ... and from the flow's return to the command's end (the last logs and events sent, the
#: temporary server stopped).
COMMAND_END = "command end"


def command_timing(timing: dict[str, Any], start_seconds: float, flow_seconds: float, end_seconds: float) -> dict:
    """``timing`` (:func:`timing_section`'s, with ``retention_seconds``) for the whole command
    line: ``stages`` gains :data:`COMMAND_START` first, then the run's stages,
    :data:`RETENTION`, :data:`FLOW_ENGINE` and :data:`COMMAND_END`, which together add up to
    ``command_seconds``, and ``command_not_training_steps_fraction`` is the command's share
    that is not optimizer steps (``not_training_steps_fraction`` stays the run's).

    Args:
      timing: ``report.json -> timing`` as the report stage wrote it.
      start_seconds: from the process's start to the flow's call (wall seconds).
      flow_seconds: the flow's call to its return.
      end_seconds: the flow's return to the end of the command (its last measured moment).

    Returns:
      A new dict; ``timing`` is not changed. A ``timing`` already made whole is made
      again from its run's stages (idempotent).
    """
    own = (COMMAND_START, RETENTION, FLOW_ENGINE, COMMAND_END)
    run_stages = {k: v for k, v in timing["stages"].items() if k not in own}
    retention = float(timing.get("retention_seconds") or 0.0)
    engine = max(0.0, flow_seconds - sum(v["seconds"] for v in run_stages.values()) - retention)
    stages = {
        COMMAND_START: {"seconds": start_seconds},
        **run_stages,
        RETENTION: {"seconds": retention},
        FLOW_ENGINE: {"seconds": engine},
        COMMAND_END: {"seconds": end_seconds},
    }
    command = start_seconds + flow_seconds + end_seconds
    steps = float(timing.get("training_steps_seconds") or 0.0)
    return {
        **timing,
        "stages": stages,
        "command_seconds": command,
        "command_not_training_steps_fraction": 1.0 - steps / command if command > 0 else None,
    }


def timing_lines(timing: dict[str, Any]) -> list[str]:
    """One line per stage (seconds and share of the command, or of the run where the timing
    is not a command's; training and evaluation with their largest parts), then the share
    that is not optimizer steps: the CLI's closing lines and the report's timing section.
    ``timing``: :func:`timing_section`'s result, or :func:`command_timing`'s."""
    whole = timing.get("command_seconds")  # the command line's (command_timing), else the run's
    wall = (whole or timing["wall_seconds"]) or float("nan")
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
    if timing.get("retention_seconds") is not None and whole is None:
        lines.append(f"retention (after the report): {timing['retention_seconds']:.1f} s")
    steps = timing["training_steps_seconds"]
    frac = timing.get("not_training_steps_fraction")
    lines.append(
        f"run: {timing['wall_seconds']:.1f} s, of which optimizer steps {steps:.1f} s"
        + (f" ({100 * frac:.0f}% of the run is not training steps)" if frac is not None else "")
    )
    if whole is not None:
        frac = timing.get("command_not_training_steps_fraction")
        lines.append(
            f"command: {whole:.1f} s, from the process's start to its end"
            + (f" ({100 * frac:.0f}% of it is not training steps)" if frac is not None else "")
        )
    return lines
