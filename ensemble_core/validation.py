"""Per-member validation after every epoch: each member's best epoch, and early stopping.

After an epoch's last step every member predicts the validation split (the vectorised
predict program, :mod:`ensemble_core.predict`); its validation NLL decides whether this
epoch's parameters become its best ones (kept in :class:`~ensemble_core.train.BestTracking`,
inside the checkpointed state, so a resumed run continues bitwise), and a member whose
validation NLL has not improved for ``train.patience`` epochs stops updating (masked in
the train step, like a diverged member). Early stopping on held-out loss follows
Prechelt 1998 ("Early stopping - but when?"); keeping each member's best epoch is what
Wenzel et al. 2020 do for hyper-deep ensembles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ensemble_core import metrics as metrics_lib
from ensemble_core.predict import member_probs
from ensemble_core.train import EnsembleState, state_shardings


def network_probs(probs: np.ndarray) -> np.ndarray:
    """Each member's predictive ``[E, N, C]``: ``probs`` as it is, or for networks of M
    members ``[E, M, N, C]`` each network's mean of its members' probabilities (the
    predictive it is evaluated by)."""
    return probs.mean(axis=1) if probs.ndim == 4 else probs


def member_nll(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each member's NLL (nats, :func:`ensemble_core.metrics.nll`): ``[E, N, C]`` (or
    ``[E, M, N, C]``, :func:`network_probs`) -> float64 ``[E]``."""
    return np.asarray([metrics_lib.nll(p, labels) for p in network_probs(probs)], np.float64)


def member_error(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each member's error rate, 1 - :func:`ensemble_core.metrics.accuracy`: ``[E, N, C]``
    (or ``[E, M, N, C]``, :func:`network_probs`) and int ``[N]`` -> float64 ``[E]`` in [0, 1]."""
    return np.asarray([1.0 - metrics_lib.accuracy(p, labels) for p in network_probs(probs)], np.float64)


def track_best(state: EnsembleState, nll: jax.Array, epoch: jax.Array, patience: int | None) -> EnsembleState:
    """Fold one epoch's validation NLL into ``state.best`` (pure; jit it).

    A member still training whose ``nll`` (float32 ``[E]``: the criterion's value,
    ``state.best.criterion``, lower is better) is below its best so far takes this epoch
    (1-based ``epoch``) as its best, parameters and mutable collections included; a tie
    keeps the earlier epoch, and a NaN never improves.
    With ``patience``, a member still training whose best epoch is ``patience`` or more
    epochs back stops: ``stopped_epoch = epoch``.
    """
    best = state.best
    if best is None:
        raise ValueError("the state tracks no best epoch; fix: init_ensemble(..., track_best=True)")
    training = best.stopped_epoch == 0
    improved = training & (nll < best.nll)

    def pick(new, old):
        mask = improved.reshape(improved.shape + (1,) * (new.ndim - 1))
        return jnp.where(mask, new, old)

    new_epoch = jnp.where(improved, epoch, best.epoch)
    stopped = best.stopped_epoch
    if patience is not None:
        stopped = jnp.where(training & (epoch - new_epoch >= patience), epoch, stopped)
    return state.replace(
        best=best.replace(
            params=jax.tree.map(pick, state.params, best.params),
            model_state=jax.tree.map(pick, state.model_state, best.model_state),
            nll=jnp.where(improved, nll, best.nll),
            epoch=new_epoch,
            stopped_epoch=stopped,
        )
    )


def make_validation(
    predict: Callable,
    images: np.ndarray,
    labels: np.ndarray,
    mesh: Mesh,
    batch_size: int,
    *,
    patience: int | None,
    one_member_per_device: bool = False,
) -> Callable[[int, EnsembleState], tuple[EnsembleState, dict[str, Any]]]:
    """The ``end_of_epoch`` hook of :func:`ensemble_core.train.fit`.

    Args:
      predict: the jitted predict program (:func:`ensemble_core.predict.make_predict`).
      images, labels: the validation split, uint8 ``[N, H, W, C]`` and int32 ``[N]``.
      batch_size, one_member_per_device: as :func:`ensemble_core.predict.member_probs`.
      patience: ``train.patience`` (None: no early stopping).

    Returns:
      ``hook(epoch, state) -> (state, {"validation_nll": [E floats]})`` (plus
      ``"validation_accuracy"`` when best epochs are chosen by accuracy): the state with
      :func:`track_best` applied on the state's criterion (0-based ``epoch``, recorded 1-based).

    Raises:
      ValueError: ``state.best`` is None (the state was built without a validation split).
    """
    update = None

    def hook(epoch: int, state: EnsembleState) -> tuple[EnsembleState, dict[str, Any]]:
        nonlocal update
        if state.best is None:
            raise ValueError("the ensemble state tracks no best epoch; fix: build it with track_best=True")
        probs = member_probs(
            predict, state.variables, images, mesh, batch_size, one_member_per_device=one_member_per_device
        )
        nll = member_nll(probs, labels)
        record = {"validation_nll": nll.tolist()}
        score = nll
        if state.best.criterion == "validation_error":
            score = member_error(probs, labels)
            record["validation_accuracy"] = (1.0 - score).tolist()
        if update is None:
            update = jax.jit(
                lambda st, v, k: track_best(st, v, k, patience), out_shardings=state_shardings(state, mesh)
            )
        state = update(state, jnp.asarray(score, jnp.float32), jnp.int32(epoch + 1))
        return state, record

    return hook
