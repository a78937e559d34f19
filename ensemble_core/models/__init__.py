"""Models looked up by ``model.name``."""

from __future__ import annotations

import flax.linen as nn

from ensemble_core.config import ModelConfig
from ensemble_core.errors import ConfigError
from ensemble_core.models.cnn import CNN
from ensemble_core.models.mlp import MLP

__all__ = ["CNN", "MLP", "build_model", "MODEL_NAMES"]

MODEL_NAMES = ("cnn", "mlp")


def build_model(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The Flax module named by ``cfg.name``, with ``num_classes`` outputs.

    Raises:
      ConfigError: an unknown model name.
    """
    if cfg.name == "cnn":
        return CNN(num_classes=num_classes)
    if cfg.name == "mlp":
        return MLP(hidden_sizes=tuple(cfg.hidden_sizes), num_classes=num_classes)
    raise ConfigError(f"unknown model.name '{cfg.name}'; fix: use one of {MODEL_NAMES}")
