"""One member's forward pass, in training and in inference mode, with its mutable collections.

A member network is a Flax Linen module or an NNX network
(:class:`~ensemble_core.train.nnx_member.NnxNetwork`, whose functional form lives in
:mod:`ensemble_core.train.nnx_member`); the functions here take either. A Linen member is
any module written as Flax's own examples write them
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

Both modes run at the *compute precision* ``train.precision`` (:data:`PRECISIONS`), for
Linen and NNX members alike; the caller's arrays (params, mutable collections, optimizer
state) stay float32 whatever it is:

- ``float32``: the member as written (no cast, no context: the program of a run without
  the setting);
- ``high``: every matmul and convolution traced with precision ``HIGH``
  (``jax.default_matmul_precision("high")``, so the backward pass's too): TF32 on NVIDIA
  Ampere and newer GPUs, bf16_3x on TPU; XLA:CPU computes float32 as it would anyway;
- ``bfloat16``: the ``params`` collection and the images are cast to bfloat16 *inside*
  the function, so the forward and backward pass compute in bfloat16 while the gradient
  with respect to the float32 master parameters arrives in float32 (the cast's transpose);
  the mutable collections (BatchNorm's running averages) are passed as stored and their
  updates cast back to their stored dtype; an NNX ``BatchNorm`` that infers its dtype
  normalises in bfloat16 (:func:`~ensemble_core.train.nnx_member.compute_in`); the logits
  are returned as float32, so the loss and the softmax are float32. A layer that sets its
  own ``dtype`` computes in it.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from ensemble_core.config.sections import PRECISIONS
from ensemble_core.errors import ConfigError
from ensemble_core.mesh import DATA_AXIS
from ensemble_core.output_capture import captured_output
from ensemble_core.train import nnx_member, whole_batch
from ensemble_core.train.nnx_member import PARAMS, NnxNetwork

#: A member network: a Linen module, or an NNX network.
Network = nn.Module | NnxNetwork

#: The RNG stream of dropout (Flax's ``nn.Dropout.rng_collection`` default).
DROPOUT = "dropout"


# MARK: compute precision


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS` (``train.precision`` after the
    config's validation; its alias ``tf32`` is already ``high`` there).

    Raises:
      ConfigError: any other value, one line naming the allowed ones.
    """
    if precision not in PRECISIONS:
        raise ConfigError(
            f"unknown compute precision {precision!r}", fix=f"use one of {', '.join(PRECISIONS)} (train.precision)"
        )
    return precision


def compute_dtype(precision: str) -> Any:
    """The dtype a member computes in at ``precision``: ``jnp.bfloat16`` for ``bfloat16``,
    None (the arrays' own float32) for ``float32`` and ``high``.

    Raises:
      ConfigError: an unknown ``precision`` (:func:`check_precision`).
    """
    return jnp.bfloat16 if check_precision(precision) == "bfloat16" else None


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """While tracing inside it, matmuls and convolutions without an explicit precision get
    ``jax.lax.Precision.HIGH`` for ``precision="high"`` (``jax.default_matmul_precision``,
    resolved at trace time into every ``dot_general`` / ``conv_general_dilated``, and
    carried by their transposes into the backward pass); the backend's default otherwise.

    Raises:
      ConfigError: an unknown ``precision`` (:func:`check_precision`).
    """
    if check_precision(precision) == "high":
        with jax.default_matmul_precision("high"):
            yield
    else:
        yield


def cast_floats(tree: Any, dtype: Any) -> Any:
    """``tree`` with every floating-point leaf cast to ``dtype`` (integer, boolean and key
    leaves as they are); ``dtype`` None returns ``tree`` itself, untouched."""
    if dtype is None:
        return tree
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _like(new: Any, old: Any) -> Any:
    """``new`` (a collection's updated leaves) cast leaf by leaf to the dtypes of ``old``."""
    return jax.tree.map(lambda n, o: n if n.dtype == o.dtype else n.astype(o.dtype), new, old)


def _float32(logits: Any) -> Any:
    return logits if logits.dtype == jnp.float32 else logits.astype(jnp.float32)


# MARK: the forward pass


def user_network(model: Network) -> bool:
    """Whether ``model`` is a user's network (its class is not defined in ``ensemble_core``)."""
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    return not (cls.__module__ or "").startswith("ensemble_core.")


