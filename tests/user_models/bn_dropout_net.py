"""A member network written the way Flax's own examples write them (examples/imagenet):
``__call__(x, train)``, ``nn.BatchNorm(use_running_average=not train)`` and
``nn.Dropout(deterministic=not train)``. Used by the tests as a user's own model
(``model.name: tests.user_models.bn_dropout_net:build``), outside the package."""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax.numpy as jnp


class BNDropoutNet(nn.Module):
    """Conv - BatchNorm - ReLU - Conv(stride 2) - BatchNorm - ReLU - mean pool - Dropout - Dense."""

    num_classes: int = 10
    width: int = 8
    dropout_rate: float = 0.25
    axis_name: str | None = None  # Flax's ImageNet example names its pmap axis 'batch'

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        norm = partial(
            nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5, axis_name=self.axis_name
        )
        x = nn.relu(norm()(nn.Conv(self.width, (3, 3), use_bias=False)(x)))
        x = nn.relu(norm()(nn.Conv(2 * self.width, (3, 3), strides=(2, 2), use_bias=False)(x)))
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return nn.Dense(self.num_classes)(x)


def build(cfg, num_classes: int) -> BNDropoutNet:
    """``model.options``: ``width`` (int), ``dropout_rate`` (float), ``axis_name`` (str)."""
    unknown = set(cfg.options) - {"width", "dropout_rate", "axis_name"}
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; this model takes width, dropout_rate, axis_name")
    return BNDropoutNet(num_classes=num_classes, **cfg.options)


def not_a_model(cfg, num_classes: int):
    """Returns something that is not a Flax module (for the refusal test)."""
    return {"num_classes": num_classes}


def wrong_output(cfg, num_classes: int) -> nn.Module:
    """A network whose output is not [B, num_classes] (for the refusal test)."""
    return WrongOutput()


class WrongOutput(nn.Module):
    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))
