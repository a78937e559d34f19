"""NNX members: a ``flax.nnx.Module`` as one member of the ensemble, in the functional
form the train step stacks on the member axis.

An NNX module is a Python object that holds its own arrays. The ensemble keeps every
member's arrays as plain pytrees stacked on a leading member axis (struct of arrays,
exactly as for Linen members), and runs a member the way Flax documents NNX under JAX
transforms (the "NNX and JAX transformations" guide, functional API): ``nnx.merge`` the
network's graph definition with the member's arrays, call the module, ``nnx.split`` the
updated arrays out again. Under ``jax.jit`` this costs nothing at run time: the merge and
the split happen while tracing.

A member's *variables* are its arrays grouped as Linen names its collections, so that
checkpoints, evaluation and every tool that reads them are the same for both APIs:

- ``nnx.Param`` (and its subclasses): ``"params"``, trained;
- ``nnx.BatchStat``: ``"batch_stats"``, BatchNorm's running averages;
- any other ``nnx.Variable`` type the module creates (a user's own): a collection named
  after the type in snake case (``MyCounter`` -> ``"my_counter"``), carried like
  ``batch_stats``;
- the RNG state (every ``nnx.RngStream``'s key and count) is *not* kept: each call seeds
  every stream from the member's key for the step (:func:`apply_train`), so dropout masks
  depend on the member and the step only, never on the mesh, a resume, or how often the
  module was called before (as for Linen's ``'dropout'`` stream).

The dropout keys may also come *at call time*, as Flax's current NNX examples and guides
write it (``examples/mnist/train.py``: ``nnx.Dropout(rate)`` without ``rngs``, and
``__call__(self, x, rngs: nnx.Rngs)`` passing them on, ``self.dropout1(x, rngs=rngs)``).
For a ``__call__`` with an argument ``rngs`` (positional, keyword-only, required or
defaulting to None: :func:`takes_call_rngs`) the member is called with an ``nnx.Rngs``
drawn exactly as the module-held streams are, from the member's key for the step, in
training mode, and with ``rngs=None`` in inference mode (:func:`call_arguments`).

Path keys are strings (a list index ``0`` is ``"0"``), so a checkpoint is a nested dict
that stock orbax writes and reads.

Inside the train step a member's batch may be split over mesh axis ``'data'``. As for
Linen members (:mod:`ensemble_core.train.forward`), the member's whole batch is the unit
of its batch-dependent and stochastic layers: every ``nnx.BatchNorm`` averages its
statistics over ``'data'`` (its ``axis_name`` is set to the data axis; the ``'batch'`` of
a network written for ``pmap`` is replaced), and every ``nnx.Dropout`` draws its mask for
the whole batch and keeps this shard's rows (:class:`WholeBatchDropout`). NNX has no
method interception; the merged module is a fresh object on every call, so these
attributes are set on it directly and the user's code is used unchanged.

Requires Flax >= :data:`MIN_FLAX` (``nnx.iter_modules``, ``Variable.set_value``,
``nnx.capture``).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jaxtyping import Array, Float, Key

from ensemble_core.errors import ConfigError
from ensemble_core.mesh import DATA_AXIS
from ensemble_core.train import whole_batch

#: The oldest Flax whose NNX API this module is written against (and tested with).
MIN_FLAX = (0, 12)
#: The collection that is a member's trainable parameters, Linen's name, for both APIs
#: (:mod:`ensemble_core.train.forward` reads it from here); every other collection is
#: mutable state updated in training mode.
PARAMS = "params"
#: Collections named as Linen names them; other variable types are named after their type.
COLLECTIONS: tuple[tuple[type, str], ...] = ((nnx.Param, PARAMS), (nnx.BatchStat, "batch_stats"))
#: The argument of ``__call__`` that takes the call's RNG streams, as Flax's current NNX
#: examples and guides name it (``examples/mnist/train.py``: ``__call__(self, x, rngs)``).
CALL_RNGS = "rngs"


def flax_version() -> tuple[int, ...]:
    """The installed Flax's version as integers (``"0.12.8"`` -> ``(0, 12, 8)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", flax.__version__)[:3])


