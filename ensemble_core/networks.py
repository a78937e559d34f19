"""The network each of the E slots of a run trains, by ``ensemble.method``.

``deep`` and ``mc_dropout`` train the model ``model.name`` names (:mod:`ensemble_core.models`):
one member per network (MC dropout's passes are made at prediction,
:mod:`ensemble_core.mc_dropout`). ``batch_ensemble`` and ``packed`` train a network that
holds ``ensemble.members_per_network`` members (M) and returns their logits
``[M, B, num_classes]`` (:mod:`ensemble_core.methods`): the BatchEnsemble (Wen et al. 2020)
or Packed-Ensembles (Laurent et al. 2023) variant of the registry's ``cnn`` or
``resnet``, with that model's options. A run of E such networks has E x M members.
"""

from __future__ import annotations

from typing import Any

from ensemble_core.config import PipelineConfig
from ensemble_core.errors import ConfigError
from ensemble_core.models import build_model, model_options
from ensemble_core.train.forward import Network

__all__ = ["MULTI_MEMBER_METHODS", "WRAPPED_MODELS", "build_network", "members_per_network"]

#: The methods whose one network holds M members.
MULTI_MEMBER_METHODS = ("batch_ensemble", "packed")
#: The registry models they have a variant of.
WRAPPED_MODELS = ("cnn", "resnet")


def members_per_network(cfg: PipelineConfig) -> int:
    """M, the members one trained network holds: ``ensemble.members_per_network`` for
    ``batch_ensemble`` and ``packed``, else 1."""
    return cfg.ensemble.members_per_network if cfg.ensemble.method in MULTI_MEMBER_METHODS else 1


def build_network(cfg: PipelineConfig, num_classes: int) -> Network:
    """The network of one slot of ``cfg`` for ``num_classes`` classes (module docstring).

    Raises:
      ConfigError: ``model.name`` cannot be built (:func:`ensemble_core.models.build_model`),
        or has no variant for a multi-member method (only ``cnn`` and ``resnet``), or
        takes an option the variant does not have.
    """
    method = cfg.ensemble.method
    if method not in MULTI_MEMBER_METHODS:
        return build_model(cfg.model, num_classes)
    if cfg.model.name not in WRAPPED_MODELS:
        raise ConfigError(
            f"ensemble.method={method} has variants of the registry's {' and '.join(WRAPPED_MODELS)} only, not "
            f"model.name={cfg.model.name}",
            fix=f"use model.name={' or '.join(WRAPPED_MODELS)}, or ensemble.method=deep (or mc_dropout, for a "
            f"network with dropout)",
        )
    from ensemble_core import methods

    options: dict[str, Any] = dict(model_options(cfg.model) or {})
    m = cfg.ensemble.members_per_network
    if cfg.model.name == "cnn":
        if options.get("dropout_rate"):
            raise ConfigError(
                f"ensemble.method={method} of the cnn has no dropout layer, and model.options.dropout_rate="
                f"{options['dropout_rate']}",
                fix="drop model.options.dropout_rate",
            )
        if method == "batch_ensemble":
            return methods.BatchEnsembleCNN(num_classes=num_classes, ensemble_size=m)
        return methods.PackedCNN(
            num_classes=num_classes, ensemble_size=m, alpha=cfg.ensemble.packed.alpha, gamma=cfg.ensemble.packed.gamma
        )
    if method == "batch_ensemble":
        return methods.BatchEnsembleResNet(num_classes=num_classes, ensemble_size=m, **options)
    return methods.PackedResNet(
        num_classes=num_classes,
        ensemble_size=m,
        alpha=cfg.ensemble.packed.alpha,
        gamma=cfg.ensemble.packed.gamma,
        **options,
    )
