"""NNX networks that take their dropout keys at call time, ``__call__(self, x, rngs)``, as
Flax's current NNX examples and guides write them, in each form a signature can take, and
networks whose calls the pipeline cannot make (named by class path,
``model.name=tests.user_models.call_rngs_nets:<Class>``):

- ``DefaultNoneNet``: ``rngs: nnx.Rngs | None = None`` (Flax's MNIST tutorial), with a
  ``num_classes``;
- ``KeywordOnlyNet``: ``*, rngs: nnx.Rngs``, drawing ``rngs.dropout()`` itself and passing
  the key to ``nnx.Dropout``;
- ``BothNet``: a module-held stream (``nnx.Dropout(rate, rngs=rngs)``) and a call-time one;
- ``WideNet``: 12 logits, no ``num_classes``;
- ``ExtraKeyNet``: ``__call__(self, x, rngs, key)``: a required argument the pipeline does
  not pass;
- ``PositionalOnlyNet``: ``__call__(self, x, rngs, /)``: ``rngs`` cannot be passed by name;
- ``MisusedDropoutNet``: calls its ``nnx.Dropout`` with ``rngs`` as a positional argument
  (a ``TypeError`` inside its ``__call__``, nothing to do with the images);
- ``NoneRngsNet``: draws ``rngs.dropout()`` unconditionally, so it fails on ``rngs=None``
  (Flax's evaluation convention) in inference mode;
- ``SmallBNNet``: a small BatchNorm and call-time dropout network for training tests;
- ``LinenRngsNet``: a ``flax.linen`` module whose ``__call__`` requires ``rngs``;
- ``wrapped_flax_cnn``: a function returning Flax's MNIST ``CNN`` (``flax_mnist.py``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
from flax import nnx


class _Base(nnx.Module):
    def __init__(self, num_classes: int = 10, pixels: int = 784, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(pixels, 32, rngs=rngs)
        self.dropout = nnx.Dropout(0.5)
        self.out = nnx.Linear(32, num_classes, rngs=rngs)

    def features(self, x):
        return nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))


class DefaultNoneNet(_Base):
    def __call__(self, x, rngs: nnx.Rngs | None = None):
        return self.out(self.dropout(self.features(x), rngs=rngs))


class KeywordOnlyNet(_Base):
    def __call__(self, x, *, rngs: nnx.Rngs):
        key = None if rngs is None else rngs.dropout()
        return self.out(self.dropout(self.features(x), rngs=key))


class BothNet(nnx.Module):
    def __init__(self, num_classes: int = 10, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(784, 32, rngs=rngs)
        self.held = nnx.Dropout(0.5, rngs=rngs)
        self.called = nnx.Dropout(0.5)
        self.out = nnx.Linear(32, num_classes, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.held(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))
        return self.out(self.called(x, rngs=rngs))


class WideNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.out = nnx.Linear(784, 12, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs):
        return self.out(x.reshape(x.shape[0], -1))


class ExtraKeyNet(_Base):
    def __call__(self, x, rngs: nnx.Rngs, key: jax.Array):
        return self.out(self.dropout(self.features(x), rngs=key))


class PositionalOnlyNet(_Base):
    def __call__(self, x, rngs, /):
        return self.out(self.dropout(self.features(x), rngs=rngs))


class MisusedDropoutNet(_Base):
    def __call__(self, x, rngs: nnx.Rngs | None = None):
        return self.out(self.dropout(self.features(x), rngs))


class NoneRngsNet(_Base):
    def __call__(self, x, rngs: nnx.Rngs | None = None):
        return self.out(self.dropout(self.features(x), rngs=rngs.dropout()))


class SmallBNNet(nnx.Module):
    """Conv(stride 2) - BatchNorm (``axis_name='batch'``, as Flax's ImageNet example) - ReLU
    - mean pool - Dropout (built without ``rngs``; keys at call time) - Linear."""

    def __init__(self, num_classes: int = 10, width: int = 4, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, width, (3, 3), strides=(2, 2), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(width, momentum=0.9, axis_name="batch", rngs=rngs)
        self.dropout = nnx.Dropout(0.25)
        self.head = nnx.Linear(width, num_classes, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs):
        x = nnx.relu(self.norm(self.conv(x))).mean(axis=(1, 2))
        return self.head(self.dropout(x, rngs=rngs))


class LinenRngsNet(nn.Module):
    """A flax.linen module asking for ``rngs`` at call time, which Linen does not pass."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x, rngs):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


def wrapped_flax_cnn(rngs: nnx.Rngs) -> nnx.Module:
    """Flax's MNIST ``CNN`` returned by a function (a user's wrapper around it)."""
    from tests.user_models.flax_mnist import CNN

    return CNN(rngs)