def require_nnx(name: str) -> None:
    """Refuse an NNX network on a Flax older than :data:`MIN_FLAX`.

    Raises:
      ConfigError: one line naming the installed version and the fix.
    """
    if flax_version() < MIN_FLAX:
        need = ".".join(map(str, MIN_FLAX))
        raise ConfigError(
            f"model.name '{name}' is a flax.nnx network, and NNX members need Flax >= {need}; "
            f"this environment has Flax {flax.__version__}",
            fix=f"pip install 'flax>={need}' (the project's own install does), or write the network with flax.linen",
        )


def collection_name(variable_type: type) -> str:
    """The collection of a variable type: ``"params"`` for ``nnx.Param`` (and subclasses),
    ``"batch_stats"`` for ``nnx.BatchStat``, else the type's name in snake case."""
    for base, name in COLLECTIONS:
        if issubclass(variable_type, base):
            return name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", variable_type.__name__).lower()


@dataclasses.dataclass(frozen=True, eq=False)
class NnxNetwork:
    """An NNX member network: how to construct it, and its structure.

    Attributes:
      name: ``model.name`` (for messages).
      module_type: the class of the module the constructor returns.
      construct: ``construct(rngs: nnx.Rngs) -> nnx.Module``: one member, initialised from
        ``rngs`` (the user's class or function with ``model.options``, ``num_classes`` and
        ``rngs=``).
      graphdef: ``nnx.split``'s graph definition (the module's static structure).
      template: the module's abstract non-RNG state (``jax.ShapeDtypeStruct`` values).
      rng_template: its abstract RNG state (every ``nnx.RngStream``'s key and count).
    """

    name: str
    module_type: type
    construct: Callable[[nnx.Rngs], nnx.Module]
    graphdef: Any
    template: Any
    rng_template: Any

    @classmethod
    def from_constructor(cls, name: str, construct: Callable[[nnx.Rngs], nnx.Module]) -> NnxNetwork:
        """Trace ``construct`` abstractly (``nnx.eval_shape``: no compute, no memory) and
        keep the structure it builds.

        Raises:
          ConfigError: Flax is older than :data:`MIN_FLAX`, or ``construct`` does not
            return an ``nnx.Module``. Errors the user's constructor raises propagate.
        """
        require_nnx(name)
        abstract = nnx.eval_shape(lambda: construct(nnx.Rngs(0)))
        if not isinstance(abstract, nnx.Module):
            raise ConfigError(
                f"model.name '{name}' returned a {type(abstract).__name__}, not a flax.nnx.Module",
                fix="return the network of one member",
            )
        graphdef, rng_template, template = nnx.split(abstract, nnx.RngState, ...)  # type: ignore[misc]
        return cls(name, type(abstract), construct, graphdef, template, rng_template)

    def variables(self, module: nnx.Module) -> dict[str, Any]:
        """``module``'s arrays as collections (see the module docstring): ``{"params": {...},
        "batch_stats": {...}, ...}``, nested dicts with string keys; a collection the
        module has no variable of is absent."""
        out: dict[str, Any] = {}
        for path, variable in nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.RngState))):
            node = out.setdefault(collection_name(type(variable)), {})
            for part in path[:-1]:
                node = node.setdefault(str(part), {})
            node[str(path[-1])] = variable.get_value()
        return out

    @property
    def streams(self) -> int:
        """How many RNG streams the module holds (``nnx.RngKey`` variables): stream ``i``
        is seeded with ``fold_in(key, i)`` (:meth:`merge`), and a call-time ``rngs``
        with ``fold_in(key, streams)`` (:func:`call_rngs`)."""
        return sum(isinstance(v, nnx.RngKey) for _, v in nnx.to_flat_state(self.rng_template))

    def merge(self, variables: dict[str, Any], key: Key[Array, ""]) -> nnx.Module:
        """A module with ``variables``' arrays and every RNG stream seeded from ``key``:
        stream ``i`` (in the state's path order) gets ``fold_in(key, i)`` (split to its
        shape when a stream holds several keys) and a count of 0."""
        flat = []
        for path, variable in nnx.to_flat_state(self.template):
            node = variables[collection_name(type(variable))]
            for part in path:
                node = node[str(part)]
            flat.append((path, variable.replace(node)))
        streams = 0
        for path, variable in nnx.to_flat_state(self.rng_template):
            if isinstance(variable, nnx.RngKey):
                stream_key = jax.random.fold_in(key, streams)
                streams += 1
                shape = tuple(variable.get_value().shape)
                value = jax.random.split(stream_key, shape) if shape else stream_key
            else:  # nnx.RngCount
                value = jnp.zeros(variable.get_value().shape, jnp.uint32)
            flat.append((path, variable.replace(value)))
        return nnx.merge(self.graphdef, nnx.from_flat_state(flat))


