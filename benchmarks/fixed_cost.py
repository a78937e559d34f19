"""The fixed cost of a command line: the tiny config's ``python -m flows.train_ensemble``,
start to exit, for two checkouts side by side.

    git worktree add /tmp/before <commit>
    python -m benchmarks.fixed_cost --checkout before=/tmp/before --checkout after=. [--runs 5]
    python -m benchmarks.fixed_cost --checkout figures=. --checkout none=. --set figures:eval.plots=true

``--deployment`` measures the run as a deployment's flow-run process instead: for each
checkout a deployment of ``flows/train_ensemble.py:train_ensemble`` (its path the checkout)
on one warm server (``prefect server start``, as for ``--server``), then per run a flow
run of it with the config as its ``config`` parameter, executed as Prefect's process worker
executes one, ``python -m prefect.engine <flow run id>`` in the checkout, process start to
exit (the worker's own polling is left out: it is the same for both).

``--config PATH`` measures another config's command line the same way (e.g.
``configs/default.yaml``, the default run). ``--set LABEL:KEY=VALUE`` adds ``--set
KEY=VALUE`` to that checkout's command line (the same checkout twice, under two labels,
measures one setting's cost). ``--server LABEL`` runs that
checkout's commands against one Prefect server started before them and kept running
(``prefect server start``, its own PREFECT_HOME; its start is not counted) instead of each
command's temporary server: a server kept warm between commands against the temporary one,

    python -m benchmarks.fixed_cost --checkout temporary=. --checkout warm=. --server warm

Runs the training command line on ``configs/tiny.yaml`` (the embedded digits, its
temporary Prefect server, every default evaluator) from each checkout in turn, A B A B ...
after one warm-up run of each (the dataset, the derived sets and JAX's persistent
compilation cache are then warm, as a user's second run finds them), each in a fresh
output directory, with no ``PREFECT_API_URL`` (the temporary server is part of the cost).
Timed from outside the process (``time.monotonic`` around ``subprocess.run``). Records each
run's wall seconds, the median per checkout and the per-pair ratio (second checkout over
the first: the machine's drift cancels within a pair), and, where the checkout writes it,
the run's ``report.json -> timing`` (``command start``, ``flow engine``, ``command end`` and
the run's stages). The 1-minute load average before each run is kept: other jobs on the
cores slow it.

Also ``plot``: one evaluator-like figure (three panels of nine curves, 15x4 inches, 100
dpi) laid out and saved as PNG at zlib level 6 (Pillow's default) and at level 1
(``ensemble_core.plotting.save``'s), the median of ``--plot-repeats`` saves each, and
the files' bytes.

Writes ``benchmarks/results/fixed-cost-<cpus>core.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.process_cpu import children_cpu_seconds
from benchmarks.provenance import stamp

ROOT = Path(__file__).resolve().parents[1]


#: The config measured unless ``--config`` names another.
TINY = "configs/tiny.yaml"
#: The flow a ``--deployment`` run executes (prefect.yaml's training deployments).
ENTRYPOINT = "flows/train_ensemble.py:train_ensemble"


def one_run(
    checkout: Path,
    out: Path,
    home: Path,
    sets: tuple[str, ...] | list[str] = (),
    api_url: str | None = None,
    config: str = TINY,
) -> dict:
    """The command line of ``config`` (a path relative to the checkout; default the tiny
    config) from ``checkout`` (with ``--set`` each of ``sets``; against the server at
    ``api_url``, else its own temporary one): its wall seconds (outside) and timing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(checkout))
    if api_url:
        env["PREFECT_API_URL"] = api_url
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--config", config]
    cmd += ["--output-dir", str(out), "--run-name", "r", *(a for s in sets for a in ("--set", s))]
    return timed_command(cmd, checkout, env, out / "r")


def timed_command(cmd: list[str], checkout: Path, env: dict[str, str], run_dir: Path | None = None) -> dict:
    """``cmd`` run in ``checkout``: its wall seconds (outside), CPU seconds (its process and
    the children it reaped), the 1-minute load average before it, and, with ``run_dir``,
    that run's ``report.json -> timing``.

    Raises:
      SystemExit: the command failed (the tail of its stderr in the message)."""
    load = os.getloadavg()[0]
    cpu0 = children_cpu_seconds()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} in {checkout} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    cpu = children_cpu_seconds() - cpu0
    row = {"wall_seconds": wall, "cpu_seconds": cpu, "load_average_1min_before": load}
    if run_dir is not None:
        row["timing"] = json.loads((run_dir / "report.json").read_text()).get("timing")
    return row


