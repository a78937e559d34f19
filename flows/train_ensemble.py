"""The training pipeline flow and its command line.

    python -m flows.train_ensemble [--config FILE] [--set dotted.key=value ...]
                                   [--output-dir DIR] [--run-name NAME]

prepare_dataset -> split_rngs -> train_ensemble (orbax checkpoints) -> evaluate -> report.
The last line printed is the run directory ``DIR/NAME``. Bad input exits with code 2 and
a one-line message before anything is computed or written.
"""

# ruff: noqa: I001  (flows._env must be imported before anything that imports JAX)
from __future__ import annotations

from flows import _env  # noqa: F401  (must precede every JAX import)

if __name__ == "__main__":
    from flows import _cli as _startup

    _startup.exit_cleanly_while_starting()  # Ctrl-C during the imports below: one line

import argparse
import datetime as dt
import sys

from prefect import flow
from prefect.context import FlowRunContext
from prefect.runtime import flow_run

from ensemble_core import runs
from ensemble_core.config import (
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    EnsembleConfig,
    EvalConfig,
    MeshConfig,
    ModelConfig,
    PipelineConfig,
    PromotionConfig,
    TrainConfig,
    load_config,
    validate,
)
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import EnsembleError, PreemptedError
from flows import _outcome
from flows import _server
from flows import _cli
from flows._cli import EXIT_BAD_INPUT, report_error
from tasks.champion import compare_with_champion
from tasks.evaluate import evaluate_members
from tasks.prepare_dataset import prepare_dataset
from tasks.report import publish_report
from tasks.split_rngs import split_rngs
from tasks.train import train_stage

DEFAULT_OUTPUT_DIR = "runs"

# The command line runs the preflight before it starts a Prefect server (a refusal is one
# line and no server); it leaves the result here, keyed by what was checked, so that the
# flow it then calls in the same process does not check it all again.
_PREFLIGHTED: dict[tuple[str, str, str], DatasetInfo] = {}


def _preflight(config: PipelineConfig, output_dir: str, run_name: str) -> DatasetInfo:
    """The CLI's preflight result for exactly these inputs, or a fresh preflight."""
    key = (config.model_dump_json(), str(output_dir), run_name)
    return _PREFLIGHTED.pop(key, None) or runs.preflight(config, output_dir, run_name)


# The sequence of ensemble_core.runs.run, each stage a Prefect task.
STAGES = runs.Stages(
    preflight=_preflight,
    prepare=prepare_dataset,
    split_keys=split_rngs,
    train=train_stage,
    evaluate=evaluate_members,
    promote=compare_with_champion,
    report=publish_report,
)


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
    # No flow retries: bad input fails at once (flows._outcome.refused); transient errors are
    # retried by the stage's task; a crash or preemption ends Crashed and the
    # retry-crashed-runs automation re-runs it, resuming from the latest checkpoint.
    timeout_seconds=6 * 3600,
)
def train_ensemble(
    seed: int = 0,
    data: DataConfig = DataConfig(),
    model: ModelConfig = ModelConfig(),
    ensemble: EnsembleConfig = EnsembleConfig(),
    train: TrainConfig = TrainConfig(),
    mesh: MeshConfig = MeshConfig(),
    checkpoint: CheckpointConfig = CheckpointConfig(),
    eval: EvalConfig = EvalConfig(),  # noqa: A002  (the config section's name)
    promotion: PromotionConfig = PromotionConfig(),
    distributed: DistributedConfig = DistributedConfig(),
    output_dir: str = DEFAULT_OUTPUT_DIR,
    run_name: str | None = None,
) -> str:
    """Train, checkpoint, evaluate and report a deep ensemble; returns the run directory.

    Every parameter but ``output_dir``/``run_name`` is a section of
    :class:`ensemble_core.config.PipelineConfig`; re-using a run name resumes that run.
    Whatever the parameter schema cannot refuse (an unknown dataset, a batch larger than
    the split, a mesh that does not fit, a run directory in use) ends the run ``Failed``
    before any compute, with nothing written under ``output_dir`` and the state message
    ``error: ...; fix: ...``.
    """
    services = _outcome.PrefectServices()
    sections = dict(data=data, model=model, ensemble=ensemble, train=train, mesh=mesh, checkpoint=checkpoint)
    sections.update(eval=eval, promotion=promotion, distributed=distributed)
    run_name = run_name or default_run_name()
    try:
        # Through validate(): a value the parameter schema let through (a seed out of range)
        # is refused with the one-line message, as from the command line.
        config = validate({"seed": seed, **{k: v.model_dump(mode="json") for k, v in sections.items()}})
        result = runs.run(config, output_dir, run_name, STAGES)  # preflight first: refusals before any compute
    except PreemptedError as err:
        return _outcome.interrupted(err)
    except EnsembleError as err:
        return _outcome.refused(err)
    return services.outcome(str(result.run_dir.path))


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
    args = parse_args(argv)
    run_name = args.run_name or default_run_name()
    try:
        with _cli.raise_on_stop_signals():
            return _main(args, run_name)
    except _cli.stop_exceptions() as err:
        return _cli.stopped(err, f"rerun with --run-name {run_name} to resume")


def _main(args: argparse.Namespace, run_name: str) -> int:
    try:
        config = load_config(args.config, args.overrides)
    except EnsembleError as err:
        return report_error(err)
    down = _server.unreachable()
    if down:
        print(f"error: {down}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        dataset = runs.preflight(config, args.output_dir, run_name)
    except EnsembleError as err:
        return report_error(err)
    key = (config.model_dump_json(), str(args.output_dir), run_name)
    _PREFLIGHTED[key] = dataset
    try:
        return _outcome.run_cli(
            train_ensemble,
            **{name: getattr(config, name) for name in PipelineConfig.model_fields},
            output_dir=args.output_dir,
            run_name=run_name,
        )
    finally:
        _PREFLIGHTED.pop(key, None)  # used by the flow, or not at all (the server did not start)


if __name__ == "__main__":
    sys.exit(main())
