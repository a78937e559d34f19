"""Member networks written with Flax NNX (``flax.nnx.Module``), as a user would bring them
(outside the package), each named by class with its options (``model.name:
tests.user_models.nnx_nets:<Class>``):

- ``CNN``: Flax's NNX MNIST tutorial CNN with the registry CNN's pooling
  (``ensemble_core.models.cnn``), the same network as the registry's Linen ``cnn``
  written the NNX way (the NNX-against-Linen benchmark);
- ``BNDropoutNet``: Conv - BatchNorm - ReLU - Conv(stride 2) - BatchNorm - ReLU - mean
  pool - Dropout - Linear, switched by ``model.train()`` / ``model.eval()`` only;
- ``TrainArgNet``: a ``__call__(self, x, train: bool = False)`` that passes its mode
  argument to its layers (some NNX code is written this way);
- ``FixedSeedNet``: builds its own ``nnx.Rngs(0)`` (no ``rngs`` argument): refused, as
  every member would start from the same weights;
- ``NoClassesNet``: its class count fixed (10) and no argument for it: refused for a dataset
  of another class count.
"""

from __future__ import annotations

from flax import nnx

from ensemble_core.models.cnn import avg_pool_2x2


class CNN(nnx.Module):
    """Conv32 3x3 - ReLU - avgpool - Conv64 3x3 - ReLU - avgpool - Linear256 - ReLU - Linear."""

    def __init__(self, num_classes: int = 10, channels: int = 1, height: int = 28, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(channels, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.linear1 = nnx.Linear(64 * (height // 4) ** 2, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, num_classes, rngs=rngs)

    def __call__(self, x):
        x = avg_pool_2x2(nnx.relu(self.conv1(x)))
        x = avg_pool_2x2(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.linear1(x))
        return self.linear2(x)


class BNDropoutNet(nnx.Module):
    """Conv - BatchNorm - ReLU - Conv(stride 2) - BatchNorm - ReLU - mean pool - Dropout - Linear;
    BatchNorm with ``axis_name`` (Flax's ImageNet example names its ``pmap`` axis 'batch')."""

    def __init__(
        self,
        num_classes: int = 10,
        width: int = 8,
        dropout_rate: float = 0.25,
        channels: int = 1,
        axis_name: str | None = "batch",
        *,
        rngs: nnx.Rngs,
    ):
        self.conv1 = nnx.Conv(channels, width, (3, 3), use_bias=False, rngs=rngs)
        self.norm1 = nnx.BatchNorm(width, momentum=0.9, epsilon=1e-5, axis_name=axis_name, rngs=rngs)
        self.conv2 = nnx.Conv(width, 2 * width, (3, 3), strides=(2, 2), use_bias=False, rngs=rngs)
        self.norm2 = nnx.BatchNorm(2 * width, momentum=0.9, epsilon=1e-5, axis_name=axis_name, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.head = nnx.Linear(2 * width, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.norm1(self.conv1(x)))
        x = nnx.relu(self.norm2(self.conv2(x)))
        x = self.dropout(x.mean(axis=(1, 2)))
        return self.head(x)


class TrainArgNet(nnx.Module):
    """Linear - Dropout - Linear with a mode argument ``train`` passed to its dropout."""

    def __init__(self, num_classes: int = 10, pixels: int = 784, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(pixels, 16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, num_classes, rngs=rngs)

    def __call__(self, x, train: bool = False):
        x = nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))
        return self.out(self.dropout(x, deterministic=not train))


class FixedSeedNet(nnx.Module):
    """Seeds itself: every instance has the same weights."""

    def __init__(self, num_classes: int = 10):
        self.out = nnx.Linear(784, num_classes, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.out(x.reshape(x.shape[0], -1))


class NoClassesNet(nnx.Module):
    """Ten outputs, fixed."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.out = nnx.Linear(784, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape(x.shape[0], -1))
