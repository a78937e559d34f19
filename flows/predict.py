"""The prediction flow: per-example ensemble probabilities and uncertainty.

    python -m flows.predict (--images FILE.npy | --tfds-name NAME [--tfds-split SPLIT])
                            [--run-dir RUN] [--output-dir DIR] [--output FILE.npz]

Uses the champion under ``--output-dir`` (default ``runs``) unless ``--run-dir`` names a
run. Writes ``ensemble_probs`` [N, C], ``predictive_entropy`` [N], ``mutual_information``
[N], ``member_probs`` [E, N, C] and ``predicted_class`` [N]; the last line printed is the
output path.
"""

# ruff: noqa: I001  (flows._env must be imported before anything that imports JAX)
from __future__ import annotations

from flows import _env  # noqa: F401  (must precede every JAX import)

import argparse
import sys
from pathlib import Path

from prefect import flow
from prefect.states import State

from ensemble_core import stopping
from ensemble_core.errors import EnsembleError, PreemptedError
from flows import _cli, _outcome, _server, _services
from tasks.predict import load_images, predict_images, resolve_run


@flow(name="predict", log_prints=True)
def predict(
    images_npy: str | None = None,
    tfds_name: str | None = None,
    tfds_split: str = "test",
    data_dir: str | None = None,
    run_dir: str | None = None,
    output_dir: str = "runs",
    output: str | None = None,
) -> str | State:
    """Predict with the champion (or ``run_dir``); returns the path of the ``.npz`` written.

    Args:
      images_npy: a ``.npy`` of uint8 ``[N, H, W, C]`` (or float in [0, 1]) images.
      tfds_name, tfds_split, data_dir: or a TFDS split instead.
      run_dir: a run directory; default: the champion under ``output_dir``.
      output: where to write; default ``<run_dir>/predictions-<input name>.npz``.
    """
    services = _services.PrefectServices()
    try:
        # SIGTERM/SIGINT stop prediction at its next batch (ensemble_core.stopping); the
        # output is written atomically, so nothing half-written is left.
        with stopping.stop_signals(), stopping.stage("prediction", "run the command again"):
            run = resolve_run(run_dir, output_dir)
            images = load_images(images_npy, tfds_name, tfds_split, data_dir)
            out = output or str(Path(run) / f"predictions-{Path(images).stem}.npz")
            path = predict_images(run, images, out)
    except PreemptedError as err:
        return _outcome.interrupted(err)
    except EnsembleError as err:  # bad input: Failed at once with the one-line message
        return _outcome.refused(err)
    return services.outcome(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.predict", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", help=".npy file of images [N, H, W, C]")
    source.add_argument("--tfds-name", help="TFDS dataset to predict on")
    parser.add_argument("--tfds-split", default="test")
    parser.add_argument("--data-dir", help="TFDS data dir")
    parser.add_argument("--run-dir", help="run directory (default: the champion)")
    parser.add_argument("--output-dir", default="runs", help="where the champion pointer lives (default: runs)")
    parser.add_argument("--output", help="output .npz path")
    args = parser.parse_args(argv)
    try:
        with _cli.raise_on_stop_signals():
            return _predict(args)
    except _cli.stop_exceptions() as err:
        return _cli.stopped(err, "run the command again")


def _predict(args: argparse.Namespace) -> int:
    from ensemble_core.runs.prediction import files as prediction

    down = _server.unreachable()  # as the training command line: the server first
    if down:
        print(f"error: {down}", file=sys.stderr)
        return _cli.EXIT_BAD_INPUT
    try:  # every refusal before Prefect starts: one line, exit 2
        prediction.preflight(args.images, args.tfds_name, args.run_dir, args.output_dir, args.output)
    except EnsembleError as err:
        return _cli.report_error(err)
    return _outcome.run_cli(
        predict,
        images_npy=args.images,
        tfds_name=args.tfds_name,
        tfds_split=args.tfds_split,
        data_dir=args.data_dir,
        run_dir=args.run_dir,
        output_dir=args.output_dir,
        output=args.output,
    )


if __name__ == "__main__":
    sys.exit(main())
