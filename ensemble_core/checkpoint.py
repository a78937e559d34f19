"""orbax checkpoints of the ensemble state, with the run's metadata saved beside it as JSON.

Layout (orbax ``CheckpointManager``): ``<run>/checkpoints/<epoch>/{state,meta}/``, where
the step number is the number of completed epochs. ``state`` is the struct-of-arrays
:class:`~ensemble_core.train.EnsembleState` (``StandardSave``); ``meta`` is JSON with the
config, the epoch, the data position and the training history so far. Saves are
asynchronous; :meth:`EnsembleCheckpointer.close` waits for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from ensemble_core.errors import CheckpointError


class EnsembleCheckpointer:
    """Save/restore :class:`EnsembleState` plus JSON metadata under one directory.

    Args:
      directory: the ``checkpoints/`` directory (created if missing).
      keep: how many of the latest checkpoints to keep (orbax ``LatestN`` preservation
        policy, the successor of ``max_to_keep``).
    """

    def __init__(self, directory: str | Path, keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.LatestN(n=keep),
            enable_async_checkpointing=True,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        """The newest saved step (completed epochs), or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Start an asynchronous save of ``state`` and ``meta`` as checkpoint ``step``."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def read_meta(self, step: int | None = None) -> dict:
        """The JSON metadata of ``step`` (default: latest) without touching the arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore onto ``target``'s structure, shapes and shardings.

        Args:
          target: a state (or ``jax.ShapeDtypeStruct`` tree with shardings) of the same
            structure; the restored arrays get its shardings, so a checkpoint saved on 8
            devices restores on 1.
          step: the checkpoint to restore (default: latest).

        Raises:
          CheckpointError: no checkpoint, or one that does not fit ``target``.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target
        )
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"checkpoint {step} in {self.directory} does not fit this config ({err}); fix: use "
                f"another --run-name or the config the run was started with"
            ) from None
        return out["state"], out["meta"]

    def wait(self) -> None:
        """Block until every asynchronous save has finished."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> EnsembleCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
