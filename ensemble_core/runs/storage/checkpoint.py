"""orbax checkpoints of the ensemble state, with the run's metadata saved beside it as JSON.

Layout (orbax ``CheckpointManager``): ``<run>/checkpoints/<step>/{state,meta}/``, where
the step number is the global optimizer step. ``state`` is the struct-of-arrays
:class:`~ensemble_core.train.EnsembleState` (``StandardSave``); ``meta`` is JSON with the
config, the epoch, the data position and the training history so far. Saves are
asynchronous; :meth:`EnsembleCheckpointer.close` waits for them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import flax.struct
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from ensemble_core import diskspace
from ensemble_core.errors import CheckpointError, EnsembleError, IncompatibleRunError
from ensemble_core.runs.storage import orbax_logs  # noqa: F401  (installed on import: failed saves in one line)
from ensemble_core.runs.storage.layout import RunDir

if TYPE_CHECKING:
    from ensemble_core.config import PipelineConfig
    from ensemble_core.data import DatasetInfo
    from ensemble_core.train import DataPosition


#: The layout of the saved :class:`~ensemble_core.train.EnsembleState`: 2 since members
#: carry their mutable collections (``model_state``, e.g. BatchNorm's ``batch_stats``);
#: checkpoints without the key are format 1 (params-only members) and are restored by
#: :meth:`EnsembleCheckpointer.restore` with empty collections.
STATE_FORMAT = 2
#: How often a reader lists a run's checkpoints again when a step vanished while it listed
#: them (the run's writer removed an old step meanwhile).
READER_ATTEMPTS = 10
_T = TypeVar("_T")

#: Free space a checkpoint save needs beyond its arrays and metadata (orbax's own small
#: files: commit markers, metadata, the OCDBT manifest).
SAVE_MARGIN_BYTES = 256 * 1024
# A failed save's temporary directory is removed until none has reappeared for
# CLEANUP_QUIET_S (at most CLEANUP_S): writes already handed to tensorstore can land after orbax reports
# the failure, and recreate what was removed (one CI run in about 25 under load).
CLEANUP_QUIET_S = 0.5
CLEANUP_S = 10.0


def dataset_record(dataset: DatasetInfo) -> dict:
    """The dataset as a checkpoint's metadata records it: ``name``, ``num_classes``,
    ``image_shape`` (``[H, W, C]``) and ``class_names`` (the run's class map, what
    prediction names its classes by; ``[]`` when the dataset has none)."""
    return {
        "name": dataset.name,
        "num_classes": dataset.num_classes,
        "image_shape": list(dataset.image_shape),
        "class_names": list(dataset.class_names or ()),
    }


def training_sessions(meta: dict) -> list[dict]:
    """The training sessions recorded in checkpoint metadata ``meta`` (a copy): the key is
    ``sessions``; checkpoints of the previous release call it ``stretches``, read until the
    next release."""
    return [dict(s) for s in meta.get("sessions") or meta.get("stretches") or []]


def checkpoint_meta(
    cfg: PipelineConfig,
    *,
    step: int,
    position: DataPosition,
    members_trained: int,
    healthy: list[bool],
    dataset: dict,
    history: list[dict],
    sessions: list[dict],
    gathered_from: list[str] | None = None,
) -> dict:
    """The JSON metadata saved beside every checkpoint's state (the one schema; resume,
    evaluation and gathering read it).

    Args:
      step: the global optimizer step (the checkpoint's name).
      position: the :class:`~ensemble_core.train.DataPosition` training resumes from;
        its ``epoch`` (completed epochs) is recorded as ``epoch`` too.
      members_trained: E' (E plus padding members), the rows of the state.
      healthy: per member of E', False once it diverged.
      dataset: :func:`dataset_record`.
      history, sessions: the epoch records and sessions of training so far.
      gathered_from: a gathered checkpoint: the member groups' checkpoint directories.
    """
    meta = {
        "state_format": STATE_FORMAT,
        "config": cfg.model_dump(mode="json"),
        "epoch": position["epoch"],
        "step": step,
        "data_position": position,
        "members_trained": members_trained,
        "healthy": healthy,
        "dataset": dataset,
        "history": history,
        "sessions": sessions,
    }
    if gathered_from is not None:
        meta["gathered_from"] = gathered_from
    return meta


@flax.struct.dataclass
class _Format1Best:
    """``BestTracking`` as format-1 checkpoints hold it (no ``model_state``)."""

    params: Any
    nll: Any
    epoch: Any
    stopped_epoch: Any


@flax.struct.dataclass
class _Format1State:
    """``EnsembleState`` as format-1 checkpoints hold it (no ``model_state``)."""

    step: Any
    params: Any
    opt_state: Any
    healthy: Any
    label_smoothing: Any
    best: _Format1Best | None = None


#: The fields ``EnsembleState`` shares with format 1 (all but ``model_state`` and ``best``).
_FORMAT1_FIELDS = ("step", "params", "opt_state", "healthy", "label_smoothing")


def _without_model_state(abstract: Any) -> _Format1State:
    """A format-2 state tree as a format-1 checkpoint holds it: the same fields without
    ``model_state`` (in the state and in ``best``).

    Raises:
      IncompatibleRunError: the target has mutable collections, which a format-1 checkpoint
        (made before members carried them) cannot hold (not damage: never quarantined).
    """
    if jax.tree.leaves(abstract.model_state):
        raise IncompatibleRunError(
            "the checkpoint was made before members carried mutable collections (batch_stats) and cannot "
            "hold this model's",
            fix="use another run_name, or resume it with the model it was started with",
        )
    best = abstract.best
    if best is not None:
        best = _Format1Best(params=best.params, nll=best.nll, epoch=best.epoch, stopped_epoch=best.stopped_epoch)
    return _Format1State(**{f: getattr(abstract, f) for f in _FORMAT1_FIELDS}, best=best)


def _with_model_state(target: Any, restored: _Format1State) -> Any:
    """The restored format-1 state as ``target``'s class, with empty collections."""
    best = None
    if restored.best is not None:
        b = restored.best
        best = target.best.replace(
            params=b.params, model_state={}, nll=b.nll, epoch=b.epoch, stopped_epoch=b.stopped_epoch
        )
    return target.replace(**{f: getattr(restored, f) for f in _FORMAT1_FIELDS}, model_state={}, best=best)


class EnsembleCheckpointer:
    """Save/restore :class:`EnsembleState` plus JSON metadata under one directory.

    Args:
      directory: the ``checkpoints/`` directory (created if missing).
      keep: how many of the latest checkpoints to keep (orbax ``LatestN`` preservation
        policy, the successor of ``max_to_keep``).
      quarantine_dir: where unreadable steps are moved (default: the run directory's
        ``corrupt-checkpoints/``, :class:`~ensemble_core.runs.storage.layout.RunDir`).
      read_only: open the checkpoints of a run another process may be writing (prediction,
        evaluation, the champion's re-evaluation, the drift check, the preflight): nothing
        under ``directory`` is created, deleted or renamed (orbax's ``read_only``; no
        clean-up of temporary directories, which are a running save's), and :meth:`save`
        and :meth:`restore_latest_valid` are refused.
    """

    def __init__(
        self, directory: str | Path, keep: int = 3, quarantine_dir: str | Path | None = None, *, read_only: bool = False
    ):
        self.directory = Path(directory).absolute()
        self.quarantine_dir = Path(quarantine_dir or RunDir(self.directory.parent).corrupt_checkpoints).absolute()
        self.read_only = read_only
        # A writer cleans up the temporary directories its own crashed saves left; a reader
        # must not: another process's save in flight is one of them.
        options = ocp.CheckpointManagerOptions(
            preservation_policy=None if read_only else pp.LatestN(n=keep),
            enable_async_checkpointing=not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
            create=not read_only,
            save_interval_steps=0 if read_only else 1,
        )
        # The items, each with one handler for its save and restore args: orbax's
        # ``handler_registry``, the successor of the deprecated ``item_names``.
        registry = ocp.DefaultCheckpointHandlerRegistry()
        for item, handler, save, restore in (
            ("state", ocp.StandardCheckpointHandler(), ocp.args.StandardSave, ocp.args.StandardRestore),
            ("meta", ocp.JsonCheckpointHandler(), ocp.args.JsonSave, ocp.args.JsonRestore),
        ):
            registry.add(item, save, handler)
            registry.add(item, restore, handler)
        for attempt in range(READER_ATTEMPTS):
            try:
                self._manager = ocp.CheckpointManager(self.directory, options=options, handler_registry=registry)
                break
            except (FileNotFoundError, NotADirectoryError):
                # orbax lists the steps, then reads each one's commit time: a writer in another
                # process may remove an old step (its preservation policy) in between, which
                # orbax reports as either error. A reader lists again; a writer owns the
                # directory and has nothing to race with.
                if not read_only or attempt == READER_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        self._saving: int | None = None  # the step of the latest save started

    def latest_step(self) -> int | None:
        """The newest saved step (completed epochs), or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Start an asynchronous save of ``state`` and ``meta`` as checkpoint ``step``, once
        the previous one has finished (as orbax would) and if its file system has room for it.

        The room a save needs is the size of the latest finished checkpoint on disk (the
        same arrays, compressed alike), or for the first one the arrays' size: a save that
        cannot fit is refused before it starts, instead of failing in orbax's writer
        threads (whose event loop closes under tensorstore's pending writes).

        Raises:
          DiskFullError: not enough free space for it, or the disk filled up while this or
            the previous save wrote.
          CheckpointError: this or the previous (asynchronous) save failed otherwise.
          Either way earlier finished checkpoints are untouched (orbax writes to a
          temporary directory, removed on failure, and renames it only when complete).
        """
        if self.read_only:
            raise CheckpointError(f"{self.directory} was opened read-only; a reader never saves")
        self.wait()
        needed = self._latest_size() or sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
        needed += len(json.dumps(meta)) + SAVE_MARGIN_BYTES
        free = diskspace.free_bytes(self.directory)
        if free is not None and free < needed:
            raise diskspace.disk_full(self.directory / str(step), needed=needed, done=self._intact())
        self._saving = step
        with self._write_errors(step):
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                force=True,
            )

    def _latest_size(self) -> int:
        """Bytes the latest finished checkpoint takes on disk, in whole blocks (0 if none)."""
        step = self.latest_step()
        if step is None:
            return 0
        return sum(f.stat().st_blocks * 512 for f in (self.directory / str(step)).rglob("*") if f.is_file())

    def _intact(self) -> str:
        finished = sorted((p.name for p in self.directory.iterdir() if p.name.isdigit()), key=int)
        return f"the finished checkpoints {finished} are intact; " if finished else ""

    @contextlib.contextmanager
    def _write_errors(self, step: int | None):
        try:
            yield
        except Exception as err:  # noqa: BLE001  (OSError, or orbax re-raising one from its thread)
            code = diskspace.errno_of(err)
            self._remove_failed_save()
            step = self._saving if step is None else step  # wait(): the save in flight
            if code in diskspace.NO_SPACE:
                where = self.directory / str(step) if step is not None else self.directory
                raise diskspace.disk_full(where, code, done=self._intact()) from None
            errno_name = f" [{errno.errorcode.get(code, code)}]" if code else ""
            raise CheckpointError(
                f"saving a checkpoint in {self.directory} failed{errno_name} ({type(err).__name__}: "
                f"{str(err)[:300]}); {self._intact()}"
                f"fix: free disk space (or fix the write error) and rerun with the same run name to resume"
            ) from None

    def _remove_failed_save(self) -> None:
        """Remove the failed save's temporary directories (its half-written arrays), again
        whenever a write still in flight recreates one, until none has appeared for
        ``CLEANUP_QUIET_S`` (at most ``CLEANUP_S``; what remains then is removed by the
        next writer, which opens the manager with ``cleanup_tmp_directories``)."""
        deadline = time.monotonic() + CLEANUP_S
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            tmps = list(self.directory.glob("*.orbax-checkpoint-tmp*"))
            for tmp in tmps:
                shutil.rmtree(tmp, ignore_errors=True)
            now = time.monotonic()
            if tmps:
                quiet_since = now
            elif now - quiet_since >= CLEANUP_QUIET_S:
                return
            time.sleep(0.05)

    def _latest(self, read: Callable[[int], _T]) -> _T:
        """``read(step)`` of the latest step. A reader whose step a writer in another process
        removed meanwhile (its preservation policy, after a newer save) lists the steps
        again and reads the new latest, up to ``READER_ATTEMPTS`` times; a step that is
        still there but cannot be read is damaged, and its error is raised.

        Raises:
          CheckpointError: no checkpoint (or ``read``'s own errors).
        """
        for attempt in range(READER_ATTEMPTS):
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint in {self.directory}")
            try:
                return read(step)
            except Exception:
                if not self.read_only or (self.directory / str(step)).exists() or attempt == READER_ATTEMPTS - 1:
                    raise
                self._manager.reload()  # the step is gone: list the steps again
        raise AssertionError("unreachable")  # pragma: no cover

    def read_meta(self, step: int | None = None) -> dict:
        """The JSON metadata of ``step`` (default: latest, see :meth:`_latest`) without
        touching the arrays.

        Raises:
          CheckpointError: no checkpoint, or its metadata cannot be read (damaged).
        """
        if step is None:
            return self._latest(self.read_meta)
        try:
            return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except (ValueError, KeyError, TypeError, OSError) as err:  # json/orbax on a damaged file
            raise CheckpointError(
                f"the metadata of checkpoint {step} in {self.directory} cannot be read ({type(err).__name__}: "
                f"{str(err)[:200]})",
                fix="rerun the run's training with its run name (a damaged checkpoint is set "
                "aside and it resumes from an older one)",
            ) from None

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore onto ``target``'s structure, shapes and shardings.

        Args:
          target: a state (or ``jax.ShapeDtypeStruct`` tree with shardings) of the same
            structure; the restored arrays get its shardings, so a checkpoint saved on 8
            devices restores on 1.
          step: the checkpoint to restore (default: latest; a reader lists again when a
            writer removes it meanwhile, :meth:`_latest`).

        Raises:
          CheckpointError: no checkpoint, or one that does not fit ``target``.
        """
        if step is None:
            return self._latest(lambda latest: self.restore(target, latest))
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target
        )
        legacy = self.read_meta(step).get("state_format", 1) < STATE_FORMAT
        if legacy:  # format 1: no model_state; restore the rest and add empty collections
            abstract = _without_model_state(abstract)
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"checkpoint {step} in {self.directory} does not fit this config ({err})",
                fix="use another run_name or the config the run was started with",
            ) from None
        state = _with_model_state(target, out["state"]) if legacy else out["state"]
        return state, out["meta"]

    def restore_latest_valid(self, target: Any, check=None) -> tuple[Any, dict, int]:
        """Restore the newest checkpoint that reads back, falling back to older ones.

        A step that cannot be read (a truncated or deleted file, a half-written save) is
        reported with a warning naming it and moved to ``quarantine_dir`` so
        that later saves cannot collide with it; valid checkpoints are never touched.
        ``check(meta)`` runs on the newest readable metadata before any array is read
        (it raises to refuse an incompatible run).

        Returns:
          ``(state, meta, step)``.

        Raises:
          CheckpointError: no step could be restored.
        """
        if self.read_only:
            raise CheckpointError(f"{self.directory} was opened read-only; a reader never sets a checkpoint aside")
        checked = False
        for step in sorted(self.all_steps(), reverse=True):
            try:
                meta = self.read_meta(step)
                if check is not None and not checked:
                    check(meta)
                    checked = True
                state, meta = self.restore(target, step)
                return state, meta, step
            except EnsembleError as err:
                if not isinstance(err, CheckpointError):  # check() refused the run: not a damaged file
                    raise
                self._quarantine(step, err)
            except Exception as err:  # noqa: BLE001  (orbax/tensorstore raise many types for damaged files)
                self._quarantine(step, err)
        raise CheckpointError(
            f"no readable checkpoint in {self.directory}", fix="delete the run directory or use another run_name"
        )

    def _quarantine(self, step: int, err: Exception) -> None:
        bad = self.directory / str(step)
        dest = self.quarantine_dir / f"{step}-{int(time.time())}"
        warnings.warn(
            f"checkpoint step {step} in {self.directory} is unreadable ({type(err).__name__}: "
            f"{str(err)[:200]}); moved to {dest}, falling back to an older step",
            stacklevel=3,
        )
        dest.parent.mkdir(parents=True, exist_ok=True)
        if bad.exists():
            shutil.move(str(bad), dest)
        self._manager.reload()

    def wait(self) -> None:
        """Block until every asynchronous save has finished.

        Raises:
          CheckpointError: a pending save failed (see :meth:`save`).
        """
        with self._write_errors(None):
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> EnsembleCheckpointer:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # already failing: release without masking the original error
            with contextlib.suppress(Exception):
                self.close()