@contextlib.contextmanager
def user_output(model: Network, what: str) -> Iterator[None]:
    """Run the body, a call into ``model``'s code (Python runs when it is traced, or
    eagerly), with what a user's network prints captured and logged once, bounded
    (:func:`ensemble_core.output_capture.captured_output`): a network printing as it is
    traced made each trace of training, evaluation and prediction minutes long under a
    flow's ``log_prints``. The project's own networks run as they are."""
    if not user_network(model):
        yield
        return
    with captured_output(f"network {network_name(model)} printed while {what}"):
        yield


def network_name(model: Network) -> str:
    """``module.Class`` of ``model``'s class (an NNX network's module class), for messages."""
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


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


def mode_argument(model: Network) -> str | None:
    """The mode argument ``model.__call__`` takes (the first of :data:`MODE_ARGUMENTS` in
    its signature, positional or keyword-only), or None for a module with no mode
    argument (one whose layers are fixed in one mode, such as Flax's older MNIST CNN, or
    an NNX module switched by ``model.train()`` / ``model.eval()`` alone)."""
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    parameters = inspect.signature(cls.__call__).parameters
    return next((name for name in MODE_ARGUMENTS if name in parameters), None)


def mode(model: Network, train: bool) -> dict[str, Any]:
    """The keyword argument that puts ``model`` in training (``train``) or inference mode:
    ``{"train": train}`` for Flax's examples' convention, ``{"deterministic": not train}``
    for that one, ``{}`` for a module without a mode argument."""
    name = mode_argument(model)
    return {} if name is None else {name: train if MODE_ARGUMENTS[name] else not train}


def _call_rngs(model: Network) -> bool:
    return isinstance(model, NnxNetwork) and nnx_member.takes_call_rngs(model.module_type)


def convention(model: Network) -> str:
    """How the member is called, in words, for the run's log: the API and class, and the
    mode argument in training and in inference (and an NNX module's call-time ``rngs``)."""
    training, inference = mode(model, True), mode(model, False)
    if isinstance(model, NnxNetwork):
        api, switch = f"flax.nnx module {model.module_type.__name__}", "model.train() / model.eval()"
        if _call_rngs(model):
            switch += ", rngs=nnx.Rngs(the member's step key) / rngs=None"
        return f"{api}: {switch}" + (f", and {training} / {inference}" if training else "")
    api = f"flax.linen module {type(model).__name__}"
    if not training:
        return f"{api}: no mode argument, called the same way in training and inference"
    return f"{api}: training mode {training}, inference mode {inference}"


def describe_call(model: Network, train: bool) -> str:
    """The call of the member's ``__call__`` as the pipeline makes it in training
    (``train``) or inference mode, for messages: ``CNN.__call__(x, rngs=nnx.Rngs(...))``,
    ``Net.__call__(x, train=False)``."""
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    parts = ["x", *(f"{name}={value!r}" for name, value in mode(model, train).items())]
    if _call_rngs(model):
        parts.append(f"{nnx_member.CALL_RNGS}=nnx.Rngs(...)" if train else f"{nnx_member.CALL_RNGS}=None")
    return f"{cls.__qualname__}.__call__({', '.join(parts)})"


