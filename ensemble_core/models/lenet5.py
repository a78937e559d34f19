"""LeNet-5 as Uncertainty Baselines trains it on MNIST and Fashion-MNIST.

Source: google/uncertainty-baselines, ``baselines/mnist/deterministic.py``, function
``lenet5(input_shape, num_classes)`` (Keras; the MNIST baselines' deterministic and ensemble
runs use it; the repository has no ``uncertainty_baselines/models/lenet5.py``). Layer for
layer:

* ``Conv2D(6, kernel_size=5, padding='SAME', activation='relu')``
* ``MaxPooling2D(pool_size=2, strides=2, padding='SAME')``
* ``Conv2D(16, 5, 'SAME', relu)`` - ``MaxPooling2D(2, 2, 'SAME')``
* ``Conv2D(120, 5, 'SAME', relu)``
* ``Flatten`` - ``Dense(84, relu)`` - ``Dense(num_classes)`` (logits)

No dropout, no normalisation. Kernels are initialised as Keras does by default (Glorot
uniform), biases with zeros. ``'SAME'`` max pooling pads an odd size at the end (with
``-inf``), as TensorFlow does. Because the third convolution keeps its ``'SAME'`` padding,
its ``H/4 x W/4 x 120`` output is flattened whole: the first Dense layer (and so the
parameter count) grows with the image size.

Input float32 ``[B, H, W, C]`` in [0, 1] (any ``H``, ``W``; ``C`` 1 or 3); output float32
logits ``[B, num_classes]``. Called as ``model.apply(variables, x, train=bool)``; ``train``
changes nothing (no dropout, no BatchNorm), and there is no collection besides ``'params'``.

Parameters, 10 classes (kernels + biases: conv 5*5*C*6+6, 5*5*6*16+16, 5*5*16*120+120; Dense
(H/4)*(W/4)*120*84+84, 84*10+10):

* 28x28x1 (MNIST, Fashion-MNIST): 156 + 2,416 + 48,120 + 494,004 + 850 = **545,546**
* 32x32x3 (CIFAR-10): 456 + 2,416 + 48,120 + 645,204 + 850 = **697,046**

(Uncertainty Baselines' MNIST README lists "60K", the size of LeCun et al.'s 1998 network
with valid convolutions, not of the code above.)

Options: none; ``model.options`` must be empty (:class:`Options` refuses every key).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict

from ensemble_core.config import ModelConfig

#: Keras's default kernel initialiser (``glorot_uniform``); biases start at zero in both.
KERNEL_INIT = nn.initializers.glorot_uniform()


class Options(BaseModel):
    """``model.options`` of ``model.name: lenet5``: none (an unknown key is an error, not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LeNet5(nn.Module):
    """Uncertainty Baselines' LeNet-5 (module docstring): float32 ``[B, H, W, C]`` -> logits ``[B, num_classes]``."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        del train  # no dropout, no BatchNorm: the same function in training and evaluation
        for features in (6, 16):
            x = nn.relu(nn.Conv(features, (5, 5), padding="SAME", kernel_init=KERNEL_INIT)(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = nn.relu(nn.Conv(120, (5, 5), padding="SAME", kernel_init=KERNEL_INIT)(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(84, kernel_init=KERNEL_INIT)(x))
        return nn.Dense(self.num_classes, kernel_init=KERNEL_INIT)(x)


def build(cfg: ModelConfig, num_classes: int) -> LeNet5:
    """The registry's constructor (:mod:`ensemble_core.models`); ``cfg.options`` must be empty.

    Raises:
      pydantic.ValidationError: ``cfg.options`` has a key.
    """
    options: dict[str, Any] = dict(cfg.options)
    Options.model_validate(options)
    return LeNet5(num_classes=num_classes)
