"""Variables drawn with NumPy for tests that compare a network with an explicit construction
from the same parameters (BatchEnsemble and Packed-Ensembles against M plain networks)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def drawn_variables(model: nn.Module, x: jnp.ndarray, seed: int = 0, **kwargs) -> dict:
    """The model's variables drawn with NumPy in the shapes its ``init`` gives (traced only:
    ``jax.eval_shape``, nothing compiled), so that every parameter matters and the logits
    stay O(1): kernels N(0, 1/fan_in) (a 3-D kernel is PackedDense's ``[G, in/G, out/G]``,
    whose fan-in is ``in/G``), BatchEnsemble's fast weights ``r``, ``s`` N(1, 0.5), biases
    N(0, 0.1), BatchNorm scales N(1, 0.1), means N(0, 0.1), variances U(0.5, 1.5), all float32.
    ``kwargs`` go to ``model.init``."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name, shape = path[-1].key, leaf.shape
        if name == "kernel":
            fan_in = shape[-2] if len(shape) == 3 else int(np.prod(shape[:-1]))
            value = rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape)
        elif name in ("r", "s"):
            value = rng.normal(1.0, 0.5, shape)
        elif name == "scale":
            value = rng.normal(1.0, 0.1, shape)
        elif name == "var":
            value = rng.uniform(0.5, 1.5, shape)
        else:  # bias, mean
            value = rng.normal(0.0, 0.1, shape)
        return jnp.asarray(value, jnp.float32)

    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, **kwargs))
    return jax.tree_util.tree_map_with_path(draw, shapes)
