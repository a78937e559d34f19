"""The loss and the jitted train step: one step updates every member.

The step is a ``jax.shard_map`` over the mesh ``('ensemble', 'data')``: each device holds
``E / ensemble`` members and ``B / data`` examples of each member's batch; gradients are
averaged over ``'data'`` (the data-parallel pattern: a psum of each shard's share of the
batch-mean loss gradient). The training split lives on device (uint8, replicated), so a
step only ships its ``[E, B]`` int32 indices and ``[E]`` learning rates; augmentation
happens on device, inside the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int, Key, UInt8, UInt32

from ensemble_core.data import to_float
from ensemble_core.mesh import DATA_AXIS, ENSEMBLE_AXIS
from ensemble_core.train.augment import augment
from ensemble_core.train.forward import Network, apply_train, check_precision, user_output
from ensemble_core.train.members import map_members
from ensemble_core.train.optimizer import set_hyperparameters
from ensemble_core.train.state import EnsembleState

# MARK: the loss


def cross_entropy(
    logits: Float[Array, "B C"],
    labels: Int[Array, " B"],
    label_smoothing: float | Float[Array, ""] = 0.0,
) -> Float[Array, " B"]:
    """One member's softmax cross-entropy on a batch: the loss every member trains on.

    Args:
      logits: float32 ``[B, C]``; labels: int ``[B]``.
      label_smoothing: ``a`` in [0, 1): the target is ``(1 - a) * onehot + a / C``
        (Szegedy et al. 2016; ``optax.losses.smooth_labels``), written as
        ``(1 - a) * CE + a * mean_c(-log p_c)``, so ``a = 0`` is exactly the plain loss.

    Returns:
      float32 ``[B]`` per-example losses in nats
      (``optax.losses.softmax_cross_entropy_with_integer_labels`` when ``a = 0``).
    """
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels)
    uniform = -jnp.mean(jax.nn.log_softmax(logits), axis=-1)
    smoothed = losses + label_smoothing * (uniform - losses)
    return jnp.where(label_smoothing > 0, smoothed, losses)


def step_keys(member_key: Key[Array, ""], step: Int[Array, ""]) -> tuple[Key[Array, ""], Key[Array, ""]]:
    """A member's ``(dropout, augmentation)`` keys for global step ``step``:
    ``fold_in(fold_in(member_key, step), 0 | 1)``. They depend on the member's key (from
    ``(seed, member index)``, :func:`ensemble_core.rngs.member_keys`) and the step only,
    never on a device or process index, so a resumed run and a run on another mesh draw
    the same dropout masks and augmentations."""
    key = jax.random.fold_in(member_key, step)
    return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


# MARK: compilation


def default_donate(platform: str) -> bool:
    """Whether the train step donates the state buffers: yes, except on CPU.

    Donating lets XLA update parameters and optimizer state in place (no second copy of
    the state in device memory), which matters on GPU/TPU. On XLA:CPU (jaxlib 0.10) the
    donated Flax MNIST CNN step measured 1.3-1.5x slower than the same step without donation
    (docs/benchmarks.md), and host memory is not the constraint.
    """
    return platform != "cpu"


def train_compiler_options(platform: str, batch_norm: bool = False) -> dict[str, str]:
    """XLA options the train step is compiled with on ``platform`` ('cpu', 'gpu', 'tpu').

    On CPU, for members without mutable collections: ``xla_cpu_experimental_ynn_fusion_type=""``,
    i.e. no YNNPACK fusions in the train step. With jaxlib 0.10, XLA:CPU hands convolutions,
    reductions and elementwise ops to YNNPACK fusions that materialise broadcast constants
    at full activation size and run the convolutions' backward passes slowly; without them
    the Flax MNIST CNN's step measured 1.3-1.7x faster (docs/benchmarks.md). Evaluation
    keeps them: its forward convolutions are faster with YNNPACK.

    With ``batch_norm`` (members with mutable collections) the step keeps XLA's defaults:
    XLA's own CPU convolutions round differently for different batch sizes, and BatchNorm
    amplifies that rounding (a CIFAR ResNet at initialisation: 1e-7 to 3e-2 of a step's
    update), so a member whose batch is split over ``'data'`` would train differently from
    the same member on one device; YNNPACK's convolutions agree across batch splits to
    2e-5 of an update (``benchmarks/topology.py``). The price measured on ResNet-20 is
    about 10% of its per-member loop's speed (docs/benchmarks.md). Other platforms: no options.
    """
    return {"xla_cpu_experimental_ynn_fusion_type": ""} if platform == "cpu" and not batch_norm else {}


# MARK: the step


def make_train_step(
    model: Network,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    strategy: str = "vmap",
    donate: bool | None = None,
    *,
    crop_padding: int = 0,
    flip: bool = False,
    precision: str = "float32",
) -> Callable:
    """Build ``train_step(state, images, labels, member_keys, indices, learning_rates=None) -> (state, metrics)``.

    ``donate``: donate ``state`` to the step (None: :func:`default_donate` for the
    mesh's platform). A donated state must not be used after the call. The step is
    compiled with :func:`train_compiler_options` for the mesh's platform and for members
    with or without mutable collections (whichever the state it gets holds).
    ``crop_padding``/``flip``: the on-device augmentation ``data.augment``
    (:func:`ensemble_core.train.augment.augment`), drawn per member and per step.
    ``precision``: ``train.precision``, the compute precision of the forward and backward
    pass (:mod:`ensemble_core.train.forward`): with ``bfloat16`` the float32 params and the
    images are cast to bfloat16 inside the differentiated loss, so the gradients, the
    update, the optimizer state and the params stay float32, and the loss and accuracy
    are computed from float32 logits; ``high`` traces matmuls and convolutions at
    ``Precision.HIGH``; ``float32`` is the step as it was before the setting.

    Every member runs in training mode (:func:`~ensemble_core.train.forward.apply_train`):
    its mutable collections (BatchNorm's ``batch_stats``) are updated from the statistics
    of its own whole batch, whatever the mesh, and its dropout and augmentation draw from
    :func:`step_keys` of its key and the global step.

    Args of the returned (jitted) function:
      state: :class:`~ensemble_core.train.state.EnsembleState`, leaves ``[E, ...]``.
      images: uint8 ``[N, H, W, C]``, the training split, replicated on the mesh.
      labels: int32 ``[N]``, replicated.
      member_keys: uint32 ``[E, 2]``, the raw key data (``jax.random.key_data``) of each
        member's ``"stochastic"`` key (:func:`ensemble_core.rngs.member_keys`), sharded
        ``P('ensemble')``; raw data, so that every JAX process can place its rows from a
        host array.
      indices: int32 ``[E, B]``: member e trains on ``images[indices[e]]``; sharded
        ``P('ensemble', 'data')``.
      learning_rates: float32 ``[E]``: each member's learning rate for this step (from
        :func:`~ensemble_core.train.optimizer.learning_rate_table`), written into its
        optimizer state before the update; None keeps the rates in the state.

    Returns:
      The new state and ``{"loss": float32 [E], "accuracy": float32 [E]}``: each member's
      mean training loss (nats, with its label smoothing) and accuracy on its batch,
      before the update. A member whose loss or updated parameters are not finite keeps
      its previous parameters, collections and optimizer state and is marked
      ``healthy=False`` for good; a member stopped early (``state.active`` False) keeps them too.

    Raises:
      ConfigError: an unknown ``precision`` (here), or an unknown ``strategy`` (when the
        step is first traced).
    """

    check_precision(precision)
    data_size = mesh.shape[DATA_AXIS]

    def member_update(params, model_state, opt_state, healthy, active, smoothing, lr, key, step, images, labels):
        # Each data shard holds B / data examples; its share of the batch-mean loss is its
        # sum over the global batch size. Params are invariant over 'data', so under
        # shard_map's varying-manual-axes typing the gradient w.r.t. them is psum-ed over
        # 'data' by JAX itself (the transpose of the implicit pvary): the sum of the
        # shares' gradients is the gradient of the global batch mean.
        local_batch = labels.shape[0]
        global_batch = local_batch * data_size
        dropout_key, augment_key = step_keys(jax.random.wrap_key_data(key), step)
        images = augment(
            augment_key,
            images,
            global_batch=global_batch,
            first_row=lax.axis_index(DATA_AXIS) * local_batch,
            crop_padding=crop_padding,
            flip=flip,
        )

        def loss_fn(p):
            # p: the float32 master params; apply_train casts them to the compute dtype, so
            # the gradient is float32, and returns float32 logits for a float32 loss.
            logits, new_model_state = apply_train(
                model, p, model_state, to_float(images), dropout_key, data_size, precision
            )
            # A network of M members (BatchEnsemble, Packed-Ensembles: logits [M, b, C])
            # trains on the mean of its members' losses (Wen et al. 2020, Sec. 3; Laurent
            # et al. 2023, Sec. 3.2), each on the whole batch.
            losses = cross_entropy(logits, jnp.broadcast_to(labels, logits.shape[:-1]), smoothing)
            return losses.reshape(-1, local_batch).mean(0).sum() / global_batch, (logits, new_model_state)

        (share, (logits, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        hits = (jnp.argmax(logits, -1) == labels).reshape(-1, local_batch)
        correct = jnp.sum(hits.mean(0)) / global_batch
        loss, accuracy = lax.psum((share, correct), DATA_AXIS)
        opt_state = set_hyperparameters(opt_state, {"learning_rate": lr})
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # A member whose loss or new parameters are not finite is frozen from now on: its
        # update is masked out here, inside the step, and the other members train on.
        finite = jnp.isfinite(loss) & jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_params)])
        )
        keep = healthy & active & finite

        def masked(new_tree, old_tree):
            return jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_tree, old_tree)

        still_healthy = healthy & (finite | ~active)  # a stopped member's step is not its own
        return (
            masked(new_params, params),
            masked(new_model_state, model_state),
            masked(new_opt_state, opt_state),
            still_healthy,
            loss,
            accuracy,
        )

    def local(params, model_state, opt_state, healthy, active, smoothing, lr, keys, step, images, labels, indices):
        def one(p, ms, o, h, a, s, r, k, idx):
            return member_update(p, ms, o, h, a, s, r, k, step, images[idx], labels[idx])

        with user_output(model, "traced for the train step"):  # one capture for every member's call
            return map_members(one, strategy)(
                params, model_state, opt_state, healthy, active, smoothing, lr, keys, indices
            )

    members = P(ENSEMBLE_AXIS)
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(members,) * 8 + (P(), P(), P(), P(ENSEMBLE_AXIS, DATA_AXIS)),
        out_specs=(members,) * 6,
    )

    def train_step(
        state: EnsembleState,
        images: UInt8[Array, "N H W C"],
        labels: Int[Array, " N"],
        member_keys: UInt32[Array, "E 2"],
        indices: Int[Array, "E B"],
        learning_rates: Float[Array, " E"] | None = None,
    ) -> tuple[EnsembleState, dict[str, Float[Array, " E"]]]:
        if learning_rates is None:
            learning_rates = state.opt_state.hyperparams["learning_rate"]
        params, model_state, opt_state, healthy, loss, accuracy = sharded(
            state.params,
            state.model_state,
            state.opt_state,
            state.healthy,
            state.active,
            state.label_smoothing,
            learning_rates,
            member_keys,
            state.step,
            images,
            labels,
            indices,
        )
        new = state.replace(
            step=state.step + 1, params=params, model_state=model_state, opt_state=opt_state, healthy=healthy
        )
        return new, {"loss": loss, "accuracy": accuracy}

    platform = mesh.devices.flat[0].platform
    if donate is None:
        donate = default_donate(platform)
    return _ByCollections(
        {
            stateful: jax.jit(
                train_step,
                donate_argnames=("state",) if donate else (),
                compiler_options=train_compiler_options(platform, batch_norm=stateful),
            )
            for stateful in (False, True)
        },
        model,
    )


class _ByCollections:
    """The jitted step, compiled with :func:`train_compiler_options` for members with or
    without mutable collections, chosen by the state it is called (or lowered) with;
    ``network`` is the member network it trains."""

    def __init__(self, steps: dict[bool, Callable], network: Network | None = None):
        self._steps = steps
        self.network = network

    def _pick(self, state: EnsembleState) -> Any:
        return self._steps[bool(jax.tree.leaves(state.model_state))]

    def __call__(self, state: EnsembleState, *args, **kwargs):
        return self._pick(state)(state, *args, **kwargs)

    def lower(self, state: EnsembleState, *args, **kwargs):
        """``jax.jit(...).lower`` of the step this state takes."""
        return self._pick(state).lower(state, *args, **kwargs)

    def unjitted(self, state: EnsembleState) -> Callable:
        """The Python function of the step this state takes, without its ``jax.jit``: what
        a FLOP count traces (``jax.make_jaxpr`` refuses a jit with compiler options
        nested in its trace; ``benchmarks/flops.py``)."""
        return self._pick(state).__wrapped__
