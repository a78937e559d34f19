"""Where a run's files live: the paths of a run and an output directory, and the checks of
an output directory and a run name.

A run directory ``<output_dir>/<run_name>/``::

    .lock                    advisory lock of the process training in it (lock.py)
    checkpoints/<step>/      orbax checkpoints, named by global optimizer step (checkpoint.py);
                             with member groups, the gathered ensemble's final checkpoint
    groups/<g>/              member group g's own run directory (its .lock, checkpoints/)
    corrupt-checkpoints/     unreadable steps set aside on resume
    predictions.npz          the test evaluator's member probabilities (evaluation/evaluate.py)
    selection.json           the members and temperature the select stage chose (records.py)
    decisions.json, drift_reference.json, accuracy_reference.json
                             what the select stage fitted on the calibration split: the
                             prediction sets and abstention, the drift tests' reference, the
                             label-free accuracy estimators (records.py)
    stratified/              a hyper-deep ensemble's stratified pool: plan.json and a run
                             directory's .lock, checkpoints/, groups/
    eval/<evaluator>.npz     every other evaluator's arrays
    data_snapshot.json       the data snapshot it trains on (written before training)
    report.json, report.md   the report (report/write.py)
    plots/*.png
    processes/process-<p>.log  JAX process p's stderr, with distributed.num_processes > 1
                             (training/launcher.py)

The output directory ``<output_dir>/`` also holds the champion state (champion_record.py):
``champion.json``, ``history.jsonl``, ``corrupt-state/`` and ``.champion-state.lock``, and
what the monitor flow recorded of unlabelled drops, ``monitoring/`` (runs/monitoring/).

Every file the run layer writes goes through :func:`ensemble_core.atomic.atomic_write`: a synced temporary
file in the same directory, then ``os.replace``, so a reader sees the old file or the
new one, never a half-written one, whatever kills the writer. The one exception is
the process logs, which their process writes as it goes (a log must survive the crash
it explains).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from ensemble_core.errors import ConfigError
from ensemble_core.special_files import special_kind

RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CHAMPION_FILE = "champion.json"
HISTORY_FILE = "history.jsonl"
CORRUPT_STATE_DIR = "corrupt-state"
MONITORING_DIR = "monitoring"
#: The names the output directory uses for itself (besides dot files, which a run name
#: cannot start with): no run may be named so (compared without case, as on macOS).
RESERVED_NAMES = (CHAMPION_FILE, HISTORY_FILE, CORRUPT_STATE_DIR, MONITORING_DIR)


@dataclasses.dataclass(frozen=True)
class RunDir:
    """Every path of one run directory (nothing is created by naming it)."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def lock(self) -> Path:
        return self.path / ".lock"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def stop_request(self) -> Path:
        """``.stop-request``: a stop of the run's process relayed to its member groups in
        other processes (:func:`ensemble_core.stopping.relay_to_file`)."""
        return self.path / ".stop-request"

    @property
    def groups_dir(self) -> Path:
        """``groups/``: the member groups' own run directories."""
        return self.path / "groups"

    def group(self, g: int) -> RunDir:
        """Member group ``g``'s own run directory ``groups/<g>/`` (its lock and checkpoints)."""
        return RunDir(self.groups_dir / str(g))

    def existing_groups(self) -> list[RunDir]:
        """The member-group directories ``groups/<g>/`` that exist, in group order."""
        if not self.groups_dir.is_dir():
            return []
        return [
            RunDir(d)
            for d in sorted((d for d in self.groups_dir.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
        ]

    @property
    def stratified(self) -> RunDir:
        """``stratified/``: a hyper-deep ensemble's stratified pool, a run directory of its
        own (lock, checkpoints, member groups) plus ``plan.json`` (:mod:`ensemble_core.runs.ensemble.pool`)."""
        return RunDir(self.path / "stratified")

    @property
    def processes_dir(self) -> Path:
        """``processes/``: the logs of the JAX processes of one program (``num_processes > 1``)."""
        return self.path / "processes"

    def process_log(self, p: int) -> Path:
        """JAX process ``p``'s log ``processes/process-<p>.log``: its stderr, appended to
        by each training session (each opens with a ``== session ...`` line), kept after
        the run so that a failure's explanation survives the launcher's one-line error."""
        return self.processes_dir / f"process-{p}.log"

    @property
    def corrupt_checkpoints(self) -> Path:
        return self.path / "corrupt-checkpoints"

    @property
    def predictions(self) -> Path:
        return self.path / "predictions.npz"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    def evaluator_arrays(self, name: str) -> Path:
        """Where evaluator ``name`` keeps its arrays: ``predictions.npz`` for ``test``
        (the file every earlier release wrote), ``eval/<name>.npz`` for the others."""
        return self.predictions if name == "test" else self.eval_dir / f"{name}.npz"

    @property
    def selection_json(self) -> Path:
        """The members evaluation chose and the fitted temperature (what prediction uses)."""
        return self.path / "selection.json"

    @property
    def drift_reference_json(self) -> Path:
        """The chosen ensemble's uncertainty on the calibration split (per-example entropy,
        mutual information, predicted-class counts): the reference of later drift tests."""
        return self.path / "drift_reference.json"

    @property
    def accuracy_reference_json(self) -> Path:
        """What the label-free accuracy estimators fitted on the calibration split
        (:class:`ensemble_core.accuracy_estimation.Reference`): what monitoring estimates with."""
        return self.path / "accuracy_reference.json"

    @property
    def decisions_json(self) -> Path:
        """The ensemble's prediction sets and abstention threshold, fitted on the calibration
        split by the select stage (what prediction applies)."""
        return self.path / "decisions.json"

    @property
    def report_json(self) -> Path:
        return self.path / "report.json"

    @property
    def data_snapshot(self) -> Path:
        """The data snapshot the run trains on (:class:`ensemble_core.data.DataSnapshot`
        as JSON), written before training starts: what retention keeps for it."""
        return self.path / "data_snapshot.json"

    @property
    def report_md(self) -> Path:
        return self.path / "report.md"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    def has_checkpoint(self) -> bool:
        """Whether a finished checkpoint step (a digit-named directory) is present."""
        return self.checkpoints.is_dir() and any(p.name.isdigit() for p in self.checkpoints.iterdir())


def owning_run(path: str | Path) -> RunDir:
    """The run a training directory belongs to, the one a user reruns by its name: ``path``
    itself; for a member group (``<run>/groups/<g>/``) and for a hyper-deep ensemble's
    stratified pool (``<run>/stratified/``, which holds ``plan.json``, and its groups),
    ``<run>``. A run the user named ``stratified`` holds no ``plan.json`` and is itself."""
    here = Path(path)
    if here.parent.name == "groups" and here.name.isdigit():
        here = here.parent.parent
    if here.name == "stratified" and (here / "plan.json").is_file() and RunDir(here.parent).stratified.path == here:
        here = here.parent
    return RunDir(here)


@dataclasses.dataclass(frozen=True)
class OutputDir:
    """The parent of run directories, holding the champion state shared by its runs."""

    path: Path

    def run(self, run_name: str) -> RunDir:
        return RunDir(self.path / run_name)

    @property
    def champion(self) -> Path:
        return self.path / CHAMPION_FILE

    @property
    def history(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def corrupt_state(self) -> Path:
        return self.path / CORRUPT_STATE_DIR

    @property
    def champion_lock(self) -> Path:
        return self.path / ".champion-state.lock"

    @property
    def monitoring(self) -> Path:
        """``monitoring/``: what the monitor flow recorded of each unlabelled drop
        (:mod:`ensemble_core.runs.monitoring`): ``history.jsonl``, ``history.png``, and
        ``<night>.json`` / ``<night>.md`` per drop."""
        return self.path / MONITORING_DIR


# MARK: checks of the places a run writes to


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what a later mkdir would create in)."""
    while not path.exists():
        path = path.parent
    return path


def check_output_dir(output_dir: str | Path) -> Path:
    """Check that ``output_dir`` is, or can be created as, a writable directory; creates
    nothing (the run creates it when it starts writing).

    Raises:
      ConfigError: its path has a control character, it is not a directory, or it (or the
        directory it would be created in) is not writable.
    """
    out = Path(output_dir)
    if any(ord(c) < 32 or ord(c) == 127 for c in str(output_dir)):
        raise ConfigError(
            f"output directory {str(output_dir)!r} has a control character (a newline, a tab, ...): the run "
            "directory, the command's last line, would not be one line",
            fix="pass an output directory without control characters",
        )
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"output directory '{out}' is a file", fix="pass a directory to output_dir")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ConfigError(f"output directory '{out}' is not writable", fix="pass a writable output_dir")
        return out
    parent = nearest_existing(out.absolute().parent)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        what = "is a file" if not parent.is_dir() else "is not writable"
        raise ConfigError(
            f"cannot create output directory '{out}': '{parent}' {what}", fix="pass a writable output_dir"
        )
    return out


def check_run_name(run_name: str, output_dir: str | Path = ".") -> str:
    """A run name is one directory name of letters, digits, '.', '_' and '-' (starting with
    a letter or digit) that the file system of ``output_dir`` can hold: so the run
    directory, printed as the CLI's last line, is one unambiguous path.

    Raises:
      ConfigError: empty, another character (a path separator, a space, a newline, ...),
        one of the output directory's own names (:data:`RESERVED_NAMES`), or longer than
        the file system's NAME_MAX (255 bytes on Linux file systems).
    """
    if not isinstance(run_name, str) or not RUN_NAME_PATTERN.fullmatch(run_name):
        raise ConfigError(
            f"run name {run_name!r} is not a single directory name",
            fix="use letters, digits, '-', '_' or '.', starting with a letter or digit",
        )
    if run_name.lower() in RESERVED_NAMES:
        raise ConfigError(
            f"run name {run_name!r} is a name the output directory uses for itself ({', '.join(RESERVED_NAMES)})",
            fix="choose another run name",
        )
    parent = nearest_existing(Path(output_dir).absolute())
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(run_name.encode()) > name_max:
        raise ConfigError(
            f"run name is {len(run_name.encode())} bytes, longer than the {name_max} the file system of "
            f"'{parent}' allows",
            fix="use a shorter run_name",
        )
    return run_name


def run_dir_for(output_dir: str | Path, run_name: str) -> RunDir:
    """The checked :class:`RunDir` of ``run_name`` under ``output_dir`` (creates nothing).

    Raises:
      ConfigError: see :func:`check_output_dir` and :func:`check_run_name`; or something
        other than a directory (a file, a link to one, a FIFO) already has the run's path
        in the output directory (a run directory is created there, or resumed).
    """
    run = RunDir(check_output_dir(output_dir) / check_run_name(run_name, output_dir))
    if (run.path.exists() or run.path.is_symlink()) and not run.path.is_dir():
        kind = "a link" if run.path.is_symlink() else special_kind(run.path) or "a file"
        raise ConfigError(
            f"'{run.path}' is {kind}, not a run directory: the run name {run_name!r} is taken in the output directory",
            fix="choose another run name, or move that file",
        )
    return run
