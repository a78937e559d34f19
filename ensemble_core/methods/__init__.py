"""Efficient-ensemble baselines beside the deep ensemble: one network that holds all ``M`` members.

- :mod:`.batch_ensemble`: BatchEnsemble (Wen, Tran & Ba, ICLR 2020): the members share each
  layer's weight ``W`` and own rank-1 fast weights, ``W_i = W ∘ (r_i s_i^T)``.
- :mod:`.packed`: Packed-Ensembles (Laurent et al., ICLR 2023): the members are narrow
  networks packed side by side into grouped convolutions with ``M · gamma`` groups.

Each network returns float32 logits ``[M, B, num_classes]`` for images ``[B, H, W, C]``
(one batch for all members) or ``[M, B, H, W, C]`` (a batch per member). They are not
member networks of the registry (:mod:`ensemble_core.models`, whose modules return
``[B, num_classes]`` for one member): they live here, outside it, and
``benchmarks/methods.py`` compares them with the deep ensemble of plain CNNs.
"""

from ensemble_core.methods.batch_ensemble import (
    DEFAULT_RANDOM_SIGN_INIT,
    BatchEnsembleBasicBlock,
    BatchEnsembleCNN,
    BatchEnsembleConv,
    BatchEnsembleDense,
    BatchEnsembleResNet,
    random_sign_initializer,
    tile_members,
)
from ensemble_core.methods.packed import (
    PackedBasicBlock,
    PackedCNN,
    PackedConv,
    PackedDense,
    PackedResNet,
    packed_width,
)

__all__ = [
    "DEFAULT_RANDOM_SIGN_INIT",
    "BatchEnsembleBasicBlock",
    "BatchEnsembleCNN",
    "BatchEnsembleConv",
    "BatchEnsembleDense",
    "BatchEnsembleResNet",
    "PackedBasicBlock",
    "PackedCNN",
    "PackedConv",
    "PackedDense",
    "PackedResNet",
    "packed_width",
    "random_sign_initializer",
    "tile_members",
]
