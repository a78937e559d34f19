"""The training pipeline flow and its command line.

    python -m flows.train_ensemble [--config FILE] [--set dotted.key=value ...]
                                   [--output-dir DIR] [--run-name NAME]

prepare_dataset -> check_unchanged -> detect_drift -> train_members (orbax
checkpoints) -> [select_settings -> stratify_members: hyper-deep ensembles] ->
select_members -> evaluate_members -> compare_with_champion -> publish_report ->
apply_retention.
The last line printed is the run directory ``DIR/NAME`` (for a run that
``nightly.when_unchanged=skip`` skipped: a line saying so, then the champion's run
directory). Bad input exits with code 2 and a one-line message before anything is
computed or written.
"""

# ruff: noqa: I001  (flows.environment must be imported before anything that imports JAX)
from __future__ import annotations

from flows import environment  # must precede every JAX import

import argparse
import datetime as dt
import functools
import json
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import State

from ensemble_core import startup_gc
from ensemble_core import runs
from ensemble_core.config import PipelineConfig, load_config, validate
from ensemble_core.errors import ConfigError, EnsembleError, PreemptedError
from ensemble_core.runs.report.timing import timing_lines
from ensemble_core.runs.evaluation.evaluate import import_libraries as import_evaluation_libraries
from ensemble_core.runs.report.write import record_command_timing
from flows import ephemeral
from flows import run_outcome
from flows import server_check
from flows import prefect_services
from flows import command_line
from flows.command_line import EXIT_BAD_INPUT, report_error
from tasks import without_introspection
from tasks.cluster import preflight as cluster_preflight
from tasks.cluster import preflight_before_flow
from tasks.champion import compare_with_champion
from tasks.evaluate import evaluate_members
from tasks.prepare_dataset import prepare_stage
from tasks.report import publish_report
from tasks.select import select_members
from tasks.retraining import apply_retention, check_unchanged, detect_drift
from tasks.stratify import stratify_stage
from tasks.train import train_stage

environment.quiet_tfds()  # TFDS is imported now (by ensemble_core.data): its progress bars off

DEFAULT_OUTPUT_DIR = "runs"

# The sequence of ensemble_core.runs.run, each stage a Prefect task.
STAGE_TASKS: dict[str, Callable] = {
    "preflight": cluster_preflight,
    "prepare": prepare_stage,
    "check_unchanged": check_unchanged,
    "detect_drift": detect_drift,
    "train": train_stage,
    "stratify": stratify_stage,
    "select": select_members,
    "evaluate": evaluate_members,
    "promote": compare_with_champion,
    "report": publish_report,
    "retain": apply_retention,
}
STAGES = runs.Stages(**{name: without_introspection(stage) for name, stage in STAGE_TASKS.items()})


def default_run_name() -> str:
    """``YYYYmmdd-HHMMSS-<flow run name>`` from the flow run's scheduled start: unique per
    flow run, sortable by time, and the same when the retry-crashed-runs automation runs
    the flow run again (Prefect keeps its name and expected start), so the re-run resumes.
    Outside a flow run (the command line, before it starts one): ``YYYYmmdd-HHMMSS`` now."""
    if FlowRunContext.get() is None:
        return dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    stamp = flow_run.get_scheduled_start_time().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{flow_run.get_name()}"


@flow(
    name="train-ensemble",
    log_prints=True,
    # The flow validates ``config`` itself (validate_parameters=False), once, so that a bad
    # value from a deployment is refused with the same one-line message as from the
    # command line; the parameter schema (the UI form, every field with its description)
    # still comes from the annotation.
    validate_parameters=False,
    # No flow retries: bad input fails at once (flows.run_outcome.refused); transient errors are
    # retried by the stage's task; a crash or preemption ends Crashed and the
    # retry-crashed-runs automation re-runs it, resuming from the latest checkpoint.
    timeout_seconds=6 * 3600,
)
def train_ensemble(
    config: PipelineConfig = PipelineConfig(),
    output_dir: str = DEFAULT_OUTPUT_DIR,
    run_name: str | None = None,
    # Deprecated, removed in the next release: the config's sections as parameters of their own.
    seed: int | None = None,
    data: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    ensemble: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    mesh: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    eval: dict[str, Any] | None = None,  # noqa: A002  (the config section's name)
    promotion: dict[str, Any] | None = None,
    distributed: dict[str, Any] | None = None,
) -> str | State:
    """Train, checkpoint, evaluate and report a deep ensemble; returns the run directory.

    Whatever the config's schema cannot refuse (an unknown dataset, a batch larger than
    the split, a mesh that does not fit, a run directory in use) ends the run ``Failed``
    before any compute, with nothing written under ``output_dir`` and the state message
    ``error: ...; fix: ...``.

    Args:
        config: The whole pipeline config (configs/default.yaml); from a deployment a nested
            mapping, e.g. {"ensemble": {"size": 4}}; keys left out keep their defaults.
        output_dir: Parent of run directories.
        run_name: The run directory's name; re-using one resumes that run (default: the
            scheduled start and the flow run's name).
        seed: Deprecated: use config.seed.
        data: Deprecated: use config.data.
        model: Deprecated: use config.model.
        ensemble: Deprecated: use config.ensemble.
        train: Deprecated: use config.train.
        mesh: Deprecated: use config.mesh.
        checkpoint: Deprecated: use config.checkpoint.
        eval: Deprecated: use config.eval.
        promotion: Deprecated: use config.promotion.
        distributed: Deprecated: use config.distributed.
    """
    startup_gc.resume()  # a deployment's flow-run process: its imports are done (flows/__init__.py)
    services = prefect_services.PrefectServices()
    prefect_services.send_held_logs()  # what the command line's preflight logged (preparing the dataset)
    run_name = run_name or default_run_name()
    legacy = {"seed": seed, "data": data, "model": model, "ensemble": ensemble, "train": train, "mesh": mesh}
    legacy.update(checkpoint=checkpoint, eval=eval, promotion=promotion, distributed=distributed)
    legacy = {k: v for k, v in legacy.items() if v is not None}
    for name in legacy:
        get_run_logger().warning(deprecated_parameter(name))
    try:
        config = as_config(config, legacy)
        result = runs.run(config, output_dir, run_name, STAGES)  # preflight first: refusals before any compute
    except PreemptedError as err:
        return run_outcome.interrupted(err)
    except EnsembleError as err:
        return run_outcome.refused(err)
    if result.skipped is not None:
        print(result.skipped.reason)  # log_prints: the run's log and the command line's output
    return services.outcome(str(result.run_dir.path))