def takes_call_rngs(module_type: type) -> bool:
    """Whether ``module_type.__call__`` takes the call's RNG streams as an argument
    :data:`CALL_RNGS` that can be passed by name: positional or keyword-only, required
    (Flax's MNIST example: ``__call__(self, x, rngs: nnx.Rngs)``) or with a default
    (its tutorial: ``rngs: nnx.Rngs | None = None``). A positional-only one (before
    ``/``) cannot be, and is refused by the model check
    (:func:`ensemble_core.train.forward.check_call`)."""
    try:
        parameter = inspect.signature(module_type.__call__).parameters.get(CALL_RNGS)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def call_rngs(net: NnxNetwork, key: Key[Array, ""]) -> nnx.Rngs:
    """The call-time RNG streams of one call from ``key`` (the member's key for the step,
    or an MC dropout pass's key), drawn exactly as the module-held streams are
    (:meth:`NnxNetwork.merge`): one more stream, ``fold_in(key, net.streams)`` (after the
    module's own, so the two never share a key) with a count of 0, as the ``default``
    stream of an ``nnx.Rngs``, which serves every stream name (``rngs.dropout()``,
    ``rngs['dropout']``, ``rngs()``, ``nnx.Dropout(...)(x, rngs=rngs)``). Its masks depend
    on the member and the step only: the same on any mesh and after a resume."""
    return nnx.Rngs(jax.random.fold_in(key, net.streams))


def call_arguments(net: NnxNetwork, call: dict[str, Any], key: Key[Array, ""] | None) -> dict[str, Any]:
    """The keyword arguments of one call of the member: ``call`` (its mode argument,
    :func:`ensemble_core.train.forward.mode`) plus, for a ``__call__`` that takes
    :data:`CALL_RNGS` (:func:`takes_call_rngs`), the call's RNG streams: ``call_rngs(net,
    key)`` when ``key`` is given (training mode, an MC dropout pass), ``rngs=None``
    without one (inference mode).

    Why None in inference mode rather than a deterministic ``nnx.Rngs``: that is what
    Flax's own example passes (``examples/mnist/train.py``'s ``eval_step`` calls
    ``loss_fn(model, batch, None)``, and its export ``model(y, None)``), even though its
    signature reads ``rngs: nnx.Rngs`` without a default. In ``model.eval()`` mode
    ``nnx.Dropout`` never draws a key, so None is enough, and code written to that
    convention may read ``rngs is None`` as "inference": a deterministic ``nnx.Rngs``
    there would turn its dropout on at evaluation."""
    if not takes_call_rngs(net.module_type):
        return call
    return {**call, CALL_RNGS: None if key is None else call_rngs(net, key)}


def init_variables(net: NnxNetwork, key: Key[Array, ""]) -> dict[str, Any]:
    """One member's variables, constructed from ``nnx.Rngs(key)`` (every stream the
    module draws at construction, ``params`` included, derives from ``key``)."""
    return net.variables(net.construct(nnx.Rngs(key)))


def compute_in(module: nnx.Module, dtype: Any) -> nnx.Module:
    """``module`` (a merged copy) with every ``nnx.BatchNorm`` that infers its dtype
    (``dtype=None``) computing in ``dtype`` (None: unchanged). NNX's BatchNorm promotes its
    input with its running averages, which stay float32, so a bfloat16 activation would
    leave it as float32; with ``dtype`` it normalises in ``dtype``, computes the batch
    statistics in float32 and updates the float32 running averages in float32, as Flax's
    mixed-precision layers (``dtype=bfloat16, param_dtype=float32``) do. (Linen's BatchNorm
    takes its output dtype from its input and parameters alone.)"""
    if dtype is not None:
        for _, layer in nnx.iter_modules(module):
            if isinstance(layer, nnx.BatchNorm) and layer.dtype is None:
                layer.dtype = dtype
    return module


