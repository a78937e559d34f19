"""The ensemble's train state: every member's parameters and optimizer state on a leading axis ``E``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int, Key

from ensemble_core.errors import ConfigError
from ensemble_core.mesh import member_sharding, replicated
from ensemble_core.train.forward import Network, init_variables, split_variables, user_output
from ensemble_core.train.nnx_member import PARAMS
from ensemble_core.train.optimizer import set_hyperparameters


@flax.struct.dataclass
class BestTracking:
    """Each member's best epoch so far on the validation split, and early stopping.

    Attributes:
      params: every member's parameters at its best epoch (leaves ``[E, ...]``).
      model_state: every member's mutable collections at its best epoch (``{}`` for a
        params-only module; leaves ``[E, ...]``).
      nll: float32 ``[E]``: the criterion's value at that epoch, lower is better (inf before
        the first): the validation NLL (nats), or for ``criterion="validation_error"`` the
        validation error rate (1 - accuracy).
      epoch: int32 ``[E]``: the best epoch, 1-based (0 before the first).
      stopped_epoch: int32 ``[E]``: the epoch after which the member stopped updating
        (``train.patience`` epochs without improvement), 0 while it trains.
      criterion: ``"validation_nll"`` or ``"validation_error"`` (static: not a leaf, not
        checkpointed; it comes from the config the state is built or restored with).
    """

    if TYPE_CHECKING:  # flax.struct.dataclass adds it; declared for the type checker

        def replace(self, **changes: Any) -> BestTracking: ...

    params: Any
    model_state: Any
    nll: Float[Array, " E"]
    epoch: Int[Array, " E"]
    stopped_epoch: Int[Array, " E"]
    criterion: str = flax.struct.field(pytree_node=False, default="validation_nll")


@flax.struct.dataclass
class EnsembleState:
    """Every member's parameters, mutable collections and optimizer state, stacked on a
    leading axis ``E``.

    ``model_state`` is each member's mutable Flax collections, e.g. ``{"batch_stats":
    {...}}`` for a network with BatchNorm (``{}`` for a params-only one): updated by the
    train step in training mode, used by inference (:func:`~ensemble_core.train.forward.apply_inference`).
    ``label_smoothing`` float32 ``[E]`` is each member's label smoothing (its learning
    rate and weight decay live in ``opt_state.hyperparams``); ``best`` is None without a
    validation split. ``evaluate_final`` (static, from ``train.member_choice: final``) makes
    the latest parameters the evaluated ones even when best epochs are tracked.
    """

    if TYPE_CHECKING:  # flax.struct.dataclass adds it; declared for the type checker

        def replace(self, **changes: Any) -> EnsembleState: ...

    step: Int[Array, ""]
    params: Any
    opt_state: Any
    healthy: Bool[Array, " E"]  # False once a member's loss or parameters went non-finite
    label_smoothing: Float[Array, " E"]
    model_state: Any
    best: BestTracking | None = None
    evaluate_final: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def active(self) -> Bool[Array, " E"]:
        """Members still updating: not stopped early (diverged members are ``~healthy``)."""
        if self.best is None:
            return jnp.ones_like(self.healthy)
        return self.best.stopped_epoch == 0

    @property
    def final_params(self) -> Any:
        """The parameters evaluated: each member's best epoch's with a validation split
        (``train.member_choice`` best_*), else the latest."""
        return self.final_variables[PARAMS]

    @property
    def variables(self) -> dict[str, Any]:
        """The latest Flax variables of every member: ``{"params": ..., **model_state}``, leaves ``[E, ...]``."""
        return {PARAMS: self.params, **self.model_state}

    @property
    def final_variables(self) -> dict[str, Any]:
        """The variables evaluated (:attr:`final_params` with the same epoch's collections)."""
        if self.best is None or self.evaluate_final:
            return self.variables
        return {PARAMS: self.best.params, **self.best.model_state}


def init_ensemble(
    model: Network,
    tx: optax.GradientTransformation,
    init_keys: Key[Array, " E"],
    image_shape: tuple[int, ...],
    mesh: Mesh,
    hyperparameters: list[dict] | None = None,
    track_best: bool = False,
    member_choice: str = "best_validation_nll",
    abstract: bool = False,
) -> EnsembleState:
    """Initialise E members, member i from ``init_keys[i]`` only (in inference mode, as
    Flax's examples do: :func:`~ensemble_core.train.forward.init_variables`).

    Args:
      init_keys: typed keys ``[E]`` (see :func:`ensemble_core.rngs.member_keys`).
      image_shape: ``(H, W, C)``.
      hyperparameters: E dicts (:func:`ensemble_core.hyper.member_hyperparameters`):
        member i's ``learning_rate`` and ``weight_decay`` go into its optimizer state
        (:func:`~ensemble_core.train.optimizer.set_hyperparameters`; the train step
        replaces the learning rate by each step's), its ``label_smoothing`` into the
        state; None keeps ``tx``'s values and no smoothing.
      track_best: start a :class:`BestTracking` (there is a validation split).
      member_choice: ``train.member_choice``: ``"best_validation_nll"`` and ``"final"``
        track the best epoch by validation NLL, ``"best_validation_accuracy"`` by
        validation error; ``"final"`` evaluates the latest parameters.
      abstract: return the state's shapes, dtypes and shardings only
        (``jax.ShapeDtypeStruct`` leaves; the network traced once, nothing computed or
        allocated): the target a checkpoint is restored onto.

    Returns:
      An :class:`EnsembleState` whose leaves are ``[E, ...]``, sharded over ``'ensemble'``
      (with ``abstract``, their ``jax.ShapeDtypeStruct``).

    Raises:
      ConfigError: ``hyperparameters`` does not hold E dicts.
    """
    e = init_keys.shape[0]
    if hyperparameters is not None and len(hyperparameters) != e:
        raise ConfigError(f"{len(hyperparameters)} members' hyperparameters for {e} members")

    def column(name: str) -> np.ndarray | None:
        return None if hyperparameters is None else np.asarray([hp[name] for hp in hyperparameters], np.float32)

    def init_one(key):
        params, model_state = split_variables(init_variables(model, key, image_shape))
        return params, model_state, tx.init(params)

    def init_all(keys, per_member):
        params, model_state, opt_state = jax.vmap(init_one)(keys)
        opt_state = set_hyperparameters(opt_state, {k: per_member[k] for k in ("learning_rate", "weight_decay")})
        smoothing = per_member.get("label_smoothing")
        best = None
        if track_best:
            best = BestTracking(
                params=params,
                model_state=model_state,
                nll=jnp.full(keys.shape, jnp.inf, jnp.float32),
                epoch=jnp.zeros(keys.shape, jnp.int32),
                stopped_epoch=jnp.zeros(keys.shape, jnp.int32),
                criterion="validation_error" if member_choice == "best_validation_accuracy" else "validation_nll",
            )
        return EnsembleState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=opt_state,
            healthy=jnp.ones(keys.shape, jnp.bool_),
            label_smoothing=jnp.zeros(keys.shape, jnp.float32) if smoothing is None else smoothing,
            model_state=model_state,
            best=best,
            evaluate_final=member_choice == "final",
        )

    per_member = {name: column(name) for name in ("learning_rate", "weight_decay", "label_smoothing")}
    # one capture of what a user's network prints, traced and run (jax.debug.print) alike
    with user_output(model, "initialised"):
        shapes = jax.eval_shape(init_all, init_keys, per_member)
        shardings = state_shardings(shapes, mesh)
        # abstract: no second trace (jit below), and no block_until_ready on tracers, whose
        # AttributeError message JAX builds by printing the whole traced program (jax-ml/jax#40041)
        if abstract:
            return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
        return jax.block_until_ready(jax.jit(init_all, out_shardings=shardings)(init_keys, per_member))


def state_shardings(state: EnsembleState, mesh: Mesh) -> EnsembleState:
    """The sharding of every leaf: step replicated, members over ``'ensemble'``."""
    ms = member_sharding(mesh)
    return jax.tree.map(lambda _: ms, state).replace(step=replicated(mesh))


def unstacked(tree: Any, i: int) -> Any:
    """Member ``i`` of a struct-of-arrays pytree (leaves ``[E, ...]`` -> ``[...]``)."""
    return jax.tree.map(lambda x: x[i], tree)
