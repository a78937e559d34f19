"""One member's forward pass, in training and in inference mode, with its mutable collections.

A member is any Flax module written as Flax's own examples write them
(``examples/imagenet/models.py``): ``__call__(self, x, train: bool)`` (or another mode
argument of :data:`MODE_ARGUMENTS`, or none), with
``nn.BatchNorm(use_running_average=not train)`` and ``nn.Dropout(deterministic=not train)``
drawing from the ``'dropout'`` RNG collection. Its *variables* are ``{"params": ...}``
plus its mutable collections (``"batch_stats"`` for BatchNorm), all on the member axis
in the ensemble state.

Inside the train step a member's batch may be split over the mesh axis ``'data'``. So
that a member's trajectory does not depend on the topology, :func:`apply_train` makes
the member's *whole* batch the unit of its stochastic and batch-dependent layers:

- every ``nn.BatchNorm`` in training mode averages its batch statistics over ``'data'``
  (its ``axis_name`` is set to the data axis; a user's own ``axis_name``, e.g. the
  ``'batch'`` of Flax's ImageNet example, which names its ``pmap`` axis, is replaced);
- every ``nn.Dropout`` draws its mask for the whole batch from the member's key and keeps
  this shard's rows, so an example gets the same mask on 1 or 8 data shards.

Both are done with :func:`flax.linen.intercept_methods`, so the user's module is used
unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Key

from ensemble_core.mesh import DATA_AXIS

#: The collection that is the member's trainable parameters; every other collection the
#: module creates at initialisation is mutable state updated in training mode.
PARAMS = "params"
#: The RNG stream of dropout (Flax's ``nn.Dropout.rng_collection`` default).
DROPOUT = "dropout"


def split_variables(variables: Any) -> tuple[Any, dict[str, Any]]:
    """``(params, model_state)`` of a Flax variables dict; ``model_state`` holds every
    collection but ``params`` (e.g. ``{"batch_stats": ...}``; ``{}`` for a params-only module)."""
    variables = dict(variables)
    params = variables.pop(PARAMS)
    return params, variables


#: The mode arguments of ``__call__`` that Flax's examples and users write, each with its
#: value in training mode: ``train`` (``examples/imagenet``), ``training``, ``is_training``,
#: and ``deterministic`` (the inverse, as ``nn.Dropout`` takes it).
MODE_ARGUMENTS = {"train": True, "training": True, "is_training": True, "deterministic": False}


def mode_argument(model: nn.Module) -> str | None:
    """The mode argument ``model.__call__`` takes (the first of :data:`MODE_ARGUMENTS` in
    its signature, positional or keyword-only), or None for a module with no mode
    argument (one whose layers are fixed in one mode, such as Flax's older MNIST CNN)."""
    parameters = inspect.signature(type(model).__call__).parameters
    return next((name for name in MODE_ARGUMENTS if name in parameters), None)


def mode(model: nn.Module, train: bool) -> dict[str, Any]:
    """The keyword argument that puts ``model`` in training (``train``) or inference mode:
    ``{"train": train}`` for Flax's examples' convention, ``{"deterministic": not train}``
    for that one, ``{}`` for a module without a mode argument."""
    name = mode_argument(model)
    return {} if name is None else {name: train if MODE_ARGUMENTS[name] else not train}


def init_variables(model: nn.Module, key: Key[Array, ""], image_shape: tuple[int, ...]) -> dict[str, Any]:
    """One member's variables, initialised in inference mode (as Flax's examples do) on a
    float32 ``[1, *image_shape]`` dummy batch from ``key`` (the ``params`` stream)."""
    return dict(model.init(key, jnp.zeros((1, *image_shape), jnp.float32), **mode(model, False)))


def apply_inference(model: nn.Module, variables: Any, images: Float[Array, "B H W C"]) -> Float[Array, "B K"]:
    """One member's logits float32 ``[B, K]`` in inference mode (``train=False``: BatchNorm
    uses its running averages, dropout is off); ``images`` float32 ``[B, H, W, C]`` in [0, 1]."""
    return model.apply(variables, images, **mode(model, False))  # type: ignore[return-value]


def apply_train(
    model: nn.Module,
    params: Any,
    model_state: dict[str, Any],
    images: Float[Array, "b H W C"],
    key: Key[Array, ""],
    data_shards: int,
) -> tuple[Float[Array, "b K"], dict[str, Any]]:
    """One member's logits in training mode and its updated mutable collections.

    Args:
      params, model_state: the member's variables (no member axis), :func:`split_variables`.
      images: float32 ``[b, H, W, C]``: this shard's rows of the member's batch of
        ``b * data_shards`` examples (rows ``axis_index('data') * b ...``).
      key: the member's key for this step (its dropout stream).
      data_shards: the size of mesh axis ``'data'``; the call must run inside a
        ``shard_map`` that binds it (always true in the train step).

    Returns:
      float32 logits ``[b, K]`` and ``model_state`` updated (BatchNorm's running averages
      from the whole batch's statistics); ``{}`` stays ``{}``.
    """
    variables = {PARAMS: params, **model_state}
    with nn.intercept_methods(_whole_batch(data_shards)):
        train = mode(model, True)
        logits, updates = model.apply(variables, images, **train, rngs={DROPOUT: key}, mutable=list(model_state))
    return logits, {name: updates.get(name, model_state[name]) for name in model_state}


def trace_train(model: nn.Module, variables: Any, images: Any, **apply_kwargs: Any) -> Any:
    """``model.apply`` in training mode as the train step runs it (the whole-batch
    interception of :func:`apply_train`, the mesh axis ``'data'`` bound, one shard), for
    ``jax.eval_shape`` checks before any compute: a BatchNorm with its own ``axis_name``
    (the ``'batch'`` of Flax's ImageNet example) traces as it will train. ``apply_kwargs``
    go to ``apply`` (e.g. ``mutable``, ``capture_intermediates``); dropout draws from a
    fixed key.

    Returns:
      What ``model.apply`` returns (no leading axis)."""

    def one(v: Any, x: Any) -> Any:
        with nn.intercept_methods(_whole_batch(1)):
            return model.apply(v, x, **mode(model, True), rngs={DROPOUT: jax.random.key(0)}, **apply_kwargs)

    out = jax.vmap(one, in_axes=(None, None), axis_size=1, axis_name=DATA_AXIS)(variables, images)
    return jax.tree.map(lambda leaf: leaf[0], out)


def _whole_batch(data_shards: int):
    """The interceptor of :func:`apply_train` (see the module docstring)."""

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if isinstance(module, nn.BatchNorm) and module.axis_name != DATA_AXIS:  # (the clone has it)
            return _batch_norm(module, next_fun, args, kwargs)
        if isinstance(module, nn.Dropout) and data_shards > 1:
            return _dropout(module, data_shards, *args, **kwargs)
        return next_fun(*args, **kwargs)

    return interceptor


def _batch_norm(module: nn.BatchNorm, next_fun, args, kwargs):
    """``module`` in training mode with its statistics averaged over ``'data'``."""
    use_running_average = args[1] if len(args) > 1 else kwargs.get("use_running_average")
    if nn.merge_param("use_running_average", module.use_running_average, use_running_average):
        return next_fun(*args, **kwargs)  # inference mode: no statistics, no collective
    clone = module.clone(parent=None, axis_name=DATA_AXIS, axis_index_groups=None)
    # the caller's batch_stats are mutable in training mode (apply_train), as Flax requires
    y, updates = clone.apply(dict(module.variables), *args, mutable=["batch_stats"], **kwargs)
    for name, value in updates["batch_stats"].items():
        module.put_variable("batch_stats", name, value)
    return y


def _dropout(module: nn.Dropout, data_shards: int, inputs, deterministic=None, rng=None):
    """``nn.Dropout.__call__`` (flax 0.12) with the mask drawn for the member's whole batch
    of ``data_shards * inputs.shape[0]`` rows and this shard's rows kept."""
    if nn.merge_param("deterministic", module.deterministic, deterministic) or module.rate == 0.0:
        return inputs
    if module.rate == 1.0:
        return jnp.zeros_like(inputs)
    keep_prob = 1.0 - module.rate
    if rng is None:
        rng = module.make_rng(module.rng_collection)
    shape = list(inputs.shape)
    broadcast = {d % inputs.ndim for d in module.broadcast_dims}
    for dim in broadcast:
        shape[dim] = 1
    rows = inputs.shape[0]
    if 0 not in broadcast:
        shape[0] = rows * data_shards
    mask = jax.random.bernoulli(rng, p=keep_prob, shape=shape)
    if 0 not in broadcast:
        mask = lax.dynamic_slice_in_dim(mask, lax.axis_index(DATA_AXIS) * rows, rows, axis=0)
    mask = jnp.broadcast_to(mask, inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