def deployment(checkout: Path, api_url: str, label: str) -> str:
    """A deployment of the training flow from ``checkout`` (its entrypoint's path) on the
    server at ``api_url``; returns its id."""
    flow_id = post_json(api_url, "/flows/", {"name": "train-ensemble"})["id"]
    body = {"name": f"fixed-cost-{label}", "flow_id": flow_id, "entrypoint": ENTRYPOINT, "path": str(checkout)}
    return post_json(api_url, "/deployments/", body)["id"]


def post_json(api_url: str, path: str, body: dict, tries: int = 10) -> dict:
    """POST ``body`` to the server's ``path``; its JSON answer. A 503 (a server just started,
    its SQLite database busy) is tried again, a second apart, up to ``tries`` times.

    Raises:
      httpx.HTTPStatusError: any other error status, or 503 every time."""
    import httpx

    with httpx.Client(base_url=api_url, timeout=60) as api:
        for _ in range(tries - 1):
            answer = api.post(path, json=body)
            if answer.status_code != 503:
                break
            time.sleep(1)
        else:
            answer = api.post(path, json=body)
        return answer.raise_for_status().json()


def one_flow_run(
    checkout: Path,
    out: Path,
    home: Path,
    sets: tuple[str, ...] | list[str],
    api_url: str,
    deployment_id: str,
    config: str,
) -> dict:
    """A flow run of ``deployment_id`` with ``config`` (a path relative to the checkout, with
    each of ``sets`` applied as the command line's ``--set`` applies it:
    :func:`ensemble_core.config.load_config` of this environment) as its ``config``
    parameter, executed as the process worker executes one (``python -m prefect.engine
    <id>`` in ``checkout``): as :func:`timed_command`.

    Raises:
      ConfigError: the config or an override is invalid."""
    from ensemble_core.config import load_config

    parameters = load_config(checkout / config, list(sets)).model_dump(mode="json")
    body = {"parameters": {"config": parameters, "output_dir": str(out), "run_name": "r"}}
    run = post_json(api_url, f"/deployments/{deployment_id}/create_flow_run", body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    env.update(PREFECT_HOME=str(home), PREFECT_API_URL=api_url, PREFECT__FLOW_RUN_ID=run["id"])
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(checkout))
    return timed_command([sys.executable, "-m", "prefect.engine"], checkout, env, out / "r")


@contextlib.contextmanager
def warm_server(home: Path) -> Iterator[str]:
    """A Prefect server as a user keeps one running between commands (``prefect server start``,
    Prefect's defaults, no UI) on PREFECT_HOME ``home``: yields its API URL once it answers,
    stops it after. Its start is not part of any command's time.

    Raises:
      RuntimeError: it exited, or did not answer within ``tests.prefect_api.STARTUP_TIMEOUT_S``
        (the tail of its log in the message)."""
    from ensemble_core.processutil import free_port
    from tests.prefect_api import wait_healthy

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    home.mkdir(parents=True, exist_ok=True)
    log = home / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(url, server, log)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def parse_checkouts(values: list[str]) -> list[tuple[str, Path]]:
    """``--checkout LABEL=DIR`` twice as ``[(label, resolved dir), ...]``.

    Raises:
      ValueError: not two ``LABEL=DIR``, or the same label twice (the one-line message)."""
    if len(values) != 2 or any("=" not in v for v in values):
        raise ValueError(
            "error: give two --checkout LABEL=DIR; fix: e.g. --checkout before=/tmp/before --checkout after=."
        )
    checkouts = [(v.split("=", 1)[0], Path(v.split("=", 1)[1]).resolve()) for v in values]
    if checkouts[0][0] == checkouts[1][0]:
        raise ValueError("error: the two --checkout labels are the same; fix: give each its own label")
    return checkouts


def alternate(
    checkouts: list[tuple[str, Path]], runs: int, measure: Callable[[str, Path, int], dict]
) -> dict[str, list[dict]]:
    """``measure(label, checkout, round)`` for each checkout in turn, A B A B ..., ``runs + 1``
    rounds: the first warms both up (the dataset, the caches) and is not kept. Each run's
    wall and CPU seconds are printed to stderr. Returns each label's kept rows, in order."""
    kept: dict[str, list[dict]] = {label: [] for label, _ in checkouts}
    for i in range(runs + 1):
        for label, checkout in checkouts:
            r = measure(label, checkout, i)
            print(f"{label} run {i}: {r['wall_seconds']:.2f} s, {r['cpu_seconds']:.2f} CPU s", file=sys.stderr)
            if i:
                kept[label].append(r)
    return kept


