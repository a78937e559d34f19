"""The prediction flow: per-example ensemble probabilities and uncertainty.

    python -m flows.predict (--images PATH [PATH ...] | --tfds-name NAME [--tfds-split SPLIT])
                            [--run-dir RUN] [--output-dir DIR] [--output FILE.npz]
                            [--table FILE.csv|FILE.parquet]

``--images`` takes image files, folders (walked recursively), glob patterns (quoted), several
at once, or one ``.npy``/``.npz`` of images; image files are decoded as the run's training
decoded its images (ensemble_core.runs.prediction.inputs). Uses the champion under
``--output-dir`` (default ``runs``) unless ``--run-dir`` names a run. Writes
``ensemble_probs`` [N, C], ``predictive_entropy`` [N], ``mutual_information`` [N],
``member_probs`` [E, N, C] and ``predicted_class`` [N] to the ``.npz`` (default
``<run>/predictions-<input name>.npz``) and one row per image to the table (default: the
``.npz``'s path as ``.csv``). Prints the first rows, the summary, and, as the last line,
the ``.npz``'s path.
"""

# ruff: noqa: I001  (flows.environment must be imported before anything that imports JAX)
from __future__ import annotations

from flows import environment  # must precede every JAX import

import argparse
import sys
from pathlib import Path

from prefect import flow
from prefect.states import State

from ensemble_core import startup_gc
from ensemble_core import stopping
from ensemble_core.errors import DataError, EnsembleError, PreemptedError
from ensemble_core.runs.prediction.inputs import output_stem
from flows import command_line, run_outcome, server_check, prefect_services
from tasks.predict import load_images, predict_images, resolve_run


environment.quiet_tfds()  # TFDS is imported now (by ensemble_core): its progress bars off


@flow(name="predict", log_prints=True)
def predict(
    images_npy: str | None = None,
    tfds_name: str | None = None,
    tfds_split: str = "test",
    data_dir: str | None = None,
    run_dir: str | None = None,
    output_dir: str = "runs",
    output: str | None = None,
    images: list[str] | str | None = None,
    table: str | None = None,
) -> str | State:
    """Predict with the champion (or ``run_dir``); returns the path of the ``.npz`` written.

    Args:
      images_npy: a ``.npy`` of uint8 ``[N, H, W, C]`` (or float in [0, 1]) images (the
        older parameter; ``images`` takes it too).
      images: image files, folders (recursive), glob patterns, or one ``.npy``/``.npz``;
        one path or a list of them.
      tfds_name, tfds_split, data_dir: or a TFDS split instead.
      run_dir: a run directory; default: the champion under ``output_dir``.
      output: where to write; default ``<run_dir>/predictions-<input name>.npz``.
      table: the per-image table (``.csv``, or ``.parquet``); default ``output`` as ``.csv``.
    """
    startup_gc.resume()  # a deployment's flow-run process: its imports are done (flows/__init__.py)
    services = prefect_services.PrefectServices()
    prefect_services.send_held_logs()  # what the command line's preflight logged (decoding the inputs)
    try:
        # SIGTERM/SIGINT stop prediction at its next batch (ensemble_core.stopping); the
        # output is written atomically, so nothing half-written is left.
        with stopping.stop_signals(), stopping.stage("prediction", "run the command again"):
            if images and images_npy:
                raise DataError("both images and images_npy given", fix="pass the inputs as images only")
            raws = [images] if isinstance(images, str) else list(images or ([images_npy] if images_npy else []))
            run = resolve_run(run_dir, output_dir)
            paths = load_images(raws, tfds_name, tfds_split, data_dir)
            out = output or str(Path(run) / f"predictions-{output_stem(raws, tfds_name, tfds_split)}.npz")
            path = predict_images(run, paths, out, table)
    except PreemptedError as err:
        return run_outcome.interrupted(err)
    except EnsembleError as err:  # bad input: Failed at once with the one-line message
        return run_outcome.refused(err)
    return services.outcome(path)


def main(argv: list[str] | None = None) -> int:
    command_line.command_started()
    parser = argparse.ArgumentParser(prog="python -m flows.predict", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--images",
        nargs="+",
        metavar="PATH",
        help="image files, folders (recursive), glob patterns (quoted) or one .npy/.npz of images [N, H, W, C]",
    )
    source.add_argument("--tfds-name", help="TFDS dataset to predict on")
    parser.add_argument("--tfds-split", default="test")
    parser.add_argument("--data-dir", help="TFDS data dir")
    parser.add_argument("--run-dir", help="run directory (default: the champion)")
    parser.add_argument("--output-dir", default="runs", help="where the champion pointer lives (default: runs)")
    parser.add_argument("--output", help="output .npz path")
    parser.add_argument("--table", help="per-image table: .csv (default: the .npz path as .csv) or .parquet")
    args = parser.parse_args(argv)
    try:
        with command_line.raise_on_stop_signals():
            return _predict(args)
    except command_line.stop_exceptions() as err:
        return command_line.stopped(err, "run the command again")


def _predict(args: argparse.Namespace) -> int:
    from ensemble_core.runs.prediction import files as prediction
    from ensemble_core.runs.prediction import table as table_lib

    down = server_check.unreachable()  # as the training command line: the server first
    if down:
        print(f"error: {down}", file=sys.stderr)
        return command_line.EXIT_BAD_INPUT
    try:  # every refusal before Prefect starts: one line, exit 2; its logs go to the flow run
        with prefect_services.logs_held_for_next_run():
            npz, table = prediction.preflight(
                args.images, args.tfds_name, args.run_dir, args.output_dir, args.output, args.table, args.tfds_split
            )
    except EnsembleError as err:
        prefect_services.discard_held_logs()
        return command_line.report_error(err)

    def closing(_: str) -> list[str]:  # the first rows and the summary, before the path
        rows = table_lib.read_table(table)
        return [*table_lib.render(rows), *table_lib.skipped_lines(rows), f"table: {table}"]

    return run_outcome.run_cli(
        predict,
        closing,
        images=args.images,
        tfds_name=args.tfds_name,
        tfds_split=args.tfds_split,
        data_dir=args.data_dir,
        run_dir=args.run_dir,
        output_dir=args.output_dir,
        output=str(npz),
        table=str(table),
    )


if __name__ == "__main__":
    command_line.end(main())