def apply_inference(
    net: NnxNetwork, variables: dict[str, Any], images: Float[Array, "B H W C"], call: dict[str, Any], dtype: Any = None
) -> Float[Array, "B K"]:
    """One member's logits ``[B, K]`` in inference mode (``module.eval()``: BatchNorm
    uses its running averages, dropout is off); ``call`` is the mode argument of
    ``__call__`` when it takes one (:func:`ensemble_core.train.forward.mode`); ``dtype``:
    the compute dtype of its BatchNorm layers (:func:`compute_in`; None: as written). The
    logits are float32, or ``dtype`` when ``variables``' params are ``dtype``."""
    module = compute_in(net.merge(variables, jax.random.key(0)), dtype)
    module.eval()
    return module(images, **call_arguments(net, call, None))


def training_module(
    net: NnxNetwork, variables: dict[str, Any], key: Key[Array, ""], data_shards: int, dtype: Any = None
) -> nnx.Module:
    """The member merged from ``variables`` and ``key`` (:meth:`NnxNetwork.merge`) in
    training mode (``module.train()``), its whole batch the unit of its batch-dependent
    and stochastic layers: every ``nnx.BatchNorm`` averages over axis ``'data'``, and with
    ``data_shards > 1`` every ``nnx.Dropout`` is a :class:`WholeBatchDropout`; ``dtype``:
    the compute dtype of its BatchNorm layers (:func:`compute_in`; None: as written)."""
    module = compute_in(net.merge(variables, key), dtype)
    module.train()
    for _, layer in nnx.iter_modules(module):
        if isinstance(layer, nnx.BatchNorm):
            layer.axis_name, layer.axis_index_groups = DATA_AXIS, None
        elif type(layer) is nnx.Dropout and data_shards > 1:
            object.__setattr__(layer, "__class__", WholeBatchDropout)  # this merged copy only
    return module


def apply_train(
    net: NnxNetwork,
    params: Any,
    model_state: dict[str, Any],
    images: Float[Array, "b H W C"],
    key: Key[Array, ""],
    data_shards: int,
    call: dict[str, Any],
    dtype: Any = None,
) -> tuple[Float[Array, "b K"], dict[str, Any]]:
    """One member's logits in training mode (``module.train()``) and its updated
    collections; the contract of :func:`ensemble_core.train.forward.apply_train`.

    ``key`` seeds every RNG stream of the module (its dropout), and the call's ``rngs``
    when ``__call__`` takes them (:func:`call_arguments`). ``dtype``: the compute
    dtype of its BatchNorm layers (:func:`compute_in`; None: as written). Must run where
    mesh axis ``'data'`` is bound (the train step's ``shard_map``, or a ``vmap`` naming it).
    """
    module = training_module(net, {PARAMS: params, **model_state}, key, data_shards, dtype)
    logits = module(images, **call_arguments(net, call, key))
    updated = net.variables(module)
    return logits, {name: updated[name] for name in model_state}


def layer_outputs(net: NnxNetwork, variables: dict[str, Any], images: Any, call: dict[str, Any]) -> Any:
    """Every layer's output in one training-mode forward pass (``nnx.capture`` with
    ``method_outputs``: each submodule's ``__call__``), for the memory estimate. Axis
    ``'data'`` must be bound."""
    key = jax.random.key(0)
    module = training_module(net, variables, key, 1)
    arguments = call_arguments(net, call, key)
    _, captured = nnx.capture(module, nnx.Intermediate, method_outputs=nnx.Intermediate)(images, **arguments)
    return captured


def dropout_key(layer: nnx.Dropout, rngs: Any = None) -> Any:
    """The key an ``nnx.Dropout`` call draws its mask from (flax 0.12's rule): the call's
    ``rngs`` or else the layer's own, an ``nnx.Rngs`` (its ``rng_collection`` stream), an
    ``nnx.RngStream`` (called) or a key as it is."""
    source = layer.rngs if rngs is None else rngs
    if isinstance(source, nnx.Rngs):
        return source[layer.rng_collection]()
    if isinstance(source, nnx.RngStream):
        return source()
    return source


class WholeBatchDropout(nnx.Dropout):
    """``nnx.Dropout`` (flax 0.12) with the mask of the member's whole batch over axis
    ``'data'`` (:func:`ensemble_core.train.whole_batch.dropout`): an example gets the same
    mask on 1 or 8 data shards."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        key = dropout_key(self, rngs)
        return whole_batch.dropout(inputs, key, self.rate, self.broadcast_dims, lax.axis_size(DATA_AXIS))
