"""MC dropout (Gal & Ghahramani 2016, "Dropout as a Bayesian Approximation", Sec. 3 and
eq. 8): a network trained with dropout predicts with its dropout on, and the mean of T
stochastic passes approximates the predictive distribution,
``p(y | x) ~= 1/T sum_t softmax(f(x; W_t))`` with ``W_t`` the weights under pass t's
dropout masks. ``ensemble.method=mc_dropout``: each of the E trained networks makes
``ensemble.mc_samples`` passes and every pass is a member of the evaluation (E x T members).

Every other layer is in inference mode (BatchNorm uses its running averages), as in
uncertainty-baselines' MC dropout baselines. Pass t of member u draws the dropout mask of
example i from ``fold_in(fold_in(layer key, i), ...)`` where the layer key comes from the
pass's key :func:`pass_keys` ``(seed, u, t)``: a pass is the same whatever the batch
size, the mesh or the example's position in its batch (topology-invariant, as deep
ensembles' predictions are).

Wraps any member network with dropout: a Linen module (the registry's, or a user's by
class path) whose dropout is ``flax.linen.Dropout`` (a method interceptor turns it on), and
an NNX network whose dropout is ``flax.nnx.Dropout`` (each layer of the merged member
becomes an :class:`ExampleKeyedDropout`, on whatever the module's mode). A network without
one of rate > 0 is refused (:func:`check_network`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int, Key

from ensemble_core.errors import ConfigError
from ensemble_core.train import nnx_member
from ensemble_core.train.forward import (
    DROPOUT,
    apply_inference,
    cast_floats,
    compute_dtype,
    init_variables,
    matmul_precision,
    mode,
    train_unsharded,
)
from ensemble_core.train.nnx_member import PARAMS, NnxNetwork

__all__ = [
    "ExampleKeyedDropout",
    "apply_stochastic",
    "check_network",
    "dropout_layers",
    "example_dropout",
    "pass_keys",
    "stochastic_dropout",
]

#: Folded into the run's seed for the passes' keys (apart from the training streams).
_PASS_STREAM = 0x4D43  # "MC"


def pass_keys(seed: int, members: int, t: int) -> np.ndarray:
    """Raw key data uint32 ``[members, 2]`` of pass ``t`` of members ``0 .. members-1``:
    ``fold_in(fold_in(fold_in(key(seed), MC), u), t)`` (threefry), on the host, to be placed
    over the mesh's ``'ensemble'`` axis."""
    base = jax.random.fold_in(jax.random.key(seed), _PASS_STREAM)
    keys = jax.vmap(lambda u: jax.random.fold_in(jax.random.fold_in(base, u), t))(jnp.arange(members))
    return np.asarray(jax.random.key_data(keys))


def example_dropout(
    inputs: Float[Array, "B ..."],
    key: Key[Array, ""],
    index: Int[Array, " B"],
    rate: float,
    broadcast_dims: tuple[int, ...] = (),
) -> Float[Array, "B ..."]:
    """Inverted dropout (Srivastava et al. 2014) whose mask for row ``b`` is drawn from
    ``fold_in(key, index[b])`` (``index``: each row's example number in the whole set):
    units kept with probability ``1 - rate`` and scaled by ``1 / (1 - rate)``; dimensions
    in ``broadcast_dims`` share one mask (a broadcast over the batch, dimension 0, shares
    one mask for every example, drawn from ``key``)."""
    if rate == 0.0:
        return inputs
    if rate == 1.0:
        return jnp.zeros_like(inputs)
    keep = 1.0 - rate
    broadcast = {d % inputs.ndim for d in broadcast_dims}
    shape = tuple(1 if d in broadcast else n for d, n in enumerate(inputs.shape))
    if 0 in broadcast:
        mask = jax.random.bernoulli(key, p=keep, shape=shape)
    else:
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
        mask = jax.vmap(lambda k: jax.random.bernoulli(k, p=keep, shape=shape[1:]))(keys)
    mask = jnp.broadcast_to(mask, inputs.shape)
    return jax.lax.select(mask, inputs / keep, jnp.zeros_like(inputs))


def stochastic_dropout(index: Int[Array, " B"]):
    """A Linen method interceptor (``nn.intercept_methods``) that turns every
    ``nn.Dropout`` on, whatever its ``deterministic`` setting, with the mask of
    :func:`example_dropout` from the layer's ``'dropout'`` key; every other layer runs
    as called (inference mode)."""

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, nn.Dropout):
            return next_fun(*args, **kwargs)
        inputs = args[0] if args else kwargs["inputs"]
        rng = kwargs.get("rng")
        if rng is None:
            rng = module.make_rng(module.rng_collection)
        return example_dropout(inputs, rng, index, module.rate, tuple(module.broadcast_dims))

    return interceptor


