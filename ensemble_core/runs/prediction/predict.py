"""A trained run's ensemble on new images: the predictions, with the uncertainty figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core.calibration import apply_temperature
from ensemble_core.config import PipelineConfig
from ensemble_core.decisions import apply_rules
from ensemble_core.errors import CheckpointError, EnsembleError
from ensemble_core.runs.ensemble.load import load_ensemble
from ensemble_core.runs.prediction.images import check_image_shape, check_image_values
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.storage.layout import RunDir


def predict_images(run_dir: str | Path, images: np.ndarray, *, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Ensemble predictions of a trained run on new images.

    Args:
      run_dir: a run directory with checkpoints (its config is read from the checkpoint).
      images: uint8 ``[N, H, W, C]`` (0..255) or float ``[N, H, W, C]`` in [0, 1]
        (``[N, H, W]`` for one-channel images), in either byte order.
      batch_size: overrides the run's ``eval.batch_size``.

    Returns:
      ``ensemble_probs`` float32 ``[N, C]`` (temperature-scaled when the run fitted a
      temperature), ``predictive_entropy`` (of ``ensemble_probs``) and
      ``mutual_information`` float32 ``[N]`` (nats), ``member_probs`` float32 ``[K, N, C]``
      of the ensemble's healthy members (the selection's picks, one row each, when the
      run selects), ``predicted_class`` int32 ``[N]``, ``class_names`` str ``[C]`` (the
      run's class map: folder names, ``data.class_names`` or TFDS's label names; the
      digits ``'0'``.. for a run that predates class maps), ``predicted_name`` str ``[N]``,
      ``members`` int32 ``[K]`` (pool index of each row) and ``temperature`` (float32
      scalar, NaN when not fitted). A run with decision rules (its ``decisions.json``,
      fitted on the calibration split) adds ``prediction_set`` bool ``[N, C]`` (split
      conformal, ``prediction_sets.method`` at ``prediction_sets.alpha``), ``abstain`` bool
      ``[N]`` (the abstention rule: confidence below the threshold chosen for
      ``abstention.target_risk``), ``conformal_method``, ``alpha``, ``abstention_criterion``
      and ``target_risk`` (scalars) (:func:`ensemble_core.decisions.apply_rules`).

    Raises:
      DataError: images of the wrong shape, or values :func:`check_image_values` refuses.
      CheckpointError: the run has no readable checkpoint (only reading the run maps to it).
      DivergenceError: every member of the run diverged.
    """
    run = RunDir(Path(run_dir))
    images = np.asarray(images)
    if not images.dtype.isnative:  # e.g. big-endian float32 written on another machine: the same values
        images = images.astype(images.dtype.newbyteorder("="))
    try:
        with EnsembleCheckpointer(run.checkpoints, read_only=True) as ckpt:
            meta = ckpt.read_meta()
        cfg = PipelineConfig.model_validate(meta["config"])
        if batch_size:
            cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"batch_size": batch_size})})
        shape = tuple(meta["dataset"]["image_shape"])
        check_image_values(images)
        images = check_image_shape(images, shape)
        loaded = load_ensemble(cfg, run.path, meta["dataset"]["num_classes"], shape)
    except EnsembleError:
        raise  # its own line (the images refused, the run's model that does not import here, ...)
    except (ValueError, KeyError, TypeError) as err:  # orbax/tensorstore/json on damaged checkpoint files
        # Only reading the run is mapped here: an error computing the predictions is not a
        # damaged checkpoint (big-endian images used to be reported as one, with advice to retrain).
        raise CheckpointError(
            f"the latest checkpoint of {run_dir} cannot be read ({type(err).__name__}: {str(err)[:200]})",
            fix="rerun the run's training with its run name (a damaged checkpoint is set aside and it resumes "
            "from an older one), or predict with another --run-dir",
        ) from None
    members, temperature = loaded.members, loaded.temperature
    probs, _ = members.predict(loaded.config, images)
    probs = probs[members.healthy]
    ensemble = metrics_lib.ensemble_probs(probs)
    if temperature is not None:
        ensemble = apply_temperature(ensemble, temperature)
    num_classes = int(meta["dataset"]["num_classes"])
    names = np.asarray(meta["dataset"].get("class_names") or [str(c) for c in range(num_classes)], dtype=str)
    predicted = np.argmax(ensemble, -1).astype(np.int32)
    decided = {}
    if loaded.decisions is not None:
        rules = loaded.decisions
        applied = apply_rules(rules, ensemble, probs)
        decided = {
            "prediction_set": applied["prediction_set"],
            "abstain": applied["abstain"],
            "conformal_method": np.asarray(rules.method),
            "alpha": np.float32(rules.prediction_sets[rules.method].alpha),
            "abstention_criterion": np.asarray(rules.abstention.criterion),
            "target_risk": np.float32(rules.abstention.target_risk),
        }
    return {
        **decided,
        "class_names": names,
        "predicted_name": names[predicted],
        "ensemble_probs": ensemble.astype(np.float32),
        "predictive_entropy": metrics_lib.entropy(ensemble).astype(np.float32),
        "mutual_information": metrics_lib.mutual_information(probs).astype(np.float32),
        "member_probs": probs,
        "predicted_class": predicted,
        "members": members.rows[members.healthy].astype(np.int32),
        "temperature": np.float32(np.nan if temperature is None else temperature),
    }