def check_call(model: Network, name: str) -> None:
    """Refuse, from its signature alone, a member whose ``__call__`` the pipeline cannot
    call: it passes the images (the first argument), the mode argument
    (:func:`mode_argument`, by name) and, to an NNX module, the call's RNG streams
    (:data:`~ensemble_core.train.nnx_member.CALL_RNGS`, by name); every other argument
    must have a default.

    Raises:
      ConfigError: one line naming the call and the argument: a required argument the
        pipeline does not pass (a Linen module's ``rngs`` included: Linen draws its keys
        with ``self.make_rng``), or a positional-only (before ``/``) mode argument or
        ``rngs``, which cannot be passed by name.
    """
    cls = model.module_type if isinstance(model, NnxNetwork) else type(model)
    try:
        parameters = list(inspect.signature(cls.__call__).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return
    if not parameters or parameters[0].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        return  # (*args, **kwargs): nothing to check by name
    passed = {mode_argument(model)} | ({nnx_member.CALL_RNGS} if isinstance(model, NnxNetwork) else set())
    call = f"{cls.__qualname__}.__call__"
    for parameter in parameters[1:]:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if parameter.name in passed and parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(
                f"model '{name}': {call} takes '{parameter.name}' as a positional-only argument (before '/'), and "
                f"the pipeline passes it by name ({call}(x, {parameter.name}=...))",
                fix=f"remove the '/' from {call}'s signature so that '{parameter.name}' can be passed by name",
            )
        if parameter.name in passed or parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.name == nnx_member.CALL_RNGS:  # a Linen module
            raise ConfigError(
                f"model '{name}': {call} requires an argument 'rngs', which the pipeline passes to flax.nnx modules "
                f"only; it calls this flax.linen module as {describe_call(model, True)}",
                fix="draw a flax.linen module's keys with self.make_rng('dropout') (nn.Dropout does) and remove "
                "the argument rngs, or write the network with flax.nnx",
            )
        rngs = " and the call's RNG streams as rngs" if isinstance(model, NnxNetwork) else ""
        raise ConfigError(
            f"model '{name}': {call} requires an argument '{parameter.name}' that the pipeline does not pass: it "
            f"passes the images, a mode argument ({', '.join(MODE_ARGUMENTS)}){rngs}, as "
            f"{describe_call(model, True)}",
            fix=f"give '{parameter.name}' a default, or rename it to one of those arguments",
        )


def init_variables(model: Network, key: Key[Array, ""], image_shape: tuple[int, ...]) -> dict[str, Any]:
    """One member's variables from ``key``: a Linen module initialised in inference mode
    (as Flax's examples do) on a float32 ``[1, *image_shape]`` dummy batch (``key`` is
    its ``params`` stream); an NNX network constructed from ``nnx.Rngs(key)``
    (:func:`~ensemble_core.train.nnx_member.init_variables`)."""
    with user_output(model, "initialised"):
        if isinstance(model, NnxNetwork):
            return nnx_member.init_variables(model, key)
        return dict(model.init(key, jnp.zeros((1, *image_shape), jnp.float32), **mode(model, False)))


def apply_inference(
    model: Network,
    variables: Any,
    images: Float[Array, "B H W C"],
    precision: str = "float32",
    rngs: dict[str, Any] | None = None,
) -> Float[Array, "B K"]:
    """One member's logits float32 ``[B, K]`` in inference mode (``train=False``, or
    ``model.eval()`` for NNX: BatchNorm uses its running averages, dropout is off);
    ``images`` float32 ``[B, H, W, C]`` in [0, 1]; at compute precision ``precision``
    (the module docstring: ``bfloat16`` casts the ``params`` collection and the images,
    not the running averages). ``rngs``: a Linen module's RNG streams, for a layer an
    interceptor turns on in inference mode (MC dropout, :mod:`ensemble_core.mc_dropout`).

    Raises:
      ConfigError: an unknown ``precision``.
    """
    dtype = compute_dtype(precision)
    if dtype is not None:
        variables = {**variables, PARAMS: cast_floats(variables[PARAMS], dtype)}
        images = cast_floats(images, dtype)
    logits: Any
    with matmul_precision(precision), user_output(model, "run in inference mode"):
        if isinstance(model, NnxNetwork):
            logits = nnx_member.apply_inference(model, variables, images, mode(model, False), dtype)
        else:
            logits = model.apply(variables, images, **mode(model, False), rngs=rngs)
    return logits if dtype is None else _float32(logits)


def apply_train(
    model: Network,
    params: Any,
    model_state: dict[str, Any],
    images: Float[Array, "b H W C"],
    key: Key[Array, ""],
    data_shards: int,
    precision: str = "float32",
) -> tuple[Float[Array, "b K"], dict[str, Any]]:
    """One member's logits in training mode and its updated mutable collections.

    Args:
      params, model_state: the member's variables (no member axis), :func:`split_variables`.
      images: float32 ``[b, H, W, C]``: this shard's rows of the member's batch of
        ``b * data_shards`` examples (rows ``axis_index('data') * b ...``).
      key: the member's key for this step (its dropout stream).
      data_shards: the size of mesh axis ``'data'``; the call must run inside a
        ``shard_map`` that binds it (always true in the train step).
      precision: the compute precision (module docstring). With ``bfloat16``, ``params``
        (float32 master weights) and ``images`` are cast here, so the gradient of a loss
        of the logits with respect to ``params`` is float32.

    Returns:
      float32 logits ``[b, K]`` and ``model_state`` updated (BatchNorm's running averages
      from the whole batch's statistics), each leaf in its stored dtype; ``{}`` stays ``{}``.

    Raises:
      ConfigError: an unknown ``precision``.
    """
    dtype = compute_dtype(precision)
    params, images = cast_floats(params, dtype), cast_floats(images, dtype)
    with matmul_precision(precision), user_output(model, "run in training mode"):
        if isinstance(model, NnxNetwork):
            logits, updated = nnx_member.apply_train(
                model, params, model_state, images, key, data_shards, mode(model, True), dtype
            )
        else:
            variables = {PARAMS: params, **model_state}
            with nn.intercept_methods(_whole_batch(data_shards)):
                train = mode(model, True)
                logits, updates = model.apply(
                    variables, images, **train, rngs={DROPOUT: key}, mutable=list(model_state)
                )
            updated = {name: updates.get(name, model_state[name]) for name in model_state}
    if dtype is None:
        return logits, updated
    return _float32(logits), _like(updated, model_state)


def train_unsharded(
    model: Network, variables: Any, images: Any, precision: str = "float32"
) -> tuple[Any, dict[str, Any]]:
    """:func:`apply_train` as the train step runs it, outside the step: the mesh axis
    ``'data'`` bound with one shard, dropout from a fixed key, at compute precision
    ``precision``. For ``jax.eval_shape`` checks before any compute (a BatchNorm with its
    own ``axis_name``, the ``'batch'`` of Flax's ImageNet example, traces as it will
    train) and for tests.

    Returns:
      float32 logits ``[B, K]`` and the updated mutable collections (``{}`` for none).

    Raises:
      ConfigError: an unknown ``precision``.
    """
    params, model_state = split_variables(variables)

    def one(p: Any, ms: Any, x: Any) -> Any:
        return apply_train(model, p, ms, x, jax.random.key(0), 1, precision)

    out = jax.vmap(one, in_axes=(None, None, None), axis_size=1, axis_name=DATA_AXIS)(params, model_state, images)
    return jax.tree.map(lambda leaf: leaf[0], out)


def activation_elements(model: Network, variables: Any, images: Any) -> int:
    """The float elements of every layer's output in one training-mode forward pass of
    ``images`` (Linen's ``capture_intermediates``; NNX's ``nnx.capture`` with
    ``method_outputs``), traced as the step runs it, abstractly (``jax.eval_shape``: no
    compute, no memory). ``variables``/``images`` may be ``jax.ShapeDtypeStruct``s."""

    def one(v: Any, x: Any) -> Any:
        if isinstance(model, NnxNetwork):
            return nnx_member.layer_outputs(model, v, x, mode(model, True))
        model_state = [name for name in v if name != PARAMS]
        with nn.intercept_methods(_whole_batch(1)):
            _, inter = model.apply(
                v,
                x,
                **mode(model, True),
                rngs={DROPOUT: jax.random.key(0)},
                capture_intermediates=True,
                mutable=["intermediates", *model_state],
            )
        return inter.get("intermediates", {})

    with user_output(model, "run in training mode (its layers' outputs counted)"):
        outputs = jax.eval_shape(
            lambda v, x: jax.vmap(one, in_axes=(None, None), axis_size=1, axis_name=DATA_AXIS)(v, x), variables, images
        )
    floats = (leaf for leaf in jax.tree.leaves(outputs) if jnp.issubdtype(leaf.dtype, jnp.floating))
    return sum(math.prod(leaf.shape[1:]) for leaf in floats)


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
    """``nn.Dropout.__call__`` (flax 0.12) with the mask of the member's whole batch
    (:func:`ensemble_core.train.whole_batch.dropout`)."""
    if nn.merge_param("deterministic", module.deterministic, deterministic) or module.rate == 0.0:
        return inputs
    if rng is None and module.rate != 1.0:
        rng = module.make_rng(module.rng_collection)
    return whole_batch.dropout(inputs, rng, module.rate, module.broadcast_dims, data_shards)