class ExampleKeyedDropout(nnx.Dropout):
    """``nnx.Dropout`` (flax 0.12) that is on in inference mode too, with the masks of
    :func:`example_dropout`: its key from the layer's RNG stream (seeded from the pass's
    key when the member is merged, :meth:`~ensemble_core.train.nnx_member.NnxNetwork.merge`),
    example ``b``'s mask from ``example_index[b]`` (set on the merged copy before the call)."""

    example_index: Any

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        del deterministic  # on, whatever the mode: that is MC dropout
        key = nnx_member.dropout_key(self, rngs)
        return example_dropout(inputs, key, self.example_index, self.rate, tuple(self.broadcast_dims))


def _nnx_pass(net: NnxNetwork, variables: Any, images: Any, key: Any, index: Any, dtype: Any) -> Any:
    """One pass of an NNX member: merged with its streams seeded from ``key``, in
    inference mode (``module.eval()``), every ``nnx.Dropout`` an :class:`ExampleKeyedDropout`;
    a ``__call__`` that takes the call's ``rngs`` gets them from ``key`` too, as in training
    (:func:`~ensemble_core.train.nnx_member.call_arguments`): its dropout layers draw from
    them, and ``rngs=None`` would leave a layer built without ``rngs`` no key."""
    module = nnx_member.compute_in(net.merge(variables, key), dtype)
    module.eval()
    for _, layer in nnx.iter_modules(module):
        if isinstance(layer, nnx.Dropout):
            object.__setattr__(layer, "__class__", ExampleKeyedDropout)  # this merged copy only
            object.__setattr__(layer, "example_index", index)
    return module(images, **nnx_member.call_arguments(net, mode(net, False), key))


def apply_stochastic(
    model: nn.Module | NnxNetwork,
    variables: Any,
    images: Float[Array, "B H W C"],
    key: Key[Array, ""],
    index: Int[Array, " B"],
    precision: str = "float32",
) -> Float[Array, "B K"]:
    """One stochastic pass of one member: logits float32 ``[B, K]`` of Linen ``model`` in
    inference mode (BatchNorm's running averages) with every ``nn.Dropout`` on
    (:func:`stochastic_dropout`), its layers' keys from ``key`` (the pass's,
    :func:`pass_keys`) and example ``b``'s masks from ``index[b]``; ``images`` float32
    ``[B, H, W, C]`` in [0, 1], at compute precision ``precision`` (as
    :func:`ensemble_core.train.forward.apply_inference`).

    Raises:
      ConfigError: an unknown ``precision``.
    """
    if not isinstance(model, NnxNetwork):  # inference mode, its dropout turned on
        with nn.intercept_methods(stochastic_dropout(index)):
            return apply_inference(model, variables, images, precision, rngs={DROPOUT: key}).astype(jnp.float32)
    dtype = compute_dtype(precision)
    if dtype is not None:
        variables = {**variables, PARAMS: cast_floats(variables[PARAMS], dtype)}
        images = cast_floats(images, dtype)
    with matmul_precision(precision):
        logits: Any = _nnx_pass(model, variables, images, key, index, dtype)
    return logits.astype(jnp.float32)


def dropout_layers(model: Any, image_shape: tuple[int, ...]) -> list[float]:
    """The rates of the ``nn.Dropout`` layers one training-mode forward pass of Linen
    ``model`` calls (traced abstractly, as the train step traces it:
    :func:`ensemble_core.train.forward.train_unsharded`; no compute), in call order. For an NNX
    network, the rates of its ``nnx.Dropout`` layers (in graph order)."""
    rates: list[float] = []
    if isinstance(model, NnxNetwork):

        def layers():
            member = model.merge(nnx_member.init_variables(model, jax.random.key(0)), jax.random.key(1))
            rates.extend(float(layer.rate) for _, layer in nnx.iter_modules(member) if isinstance(layer, nnx.Dropout))
            return 0

        jax.eval_shape(layers)
        return rates

    def record(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and isinstance(context.module, nn.Dropout):
            rates.append(float(context.module.rate))
        return next_fun(*args, **kwargs)

    def forward():
        # as the step traces the member: initialised in inference mode, run in training mode
        # (a BatchNorm's own axis_name bound as the step binds it)
        variables = init_variables(model, jax.random.key(0), tuple(image_shape))
        with nn.intercept_methods(record):
            return train_unsharded(model, variables, jnp.zeros((1, *image_shape), jnp.float32))

    jax.eval_shape(forward)
    return rates


def check_network(model: Any, name: str, image_shape: tuple[int, ...]) -> None:
    """Refuse, before any compute, a network MC dropout cannot wrap.

    Raises:
      ConfigError: a network without an ``nn.Dropout`` (Linen) or ``nnx.Dropout`` (NNX) of
        rate > 0 (its passes would all be equal).
    """
    if not any(rate > 0 for rate in dropout_layers(model, image_shape)):
        raise ConfigError(
            f"ensemble.method=mc_dropout needs dropout, and model.name={name} has no dropout layer of rate > 0 "
            f"(its passes would all be equal)",
            fix="set model.options.dropout_rate (e.g. 0.1) for cnn, resnet or wide_resnet, add nn.Dropout "
            "(Linen) or nnx.Dropout (NNX) to your network, or use ensemble.method=deep",
        )
