"""Networks in the conventions of a user's network whose training steps take a set wall
time without using the CPU (:func:`tests.user_models.paced_mlp.paced`: a host callback
waits ``pause_s`` seconds per member and step), for the kill-and-resume tests, each named
by class with its options (``model.name: tests.user_models.paced_nets:<Class>``,
``model.options: {hidden: 64, pause_s: 0.1}``):

- ``PacedNnxNet``: ``flax.nnx``, Linear - BatchNorm (``axis_name='batch'``) - ReLU -
  Dropout - Linear, switched by ``model.train()`` / ``model.eval()`` (its own
  ``deterministic`` attribute, which both set, says whether to wait);
- ``PacedLinenNet``: ``flax.linen``, ``__call__(self, x, training: bool)``, the same layers,
  BatchNorm with ``axis_name='batch'`` (Flax's ImageNet example's pmap axis);
- ``PacedNoModeNet``: ``flax.linen``, ``__call__(self, x)`` with no mode argument (Flax's
  older MNIST example's convention): Dense - ReLU - Dense, waiting in every call.
"""

from __future__ import annotations

import flax.linen as nn
from flax import nnx

from tests.user_models.paced_mlp import paced


class PacedNnxNet(nnx.Module):
    def __init__(
        self, num_classes: int = 10, hidden: int = 64, pause_s: float = 0.1, pixels: int = 784, *, rngs: nnx.Rngs
    ):
        self.hidden = nnx.Linear(pixels, hidden, rngs=rngs)
        self.norm = nnx.BatchNorm(hidden, momentum=0.9, axis_name="batch", rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.out = nnx.Linear(hidden, num_classes, rngs=rngs)
        self.pause_s = pause_s
        self.deterministic = False  # set by model.train() / model.eval()

    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        if not self.deterministic:
            x = paced(x, self.pause_s)
        x = self.dropout(nnx.relu(self.norm(self.hidden(x))))
        return self.out(x)


class PacedLinenNet(nn.Module):
    num_classes: int = 10
    hidden: int = 64
    pause_s: float = 0.1

    @nn.compact
    def __call__(self, x, training: bool):
        x = x.reshape((x.shape[0], -1))
        if training:
            x = paced(x, self.pause_s)
        x = nn.Dense(self.hidden)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not training, momentum=0.9, axis_name="batch")(x))
        x = nn.Dropout(0.25, deterministic=not training)(x)
        return nn.Dense(self.num_classes)(x)


class PacedNoModeNet(nn.Module):
    num_classes: int = 10
    hidden: int = 64
    pause_s: float = 0.1

    @nn.compact
    def __call__(self, x):
        x = paced(x.reshape((x.shape[0], -1)), self.pause_s)
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_classes)(x)
