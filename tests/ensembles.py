"""Small test ensembles built the way the project builds them (:mod:`ensemble_core.ensemble_setup`)."""

from __future__ import annotations

import jax

from ensemble_core import ensemble_setup as setup
from ensemble_core.config import PipelineConfig
from ensemble_core.mesh import replicated
from ensemble_core.train import fit

BATCH = 32


def small_setup(
    model: str,
    members: int,
    strategy: str = "vmap",
    *,
    devices: int = 8,
    ensemble: int | None = None,
    data: int = 1,
    pad: bool = False,
    hidden: tuple[int, ...] = (32,),
    lr: float = 0.1,
    batch_size: int = BATCH,
    options: dict | None = None,
    augment: dict | None = None,
) -> setup.EnsembleSetup:
    """The setup (mesh, model, optimizer, member keys) of a small ensemble of ``members``
    on the first ``devices`` devices, 10 classes (``options``: ``model.options``,
    ``augment``: ``data.augment``)."""
    cfg = PipelineConfig.model_validate(
        {
            "model": {"name": model, "hidden_sizes": list(hidden), "options": options or {}},
            "data": {"augment": augment or {}},
            "ensemble": {"size": members, "pad": pad},
            "train": {"batch_size": batch_size, "learning_rate": lr},
            "mesh": {"ensemble": ensemble, "data": data, "member_strategy": strategy},
        }
    )
    return setup.build(cfg, 10, num_devices=devices)


def train_small(built: setup.EnsembleSetup, images, labels, epochs: int = 1, state=None, **fit_kwargs):
    """``fit`` from the members' initial state (or ``state``) on the replicated arrays, with
    each member's learning-rate schedule unless ``fit_kwargs`` give ``learning_rates``
    (``fit_kwargs`` go to ``fit``)."""
    keys = built.member_keys()
    if state is None:
        state = built.init_state(keys["init"], images.shape[1:])
    imgs = jax.device_put(images, replicated(built.mesh))
    labs = jax.device_put(labels, replicated(built.mesh))
    batch = built.config.train.batch_size
    rates = fit_kwargs.pop("learning_rates", None) or built.learning_rates(len(images))
    return fit(
        state,
        built.train_step(),
        imgs,
        labs,
        keys["data"],
        built.mesh,
        stochastic_keys=keys["stochastic"],
        epochs=epochs,
        batch_size=batch,
        learning_rates=rates,
        **fit_kwargs,
    )


def predictions(run_dir) -> dict:
    """The arrays of a run's ``predictions.npz`` (``member_probs``, ``labels``, ``healthy``)."""
    import numpy as np

    with np.load(f"{run_dir}/predictions.npz") as f:
        return {k: f[k] for k in f.files}


def tiny_config(tfds_dir: str, *overrides: str):
    """A run config that trains in seconds: 2 MLP members (16 hidden units), 1 epoch on
    256 training and 100 test digits of the session's mnist5k (no validation and no
    calibration split held out, so every training digit trains), the test evaluator only,
    no figures (``eval.plots=true`` where a test looks at them); ``overrides`` (dotted
    ``key=value``, as after ``--set``) are applied after these."""
    from ensemble_core.config import load_config

    base = [
        f"data.data_dir={tfds_dir}",
        "data.max_train_examples=256",
        "data.max_test_examples=100",
        "data.validation_fraction=0",
        "data.calibration_fraction=0",
        "model.name=mlp",
        "model.hidden_sizes=[16]",
        "ensemble.size=2",
        "train.batch_size=32",
        "train.epochs=1",
        "eval.evaluators=[test]",
        "eval.plots=false",
    ]
    return load_config(None, [*base, *overrides])


def stop_after(steps: int):
    """A ``should_stop`` that asks training to stop once it has been asked ``steps`` times
    (once per step): a stop request at a step the test chooses, as a SIGTERM makes."""
    calls = []
    return lambda: len(calls.append(1) or calls) >= steps


def assert_checkpoints_equal(cfg: PipelineConfig, dataset, run_a, run_b) -> None:
    """The latest checkpoints of two runs of ``cfg`` (directories with ``checkpoints/``),
    restored, are bitwise equal leaf for leaf (parameters, optimizer and model state)."""
    import numpy as np

    from ensemble_core.runs.ensemble.load import restore

    a, b = (restore(cfg, d, dataset.num_classes, dataset.image_shape)[0] for d in (run_a, run_b))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
