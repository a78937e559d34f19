"""Struct-of-arrays ensemble training: one jitted step updates every member.

The ensemble state is one pytree whose leaves carry a leading member axis ``E``
(``params``, ``opt_state``). The step is a ``jax.shard_map`` over the mesh
``('ensemble', 'data')``: each device holds ``E / ensemble`` members and ``B / data``
examples of each member's batch; gradients are averaged over ``'data'`` (the
data-parallel pattern: a psum of each shard's share of the batch-mean loss gradient).
The training split lives on device (uint8, replicated), so a step only ships its
``[E, B]`` int32 indices: data loading never blocks the accelerator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypedDict

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Bool, Float, Int, UInt8

from ensemble_core.config import TrainConfig
from ensemble_core.data import to_float
from ensemble_core.errors import ConfigError
from ensemble_core.mesh import DATA_AXIS, ENSEMBLE_AXIS, host_value, member_sharding, replicated
from ensemble_core.rngs import epoch_order

STRATEGIES = ("vmap", "unroll")


@flax.struct.dataclass
class BestTracking:
    """Each member's best epoch so far on the validation split, and early stopping.

    Attributes:
      params: every member's parameters at its best epoch (leaves ``[E, ...]``).
      nll: float32 ``[E]``: the validation NLL (nats) of that epoch (inf before the first).
      epoch: int32 ``[E]``: the best epoch, 1-based (0 before the first).
      stopped_epoch: int32 ``[E]``: the epoch after which the member stopped updating
        (``train.patience`` epochs without improvement), 0 while it trains.
    """

    params: Any
    nll: Float[Array, " E"]
    epoch: Int[Array, " E"]
    stopped_epoch: Int[Array, " E"]


@flax.struct.dataclass
class EnsembleState:
    """Every member's parameters and optimizer state, stacked on a leading axis ``E``.

    ``label_smoothing`` float32 ``[E]`` is each member's label smoothing (its learning
    rate and weight decay live in ``opt_state.hyperparams``); ``best`` is None without a
    validation split.
    """

    step: Int[Array, ""]
    params: Any
    opt_state: Any
    healthy: Bool[Array, " E"]  # False once a member's loss or parameters went non-finite
    label_smoothing: Float[Array, " E"]
    best: BestTracking | None = None

    @property
    def active(self) -> Bool[Array, " E"]:
        """Members still updating: not stopped early (diverged members are ``~healthy``)."""
        if self.best is None:
            return jnp.ones_like(self.healthy)
        return self.best.stopped_epoch == 0

    @property
    def final_params(self) -> Any:
        """The parameters evaluated: each member's best epoch's with a validation split,
        else the latest."""
        return self.params if self.best is None else self.best.params


# MARK: building blocks


def _sgd(learning_rate, weight_decay, momentum):
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate, momentum=momentum))


def _adam(learning_rate, weight_decay):
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """The optax optimizer named by ``cfg.optimizer`` (HOWTO default: SGD 0.1, momentum 0.9).

    Weight decay is optax's ``add_decayed_weights`` before SGD or Adam (an L2 term in the
    gradient) and AdamW's own decoupled decay (Loshchilov & Hutter 2019). Wrapped in
    ``optax.schedules.inject_hyperparams`` (the optax way to change hyperparameters during
    training), so learning rate and weight decay live in the optimizer state: per member
    (leading axis E) once the state is stacked, set per member by :func:`init_ensemble`
    and, for the learning rate, by every train step.
    """
    if cfg.optimizer == "sgd":
        return optax.schedules.inject_hyperparams(_sgd)(
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, momentum=cfg.momentum or None
        )
    if cfg.optimizer == "adam":
        return optax.schedules.inject_hyperparams(_adam)(learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return optax.schedules.inject_hyperparams(optax.adamw)(
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
    raise ConfigError(f"unknown train.optimizer '{cfg.optimizer}'; fix: use sgd, adam or adamw")


def learning_rate_schedule(hyperparameters: dict, steps_per_epoch: int, epochs: int) -> optax.Schedule:
    """One member's optax learning-rate schedule over ``epochs * steps_per_epoch`` steps.

    ``constant``: ``optax.schedules.constant_schedule``; ``cosine``: ``optax.schedules.cosine_decay_schedule``
    to 0 at the last step; ``warmup_cosine``: ``optax.schedules.warmup_cosine_decay_schedule`` from 0,
    peak ``learning_rate`` after ``round(warmup_epochs * steps_per_epoch)`` steps (at least
    1, fewer than the total), then cosine decay to 0 (Loshchilov & Hutter 2017, SGDR).
    """
    lr, kind = hyperparameters["learning_rate"], hyperparameters["schedule"]
    total = max(1, epochs * steps_per_epoch)
    if kind == "constant":
        return optax.schedules.constant_schedule(lr)
    if kind == "cosine":
        return optax.schedules.cosine_decay_schedule(lr, decay_steps=total)
    if kind == "warmup_cosine":
        warmup = min(max(1, round(hyperparameters["warmup_epochs"] * steps_per_epoch)), total - 1)
        if warmup < 1:
            return optax.schedules.cosine_decay_schedule(lr, decay_steps=total)
        return optax.schedules.warmup_cosine_decay_schedule(0.0, lr, warmup_steps=warmup, decay_steps=total)
    raise ConfigError(f"unknown train.schedule '{kind}'; fix: use constant, cosine or warmup_cosine")


def learning_rate_table(hyperparameters: list[dict], steps_per_epoch: int, epochs: int) -> Callable[[int], np.ndarray]:
    """``rates(epoch) -> float32 [steps_per_epoch, E]``: every member's learning rate at
    each step of ``epoch`` (0-based), from its :func:`learning_rate_schedule` evaluated on
    the host at global steps ``epoch * steps_per_epoch + s``."""
    schedules = [learning_rate_schedule(hp, steps_per_epoch, epochs) for hp in hyperparameters]

    def rates(epoch: int) -> np.ndarray:
        t = np.arange(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        cols = [np.broadcast_to(np.asarray(f(t), np.float32), t.shape) for f in schedules]
        return np.stack(cols, axis=1)

    return rates


def default_strategy(backend: str) -> str:
    """How members on one device are mapped: 'unroll' on CPU, 'vmap' elsewhere.

    On XLA:CPU a vmapped convolution becomes a grouped convolution, several times slower
    than separate convolutions; on GPU/TPU vmap batches members into bigger kernels.
    """
    return "unroll" if backend == "cpu" else "vmap"


def map_members(fn: Callable, strategy: str) -> Callable:
    """Map ``fn`` over the leading member axis of all its arguments and outputs.

    ``'vmap'`` uses ``jax.vmap``; ``'unroll'`` traces ``fn`` once per member and stacks
    the results (separate, ungrouped kernels).
    """
    if strategy == "vmap":
        return jax.vmap(fn)
    if strategy != "unroll":
        raise ConfigError(f"unknown member strategy '{strategy}'; fix: use one of {STRATEGIES}")

    def unrolled(*args):
        n = jax.tree.leaves(args)[0].shape[0]
        outs = [fn(*jax.tree.map(lambda x, i=i: x[i], args)) for i in range(n)]
        return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

    return unrolled


def init_ensemble(
    model: nn.Module,
    tx: optax.GradientTransformation,
    init_keys: jax.Array,
    image_shape: tuple[int, ...],
    mesh: Mesh,
    hyperparameters: list[dict] | None = None,
    track_best: bool = False,
) -> EnsembleState:
    """Initialise E members, member i from ``init_keys[i]`` only.

    Args:
      init_keys: typed keys ``[E]`` (see :func:`ensemble_core.rngs.member_keys`).
      image_shape: ``(H, W, C)``.
      hyperparameters: E dicts (:func:`ensemble_core.hyper.member_hyperparameters`):
        member i's ``learning_rate`` and ``weight_decay`` go into its optimizer state,
        its ``label_smoothing`` into the state; None keeps ``tx``'s values and no smoothing.
      track_best: start a :class:`BestTracking` (there is a validation split).

    Returns:
      An :class:`EnsembleState` whose leaves are ``[E, ...]``, sharded over ``'ensemble'``.
    """
    e = init_keys.shape[0]
    if hyperparameters is not None and len(hyperparameters) != e:
        raise ConfigError(f"{len(hyperparameters)} members' hyperparameters for {e} members")

    def column(name: str) -> np.ndarray | None:
        return None if hyperparameters is None else np.asarray([hp[name] for hp in hyperparameters], np.float32)

    def init_one(key):
        params = model.init(key, jnp.zeros((1, *image_shape), jnp.float32))["params"]
        return params, tx.init(params)

    def init_all(keys, per_member):
        params, opt_state = jax.vmap(init_one)(keys)
        for name in ("learning_rate", "weight_decay"):
            if per_member.get(name) is not None and name in opt_state.hyperparams:
                opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, name: per_member[name]})
        smoothing = per_member.get("label_smoothing")
        best = None
        if track_best:
            best = BestTracking(
                params=params,
                nll=jnp.full(keys.shape, jnp.inf, jnp.float32),
                epoch=jnp.zeros(keys.shape, jnp.int32),
                stopped_epoch=jnp.zeros(keys.shape, jnp.int32),
            )
        return EnsembleState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=opt_state,
            healthy=jnp.ones(keys.shape, jnp.bool_),
            label_smoothing=jnp.zeros(keys.shape, jnp.float32) if smoothing is None else smoothing,
            best=best,
        )

    per_member = {name: column(name) for name in ("learning_rate", "weight_decay", "label_smoothing")}
    abstract = jax.eval_shape(init_all, init_keys, per_member)
    return jax.jit(init_all, out_shardings=state_shardings(abstract, mesh))(init_keys, per_member)


def state_shardings(state: EnsembleState, mesh: Mesh) -> EnsembleState:
    """The sharding of every leaf: step replicated, members over ``'ensemble'``."""
    ms = member_sharding(mesh)
    return jax.tree.map(lambda _: ms, state).replace(step=replicated(mesh))


# MARK: the step


def cross_entropy(
    model: nn.Module, params: Any, images, labels, label_smoothing: float | jax.Array = 0.0
) -> tuple[jax.Array, jax.Array]:
    """One member's softmax cross-entropy on a batch: the loss every member trains on.

    Args:
      params: one member's parameters (no member axis).
      images: uint8 ``[B, H, W, C]`` (scaled to [0, 1] here); labels: int ``[B]``.
      label_smoothing: ``a`` in [0, 1): the target is ``(1 - a) * onehot + a / C``
        (Szegedy et al. 2016; ``optax.losses.smooth_labels``), written as
        ``(1 - a) * CE + a * mean_c(-log p_c)``, so ``a = 0`` is exactly the plain loss.

    Returns:
      ``(losses, logits)``: float32 ``[B]`` per-example losses in nats
      (``optax.losses.softmax_cross_entropy_with_integer_labels`` when ``a = 0``) and
      float32 ``[B, C]`` logits.
    """
    logits = model.apply({"params": params}, to_float(images))
    losses = optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels)
    uniform = -jnp.mean(jax.nn.log_softmax(logits), axis=-1)
    smoothed = losses + label_smoothing * (uniform - losses)
    return jnp.where(label_smoothing > 0, smoothed, losses), logits


def default_donate(platform: str) -> bool:
    """Whether the train step donates the state buffers: yes, except on CPU.

    Donating lets XLA update parameters and optimizer state in place (no second copy of
    the state in device memory), which matters on GPU/TPU. On XLA:CPU (jaxlib 0.10) the
    donated HOWTO CNN step measured 1.3-1.5x slower than the same step without donation
    (docs/benchmarks.md), and host memory is not the constraint.
    """
    return platform != "cpu"


def train_compiler_options(platform: str) -> dict[str, str]:
    """XLA options the train step is compiled with on ``platform`` ('cpu', 'gpu', 'tpu').

    On CPU: ``xla_cpu_experimental_ynn_fusion_type=""``, i.e. no YNNPACK fusions in the
    train step. With jaxlib 0.10, XLA:CPU hands convolutions, reductions and elementwise
    ops to YNNPACK fusions that materialise broadcast constants at full activation size
    and run the convolutions' backward passes slowly; without them the HOWTO CNN's step
    measured 1.3-1.7x faster (docs/benchmarks.md). Evaluation keeps them: its forward
    convolutions are faster with YNNPACK. Other platforms: no options.
    """
    return {"xla_cpu_experimental_ynn_fusion_type": ""} if platform == "cpu" else {}


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    strategy: str = "vmap",
    donate: bool | None = None,
) -> Callable:
    """Build ``train_step(state, images, labels, indices, learning_rates=None) -> (state, metrics)``.

    ``donate``: donate ``state`` to the step (None: :func:`default_donate` for the
    mesh's platform). A donated state must not be used after the call. The step is
    compiled with :func:`train_compiler_options` for the mesh's platform.

    Args of the returned (jitted) function:
      state: :class:`EnsembleState`, leaves ``[E, ...]``.
      images: uint8 ``[N, H, W, C]``, the training split, replicated on the mesh.
      labels: int32 ``[N]``, replicated.
      indices: int32 ``[E, B]``: member e trains on ``images[indices[e]]``; sharded
        ``P('ensemble', 'data')``.
      learning_rates: float32 ``[E]``: each member's learning rate for this step (from
        :func:`learning_rate_table`), written into its optimizer state before the update;
        None keeps the rates in the state.

    Returns:
      The new state and ``{"loss": float32 [E], "accuracy": float32 [E]}``: each member's
      mean training loss (nats, with its label smoothing) and accuracy on its batch,
      before the update. A member whose loss or updated parameters are not finite keeps
      its previous parameters and optimizer state and is marked ``healthy=False`` for
      good; a member stopped early (``state.active`` False) keeps them too.
    """

    data_size = mesh.shape[DATA_AXIS]

    def member_update(params, opt_state, healthy, active, smoothing, lr, images, labels):
        # Each data shard holds B / data examples; its share of the batch-mean loss is its
        # sum over the global batch size. Params are invariant over 'data', so under
        # shard_map's varying-manual-axes typing the gradient w.r.t. them is psum-ed over
        # 'data' by JAX itself (the transpose of the implicit pvary): the sum of the
        # shares' gradients is the gradient of the global batch mean.
        global_batch = labels.shape[0] * data_size

        def loss_fn(p):
            losses, logits = cross_entropy(model, p, images, labels, smoothing)
            return losses.sum() / global_batch, logits

        (share, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        correct = jnp.sum(jnp.argmax(logits, -1) == labels) / global_batch
        loss, accuracy = lax.psum((share, correct), DATA_AXIS)
        opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": lr})
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
        return masked(new_params, params), masked(new_opt_state, opt_state), still_healthy, loss, accuracy

    def local(params, opt_state, healthy, active, smoothing, lr, images, labels, indices):
        return map_members(member_update, strategy)(
            params, opt_state, healthy, active, smoothing, lr, images[indices], labels[indices]
        )

    members = P(ENSEMBLE_AXIS)
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(members,) * 6 + (P(), P(), P(ENSEMBLE_AXIS, DATA_AXIS)),
        out_specs=(members,) * 5,
    )

    def train_step(state: EnsembleState, images, labels, indices, learning_rates=None):
        if learning_rates is None:
            learning_rates = state.opt_state.hyperparams["learning_rate"]
        params, opt_state, healthy, loss, accuracy = sharded(
            state.params,
            state.opt_state,
            state.healthy,
            state.active,
            state.label_smoothing,
            learning_rates,
            images,
            labels,
            indices,
        )
        new = state.replace(step=state.step + 1, params=params, opt_state=opt_state, healthy=healthy)
        return new, {"loss": loss, "accuracy": accuracy}

    platform = mesh.devices.flat[0].platform
    if donate is None:
        donate = default_donate(platform)
    return jax.jit(
        train_step,
        donate_argnames=("state",) if donate else (),
        compiler_options=train_compiler_options(platform),
    )


# MARK: the epoch loop


class DataPosition(TypedDict):
    """Where training is in the data: saved with every checkpoint, resumed from.

    ``epoch`` (0-based, the epoch in progress), ``step_in_epoch`` (steps of it done), and
    the per-member sums ``loss_sum``/``accuracy_sum`` (lists of E floats) of those steps,
    None at an epoch boundary.
    """

    epoch: int
    step_in_epoch: int
    loss_sum: list[float] | None
    accuracy_sum: list[float] | None


def data_position(epoch: int, step_in_epoch: int = 0, loss_sum=None, accuracy_sum=None) -> DataPosition:
    """A :class:`DataPosition`; sums given as arrays are stored as lists."""
    as_list = lambda x: None if x is None else host_value(x).tolist()  # noqa: E731
    return DataPosition(
        epoch=epoch, step_in_epoch=step_in_epoch, loss_sum=as_list(loss_sum), accuracy_sum=as_list(accuracy_sum)
    )


def fit(
    state: EnsembleState,
    train_step: Callable,
    images: UInt8[Array, "N H W C"],
    labels: Int[Array, " N"],
    data_keys: jax.Array,
    mesh: Mesh,
    *,
    epochs: int,
    batch_size: int,
    start: DataPosition | None = None,
    learning_rates: Callable[[int], np.ndarray] | None = None,
    end_of_epoch: Callable[[int, EnsembleState], tuple[EnsembleState, dict]] | None = None,
    on_step: Callable[[int, int, int], None] | None = None,
    on_epoch_end: Callable[[int, EnsembleState, dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[EnsembleState, dict]:
    """Train from ``start`` (default: the beginning) to the end of epoch ``epochs - 1``.

    No I/O of its own. Member e's batches in epoch k come from
    :func:`ensemble_core.rngs.epoch_order` with ``data_keys[e]``, so resuming at any
    (epoch, step) position continues the exact data order.

    Args:
      images, labels: the training split on device (see :func:`make_train_step`).
      data_keys: typed keys ``[E]``.
      start: the :class:`DataPosition` to resume from; its sums make the resumed epoch's
        means come out as if it had not been interrupted.
      learning_rates: ``learning_rates(epoch) -> float32 [steps, E]`` (see
        :func:`learning_rate_table`); None keeps the rates in the optimizer state.
      end_of_epoch: ``end_of_epoch(epoch, state) -> (state, extra)`` after each epoch's
        last step (e.g. :func:`ensemble_core.validation.make_validation`); ``extra`` is
        merged into the epoch's record.
      on_step: ``on_step(epoch, step_in_epoch, steps_per_epoch)`` after each dispatched step.
      on_epoch_end: ``on_epoch_end(epoch, state, record)`` where record holds
        ``train_loss``/``train_accuracy`` lists of length E (epoch means).
      should_stop: polled after every step; when it returns True, training stops at that
        step boundary.

    Returns:
      The state and a dict: ``compile_seconds`` (lowering+compiling the step, 0 if no
      step ran), ``train_seconds`` (steady-state wall time of all steps, checkpoint
      callbacks excluded), ``steps`` (run in this call), and ``stopped_at`` (None, or
      the :class:`DataPosition` where it stopped).
    """
    idx_sharding = NamedSharding(mesh, P(ENSEMBLE_AXIS, DATA_AXIS))
    lr_sharding = NamedSharding(mesh, P(ENSEMBLE_AXIS))
    n = int(images.shape[0])
    compiled = None
    timing: dict = {"compile_seconds": 0.0, "train_seconds": 0.0, "steps": 0, "stopped_at": None}
    start = start or data_position(0)
    start_epoch, start_step = start["epoch"], start["step_in_epoch"]
    for epoch in range(start_epoch, epochs):
        order = epoch_order(data_keys, epoch, n, batch_size)  # [S, E, B]
        steps = order.shape[0]
        first_step = start_step if epoch == start_epoch else 0
        if first_step >= steps:
            continue
        rates = None if learning_rates is None else learning_rates(epoch)

        def staged(s: int, order=order, rates=rates) -> tuple:
            if rates is None:
                return (jax.device_put(order[s], idx_sharding),)
            return jax.device_put(order[s], idx_sharding), jax.device_put(rates[s], lr_sharding)

        first = staged(first_step)
        if compiled is None:
            t0 = time.perf_counter()
            compiled = train_step.lower(state, images, labels, *first).compile()
            timing["compile_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        resumed = start if epoch == start_epoch and first_step else None
        loss_sum = np.asarray(resumed["loss_sum"]) if resumed else 0.0
        acc_sum = np.asarray(resumed["accuracy_sum"]) if resumed else 0.0
        nxt = first
        for s in range(first_step, steps):
            cur = nxt
            if s + 1 < steps:  # stage the next indices while this step runs
                nxt = staged(s + 1)
            state, metrics = compiled(state, images, labels, *cur)
            loss_sum = loss_sum + metrics["loss"]
            acc_sum = acc_sum + metrics["accuracy"]
            timing["steps"] += 1
            if on_step is not None:
                on_step(epoch, s, steps)
            if should_stop is not None and s + 1 < steps and should_stop():
                timing["train_seconds"] += time.perf_counter() - t0
                timing["stopped_at"] = data_position(epoch, s + 1, loss_sum, acc_sum)
                return state, timing
        record = {
            "epoch": epoch + 1,
            "train_loss": (host_value(loss_sum) / steps).tolist(),
            "train_accuracy": (host_value(acc_sum) / steps).tolist(),
        }
        timing["train_seconds"] += time.perf_counter() - t0
        if end_of_epoch is not None:
            state, extra = end_of_epoch(epoch, state)
            record.update(extra)
        if on_epoch_end is not None:
            on_epoch_end(epoch, state, record)
        if should_stop is not None and epoch + 1 < epochs and should_stop():
            timing["stopped_at"] = data_position(epoch + 1)
            return state, timing
    return state, timing


def unstacked(tree: Any, i: int) -> Any:
    """Member ``i`` of a struct-of-arrays pytree."""
    return jax.tree.map(lambda x: x[i], tree)
