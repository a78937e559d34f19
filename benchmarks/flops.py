"""FLOPs of a JAX function counted from its jaxpr, independently of XLA's cost analysis.

    from benchmarks.flops import count_flops
    count_flops(train_step, params, model_state, opt_state, images, labels, key)  # FLOPs of one call

The roofline of :mod:`benchmarks.bench` needs the FLOPs a training step performs. XLA's
``compiled.cost_analysis()`` is not a stable measure of them: on GPU it leaves out the
convolutions handed to cuDNN (custom calls), so the Flax MNIST CNN's training step came out
at 5.1 MFLOP per image there against 25.7 on CPU. This module counts them from the program
JAX traces (``jax.make_jaxpr``), before XLA sees it, the same on every backend.

What is counted, per executed equation, with the shapes of its operands as traced:

- ``dot_general``: ``2 * prod(batch dims) * prod(free dims of lhs) * prod(free dims of rhs)
  * prod(contracting dims)``, i.e. two FLOPs (a multiply and an add) per multiply-accumulate.
- ``conv_general_dilated``: ``2 * (output elements) * (kernel spatial size * input
  channels per feature group)``; the kernel's input-feature dimension already holds the
  channels per group (``C_in / feature_group_count``), and with ``batch_group_count`` it is
  still the channels each output element sums over. Padding, strides and dilations enter
  through the output's shape; with ``lhs_dilation`` (the input gradient of a strided
  convolution) the products with the inserted zeros are counted, as XLA executes them.

Everything else (elementwise ops, reductions, pooling written as reshape and mean,
``exp``/``log`` of the softmax, the optimizer's update) counts 0: the roofline compares the
step with the machine's matmul peak, and these are a small share of a convolutional
network's work (about 2% of the MNIST CNN's training step: some 50,000 activations per image
against 27 MFLOP of products). XLA's CPU cost analysis counts them, but leaves out the
products with a ``'SAME'`` convolution's padding zeros, so for that CNN it comes out about
6% below this count (forward 8.7 against 9.3 MFLOP per image). Nested jaxprs are walked:
``jit`` (``pjit``), ``closed_call``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``
(``checkpoint``), ``shard_map`` (its body's shapes are one shard's, so it counts once per
device of its manual mesh axes), ``cond`` (the most expensive branch, since one runs),
``scan`` (its body times ``length``) and ``while`` (body and condition once each: the trip
count is not known from the jaxpr). ``vmap`` needs nothing: the traced shapes carry the
mapped axis. A training step traced with ``jax.grad`` inside shows the backward pass's
convolutions and matrix products as they are executed (for a convolution: one for the
kernel's gradient, one for the input's where the input needs a gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn

#: primitives whose FLOPs are counted; every other primitive counts 0 (or its nested jaxprs')
COUNTED = ("dot_general", "conv_general_dilated")


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in var.aval.shape)


def dot_general_flops(eqn: JaxprEqn) -> int:
    """FLOPs of one ``dot_general`` equation: ``2 * prod(batch) * prod(lhs free) *
    prod(rhs free) * prod(contracting)`` from its operands' shapes and
    ``dimension_numbers`` (``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``, as
    ``jax.lax.dot_general`` defines them).

    Raises:
      ValueError: ``eqn`` is not a ``dot_general``.
    """
    if eqn.primitive.name != "dot_general":
        raise ValueError(f"not a dot_general equation: {eqn.primitive.name}")
    lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    batch = math.prod(lhs[d] for d in lhs_batch)
    contract = math.prod(lhs[d] for d in lhs_contract)
    lhs_free = math.prod(n for d, n in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch))
    rhs_free = math.prod(n for d, n in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch))
    return 2 * batch * lhs_free * rhs_free * contract


def conv_flops(eqn: JaxprEqn) -> int:
    """FLOPs of one ``conv_general_dilated`` equation: ``2 * (output elements) * (kernel
    spatial size * kernel input features)``, the kernel's input-feature dimension being
    the input channels per feature group (``jax.lax.conv_general_dilated``'s layout; its
    ``dimension_numbers.rhs_spec`` is ``(out feature, in feature, *spatial)``).

    Raises:
      ValueError: ``eqn`` is not a ``conv_general_dilated``.
    """
    if eqn.primitive.name != "conv_general_dilated":
        raise ValueError(f"not a conv_general_dilated equation: {eqn.primitive.name}")
    rhs = _shape(eqn.invars[1])
    out = _shape(eqn.outvars[0])
    rhs_spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, *spatial)
    kernel_spatial = math.prod(rhs[d] for d in rhs_spec[2:])
    in_features = rhs[rhs_spec[1]]
    return 2 * math.prod(out) * kernel_spatial * in_features


def _sub_jaxprs(value: Any) -> Iterator[Jaxpr]:
    """The jaxprs in one equation parameter (a jaxpr, a closed jaxpr, or a tuple/list of them)."""
    if isinstance(value, ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _sub_jaxprs(v)


def _shard_map_devices(eqn: JaxprEqn) -> int:
    """How many times a ``shard_map`` body runs: the devices along its manual mesh axes."""
    mesh = eqn.params.get("mesh")
    axes: Iterable[str] | None = None
    for name in ("newly_manual_axes", "manual_axes", "axis_names"):  # the name changed across JAX versions
        if eqn.params.get(name) is not None:
            axes = eqn.params[name]
            break
    if mesh is None:
        return 1
    shape = dict(mesh.shape)
    return math.prod(shape[a] for a in (axes if axes is not None else shape))


def eqn_flops(eqn: JaxprEqn) -> int:
    """FLOPs of one equation, with the equations of the jaxprs nested in it (the rules of
    this module's docstring: ``scan`` bodies times their length, ``cond`` the largest
    branch, ``shard_map`` bodies once per device of their manual axes, elementwise ops 0).
    """
    name = eqn.primitive.name
    if name == "dot_general":
        return dot_general_flops(eqn)
    if name == "conv_general_dilated":
        return conv_flops(eqn)
    if name == "cond":
        return max((jaxpr_flops(b) for b in _sub_jaxprs(eqn.params["branches"])), default=0)
    nested = sum(jaxpr_flops(j) for value in eqn.params.values() for j in _sub_jaxprs(value))
    if name == "scan":
        return int(eqn.params["length"]) * nested
    if name == "shard_map":
        return _shard_map_devices(eqn) * nested
    return nested


def jaxpr_flops(jaxpr: Jaxpr | ClosedJaxpr) -> int:
    """FLOPs of one execution of ``jaxpr``: the sum of :func:`eqn_flops` over its equations.

    Returns:
      FLOPs (multiply and add counted separately) of its matrix products and convolutions.
    """
    inner = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    return sum(eqn_flops(e) for e in inner.eqns)


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """FLOPs of one call ``fn(*args, **kwargs)``, counted from ``jax.make_jaxpr(fn)``.

    ``fn`` may be jitted or not, and may contain ``jax.grad``, ``vmap``, ``scan``, nested
    ``jit`` and the other transformations of this module's docstring. Arguments may be
    arrays or ``jax.ShapeDtypeStruct``s (only shapes and dtypes are used; nothing runs).

    Returns:
      FLOPs of its ``dot_general`` and ``conv_general_dilated`` equations, as executed
      (this module's docstring gives the formulas; elementwise work counts 0).

    Raises:
      whatever tracing ``fn`` raises (e.g. ``TypeError`` for arguments of the wrong shape).
    """
    return jaxpr_flops(jax.make_jaxpr(fn)(*args, **kwargs))