def as_config(config: PipelineConfig | dict[str, Any] | None, sections: dict[str, Any] | None = None) -> PipelineConfig:
    """``config`` as a validated :class:`PipelineConfig`: a ``PipelineConfig`` (the command
    line validated it) as it is, a nested dict (a deployment's parameter) through
    :func:`ensemble_core.config.validate`, ``None`` as the defaults.

    ``sections`` are the deprecated per-section flow parameters (``{"ensemble": {...}}``):
    each replaces its section of ``config``, as it did when it was a parameter of its own
    (the flow logs :func:`deprecated_parameter` for each).

    Raises:
      ConfigError: a value out of range or of the wrong type, an unknown key (one line).
    """
    if not sections and isinstance(config, PipelineConfig):
        return config
    if isinstance(config, PipelineConfig):
        config = config.model_dump(mode="json")
    if config is not None and not isinstance(config, dict):
        raise ConfigError(
            f"parameter config is a {type(config).__name__}",
            fix='pass the config as a mapping of its sections, e.g. {"ensemble": {"size": 4}}',
        )
    raw = dict(config or {})
    raw.update(sections or {})
    return validate(raw)


def deprecated_parameter(name: str) -> str:
    """The one-line warning for a deprecated per-section flow parameter ``name``."""
    return (
        f"warning: flow parameter {name!r} is deprecated and goes in the next release; "
        f"fix: pass it inside config, e.g. -p config='{{\"{name}\": ...}}'"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flows.train_ensemble", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML config file (default: the built-in defaults = configs/default.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set ensemble.size=4 (repeatable)",
    )
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, help="parent of run directories (default: runs)")
    parser.add_argument("--run-name", help="run directory name; an existing run resumes (default: a timestamp)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 done, 2 bad input or a failed stage, 75 stopped by SIGTERM or
    SIGINT (after a checkpoint when training; rerun with the same run name to resume)."""
    command_line.command_started()
    args = parse_args(argv)
    run_name = args.run_name or default_run_name()
    try:
        with command_line.raise_on_stop_signals():
            return _main(args, run_name)
    except command_line.stop_exceptions() as err:
        return command_line.stopped(err, f"rerun with --run-name {run_name} to resume")


def _main(args: argparse.Namespace, run_name: str) -> int:
    try:
        config = load_config(args.config, args.overrides)
    except EnsembleError as err:
        return report_error(err)
    down = server_check.unreachable()
    if down:
        print(f"error: {down}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        try:
            # The flow run's preflight takes it over; what it logs (the dataset's preparation)
            # goes to the flow run's logs once that has started (flows.prefect_services).
            with prefect_services.logs_held_for_next_run():
                preflight_before_flow(config, args.output_dir, run_name)
        except EnsembleError as err:
            return report_error(err)
        # while the temporary server is still starting: evaluation's imports, free there
        ephemeral.while_starting(functools.partial(import_evaluation_libraries, config))
        closing = functools.partial(stage_times, run_name)
        timed = functools.partial(command_times, run_name)
        return run_outcome.run_cli(
            train_ensemble, closing, timed, config=config, output_dir=args.output_dir, run_name=run_name
        )
    finally:
        prefect_services.discard_held_logs()  # sent to the flow run by now, or it never started


def command_times(run_name: str, run_dir: str, start: float, flow: float, end: float) -> None:
    """Record the command line's own seconds (before, in and after the flow) in run
    ``run_name``'s report (:func:`ensemble_core.runs.report.write.record_command_timing`), so
    that ``timing.stages`` covers the whole command; nothing for another run's directory
    (a skipped run names the champion's)."""
    if Path(run_dir).name == run_name:
        record_command_timing(run_dir, start, flow, end)


def stage_times(run_name: str, run_dir: str) -> list[str]:
    """The CLI's closing lines: where run ``run_name``'s time went (``report.json ->
    timing.stages``, :func:`ensemble_core.runs.report.timing.timing_lines`); none when
    ``run_dir`` is another run's (a skipped run names the champion) or has no timings."""
    try:
        report = json.loads((Path(run_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return []
    timing = report.get("timing") or {}
    if report.get("run_name") != run_name or "stages" not in timing:
        return []
    return ["time per stage:", *timing_lines(timing)]


if __name__ == "__main__":
    command_line.end(main())
