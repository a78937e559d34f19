"""Member networks in the conventions Flax code is written in, as a user would bring them
(outside the package), each a class named with its options (``model.name:
tests.user_models.conventions:<Class>``, ``model.options`` its constructor's arguments):

- ``FlaxMnistCNN``: the Linen CNN of Flax's older MNIST example, ``__call__(self, x)``
  with no mode argument and no ``num_classes`` field (its ``Dense(10)`` is fixed);
- ``TrainingArgNet``: ``__call__(self, x, training: bool)``, BatchNorm and Dropout;
- ``KeywordTrainNet``: ``__call__(self, x, *, train)`` (keyword-only);
- ``DeterministicNet``: ``__call__(self, x, deterministic: bool)`` (dropout's own convention);
- ``NoClassesNet``: a module with no ``num_classes`` field, its 10 outputs written in (refused
  for a dataset of another class count);
- ``Cifar10Net``: a network for 32x32 RGB images only (it reshapes to 32 * 32 * 3).
"""

from __future__ import annotations

import flax.linen as nn


class FlaxMnistCNN(nn.Module):
    """Flax's older MNIST example (examples/mnist, Linen), unchanged but for the class count:
    its field ``num_classes`` lets a run size the last layer."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=8, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(features=32)(x)
        x = nn.relu(x)
        x = nn.Dense(features=self.num_classes)(x)
        return x  # noqa: RET504  (as the example writes it)


class TrainingArgNet(nn.Module):
    """Dense - BatchNorm - ReLU - Dropout - Dense, mode argument ``training``."""

    num_classes: int = 10
    width: int = 16
    rate: float = 0.5

    @nn.compact
    def __call__(self, x, training: bool):
        x = nn.Dense(self.width)(x.reshape((x.shape[0], -1)))
        x = nn.relu(nn.BatchNorm(use_running_average=not training, axis_name="batch")(x))
        x = nn.Dropout(self.rate, deterministic=not training)(x)
        return nn.Dense(self.num_classes)(x)


class KeywordTrainNet(nn.Module):
    """Dense - Dropout - Dense, mode argument ``train`` keyword-only."""

    num_classes: int = 10
    rate: float = 0.5

    @nn.compact
    def __call__(self, x, *, train: bool):
        x = nn.relu(nn.Dense(16)(x.reshape((x.shape[0], -1))))
        x = nn.Dropout(self.rate, deterministic=not train)(x)
        return nn.Dense(self.num_classes)(x)


class DeterministicNet(nn.Module):
    """Dense - Dropout - Dense, mode argument ``deterministic`` (True in inference)."""

    num_classes: int = 10
    rate: float = 0.5

    @nn.compact
    def __call__(self, x, deterministic: bool):
        x = nn.relu(nn.Dense(16)(x.reshape((x.shape[0], -1))))
        x = nn.Dropout(self.rate, deterministic=deterministic)(x)
        return nn.Dense(self.num_classes)(x)


class NoClassesNet(nn.Module):
    """A network with its class count fixed and no field for it."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


class Cifar10Net(nn.Module):
    """A network written for 32x32 RGB images only."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], 32 * 32 * 3)))
