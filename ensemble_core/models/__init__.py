"""Models by name, one file each (big_vision style).

``model.name: foo`` is the module ``ensemble_core/models/foo.py``, which defines
``build(cfg: ModelConfig, num_classes: int) -> flax.linen.Module``: the network of one
member, taking float32 images ``[B, H, W, C]`` in [0, 1] and returning float32 logits
``[B, num_classes]``. Adding a model is adding that file; the config accepts every module
found here (:data:`ensemble_core.config.MODEL_NAMES`).
"""

from __future__ import annotations

import importlib

import flax.linen as nn

from ensemble_core.config import MODEL_NAMES, ModelConfig
from ensemble_core.errors import ConfigError

__all__ = ["MODEL_NAMES", "build_model"]


def build_model(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The Flax module named by ``cfg.name``, with ``num_classes`` outputs.

    Raises:
      ConfigError: an unknown model name.
    """
    if cfg.name not in MODEL_NAMES:
        raise ConfigError(f"unknown model.name '{cfg.name}'; fix: use one of {MODEL_NAMES}")
    return importlib.import_module(f"ensemble_core.models.{cfg.name}").build(cfg, num_classes)