def paired(runs: dict[str, list[dict]], first: str, second: str) -> dict:
    """The summary of A B pairs (``runs[first][i]`` and ``runs[second][i]``, each with
    ``wall_seconds`` and ``cpu_seconds``): per label the median wall and CPU seconds, each
    pair's wall ratio (second over first: the machine's drift cancels within a pair) and
    their median."""
    ratios = [b["wall_seconds"] / a["wall_seconds"] for a, b in zip(runs[first], runs[second], strict=True)]
    return {
        "median_wall_seconds": {label: statistics.median(r["wall_seconds"] for r in rs) for label, rs in runs.items()},
        "median_cpu_seconds": {label: statistics.median(r["cpu_seconds"] for r in rs) for label, rs in runs.items()},
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def checkout_commit(checkout: Path) -> str:
    """The commit checked out in ``checkout`` (short hash), or its directory's name."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return proc.stdout.strip() or checkout.name


def plot_save(repeats: int) -> dict:
    """Seconds (median) and bytes of saving one figure at zlib levels 6 and 1."""
    import io

    import numpy as np

    from ensemble_core.plotting import subplots

    out = {}
    rng = np.random.default_rng(0)
    for level in (6, 1):
        seconds, size = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            fig, axes = subplots(1, 3, figsize=(15, 4))
            for ax in axes:
                for k in range(9):
                    ax.plot(np.arange(13) * 15, rng.random(13), label=f"member {k}")
                ax.legend()
                ax.set_title("accuracy against angle")
            fig.tight_layout()
            png = io.BytesIO()
            fig.savefig(png, dpi=100, format="png", pil_kwargs={"compress_level": level})
            fig.clf()
            seconds.append(time.perf_counter() - t0)
            size = len(png.getvalue())
        out[f"zlib_level_{level}"] = {"seconds": statistics.median(seconds), "bytes": size}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fixed_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", required=True, metavar="LABEL=DIR", help="two, in order")
    parser.add_argument(
        "--set", action="append", default=[], metavar="LABEL:KEY=VALUE", help="an override for one checkout's runs"
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="LABEL",
        help="run LABEL's commands against one Prefect server started before them and kept warm "
        "(prefect server start) instead of each command's temporary server",
    )
    parser.add_argument(
        "--deployment",
        action="store_true",
        help="each run a deployment's flow run (python -m prefect.engine) on one warm server per checkout",
    )
    parser.add_argument("--config", default=TINY, help=f"the config, relative to each checkout (default {TINY})")
    parser.add_argument("--runs", type=int, default=5, help="counted runs of each (default 5, after one warm-up)")
    parser.add_argument("--plot-repeats", type=int, default=9, help="saves of the figure per zlib level (default 9)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"fixed-cost-{os.cpu_count()}core.json"))
    args = parser.parse_args(argv)
    try:
        checkouts = parse_checkouts(args.checkout)
    except ValueError as err:
        print(err)
        return 2
    sets: dict[str, list[str]] = {label: [] for label, _ in checkouts}
    for s in args.set:
        label, _, override = s.partition(":")
        if label not in sets or "=" not in override:
            print(f"error: --set {s}: not LABEL:KEY=VALUE of a --checkout label; fix: e.g. --set after:eval.plots=true")
            return 2
        sets[label].append(override)
    unknown = [label for label in args.server if label not in sets]
    if unknown:
        print(f"error: --server {unknown[0]}: not a --checkout label; fix: e.g. --server after")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="fixed-cost-"))
    warm = sorted({label for label, _ in checkouts} if args.deployment else set(args.server))
    with contextlib.ExitStack() as servers:
        api = {label: servers.enter_context(warm_server(tmp / f"prefect-{label}")) for label in warm}
        deployments = {label: deployment(c, api[label], label) for label, c in checkouts} if args.deployment else {}

        def measure(label: str, checkout: Path, i: int) -> dict:
            home, out = tmp / f"prefect-{label}", tmp / f"{label}-{i}"
            if args.deployment:
                return one_flow_run(checkout, out, home, sets[label], api[label], deployments[label], args.config)
            return one_run(checkout, out, home, sets[label], api.get(label), args.config)

        runs = alternate(checkouts, args.runs, measure)
    result = {
        "command": "python -m benchmarks.fixed_cost "
        + " ".join(f"--checkout {label}=<checkout of {checkout_commit(path)}>" for label, path in checkouts)
        + "".join(f" --set {label}:{s}" for label, ss in sets.items() for s in ss)
        + "".join(f" --server {label}" for label in args.server)
        + (" --deployment" if args.deployment else "")
        + (f" --config {args.config}" if args.config != TINY else ""),
        **stamp(),
        "what": (
            f"a deployment's flow run of {args.config} (python -m prefect.engine), start to exit, warm caches"
            if args.deployment
            else f"python -m flows.train_ensemble --config {args.config}, start to exit, warm caches"
        ),
        "checkouts": {label: checkout_commit(path) for label, path in checkouts},
        "sets": sets,
        "warm_server": warm,
        **paired(runs, checkouts[0][0], checkouts[1][0]),
        "runs": runs,
        "plot": plot_save(args.plot_repeats),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_wall_seconds", "median_cpu_seconds", "ratio_median", "plot")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
