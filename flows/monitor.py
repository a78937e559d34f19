"""The monitoring flow: how tonight's unlabelled data is served by the champion.

    python -m flows.monitor --images PATH [PATH ...] [--output-dir DIR] [--run-dir RUN]
                            [--alpha 0.05] [--estimator auto] [--night NAME]

``--images`` takes what ``flows.predict`` takes (image files, folders with or without class
folders, glob patterns, or one ``.npy``/``.npz`` of images), decoded as the run's training
decoded its images. The champion under ``--output-dir`` (default ``runs``), or
``--run-dir``, scores them; the night is recorded under ``<output-dir>/monitoring/``: the
estimated accuracy (``--estimator``; ``auto``: the members' disagreement), the drift tests'
p-values against the run's calibration split (Holm, ``--alpha``), the abstention rate and
mean prediction-set size, the class frequencies, and the history across nights
(``history.jsonl``, ``history.png``). Publishes the artifacts ``monitoring-night`` and
``monitoring-history`` and the events ``ensemble.monitored`` and, on drift, ``data.drift``
(the ``retrain-on-drift`` automation turns it into a ``train-ensemble`` run). Prints the
night's summary and, as the last line, the path of the night's record (``<night>.json``).
Drift is a finding, not an error: the exit code is 0 either way.
"""

# ruff: noqa: I001  (flows.environment must be imported before anything that imports JAX)
from __future__ import annotations

from flows import environment  # must precede every JAX import

import argparse
import json
import sys

from prefect import flow
from prefect.states import State

from ensemble_core import startup_gc
from ensemble_core import stopping
from ensemble_core.errors import EnsembleError, PreemptedError
from ensemble_core.runs.monitoring import drop
from flows import command_line, run_outcome, server_check, prefect_services
from tasks.monitor import plan_night, publish_night, score_drop


environment.quiet_tfds()  # TFDS is imported now (by ensemble_core): its progress bars off


@flow(name="monitor", log_prints=True)
def monitor(
    images: list[str] | str | None = None,
    output_dir: str = "runs",
    run_dir: str | None = None,
    alpha: float = drop.DEFAULT_ALPHA,
    estimator: str = drop.AUTO,
    night: str | None = None,
) -> str | State:
    """Score an unlabelled drop with the champion (or ``run_dir``) and record the night;
    returns the path of the night's record (``<output_dir>/monitoring/<night>.json``).

    Args:
      images: image files, folders (recursive; class folders are not read as labels),
        glob patterns, or one ``.npy``/``.npz`` of images; one path or a list.
      output_dir: where the champion and the monitoring history live.
      run_dir: a run directory instead of the champion.
      alpha: the drift tests' family-wise error rate, in (0, 1) (Holm's correction).
      estimator: ``auto`` or one of ``ensemble_core.accuracy_estimation.ESTIMATORS``.
      night: the night's id (file names); default ``<UTC time>-<inputs' name>``.
    """
    startup_gc.resume()  # a deployment's flow-run process: its imports are done (flows/__init__.py)
    services = prefect_services.PrefectServices()
    prefect_services.send_held_logs()  # what the command line's preflight logged (decoding the inputs)
    try:
        with stopping.stop_signals(), stopping.stage("monitoring", "run the command again"):
            raws = [images] if isinstance(images, str) else list(images or [])
            plan = plan_night(raws, run_dir, output_dir, alpha, estimator, night)
            record = score_drop(plan, raws, alpha, estimator)
            publish_night(record, plan)
    except PreemptedError as err:
        return run_outcome.interrupted(err)
    except EnsembleError as err:  # bad input: Failed at once with the one-line message
        return run_outcome.refused(err)
    return services.outcome(str(plan.record))


def main(argv: list[str] | None = None) -> int:
    command_line.command_started()
    parser = argparse.ArgumentParser(prog="python -m flows.monitor", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--images",
        nargs="+",
        required=True,
        metavar="PATH",
        help="image files, folders (recursive), glob patterns (quoted) or one .npy/.npz of images [N, H, W, C]",
    )
    parser.add_argument("--output-dir", default="runs", help="where the champion and the history live (default: runs)")
    parser.add_argument("--run-dir", help="run directory (default: the champion)")
    parser.add_argument("--alpha", type=float, default=drop.DEFAULT_ALPHA, help="drift tests' error rate (0.05)")
    parser.add_argument("--estimator", default=drop.AUTO, choices=drop.ESTIMATOR_CHOICES, help="headline estimator")
    parser.add_argument("--night", help="the night's name (default: the UTC time and the inputs' name)")
    args = parser.parse_args(argv)
    try:
        with command_line.raise_on_stop_signals():
            return _monitor(args)
    except command_line.stop_exceptions() as err:
        return command_line.stopped(err, "run the command again")


def _monitor(args: argparse.Namespace) -> int:
    from ensemble_core.runs.monitoring import monitor as monitoring

    down = server_check.unreachable()  # as the other command lines: the server first
    if down:
        print(f"error: {down}", file=sys.stderr)
        return command_line.EXIT_BAD_INPUT
    try:  # every refusal before Prefect starts: one line, exit 2; its logs go to the flow run
        with prefect_services.logs_held_for_next_run():
            plan = monitoring.preflight(
                args.images, args.run_dir, args.output_dir, args.alpha, args.estimator, args.night
            )
    except EnsembleError as err:
        prefect_services.discard_held_logs()
        return command_line.report_error(err)

    def closing(path: str) -> list[str]:  # the night's summary, before the path
        with open(path, encoding="utf-8") as f:
            return drop.summary_lines(json.load(f))

    return run_outcome.run_cli(
        monitor,
        closing,
        images=args.images,
        output_dir=args.output_dir,
        run_dir=args.run_dir,
        alpha=args.alpha,
        estimator=args.estimator,
        night=plan.night,
    )


if __name__ == "__main__":
    command_line.end(main())
