"""The epoch loop: run the jitted train step over epochs, with callbacks and no I/O of its own."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypedDict

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Int, Key, UInt8

from ensemble_core.mesh import DATA_AXIS, ENSEMBLE_AXIS, host_value
from ensemble_core.output_capture import captured_output, output_released
from ensemble_core.rngs import epoch_order
from ensemble_core.train.forward import network_name, user_network
from ensemble_core.train.state import EnsembleState


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
    """A :class:`DataPosition`; sums given as arrays (float32 ``[E]``) are stored as lists."""
    as_list = lambda x: None if x is None else host_value(x).tolist()  # noqa: E731
    return DataPosition(
        epoch=epoch, step_in_epoch=step_in_epoch, loss_sum=as_list(loss_sum), accuracy_sum=as_list(accuracy_sum)
    )


def fit(
    state: EnsembleState,
    train_step: Callable,
    images: UInt8[Array, "N H W C"],
    labels: Int[Array, " N"],
    data_keys: Key[Array, " E"],
    mesh: Mesh,
    *,
    stochastic_keys: Key[Array, " E"],
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
      train_step: the jitted step of :func:`~ensemble_core.train.step.make_train_step`.
      images, labels: the training split on device (see
        :func:`~ensemble_core.train.step.make_train_step`).
      data_keys: typed keys ``[E]``.
      stochastic_keys: typed keys ``[E]``, each member's key for dropout and augmentation
        (the ``"stochastic"`` keys of :func:`ensemble_core.rngs.member_keys`).
      start: the :class:`DataPosition` to resume from; its sums make the resumed epoch's
        means come out as if it had not been interrupted.
      learning_rates: ``learning_rates(epoch) -> float32 [steps, E]`` (see
        :func:`~ensemble_core.train.optimizer.learning_rate_table`); None keeps the rates
        in the optimizer state.
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
      callbacks excluded), ``order_seconds`` (each epoch's data order and learning rates,
      and its first batch staged), ``steps`` (run in this call), and ``stopped_at`` (None, or
      the :class:`DataPosition` where it stopped).

    What a user's network prints while its steps run (``jax.debug.print``, a host callback
    that prints or logs) is captured from the first step to the last and logged once,
    bounded (:func:`ensemble_core.output_capture.captured_output`), the validation passes of
    ``end_of_epoch`` included; the other callbacks' own output (checkpoints, progress)
    goes out as it would.
    """
    with contextlib.ExitStack() as running:
        return _fit(
            running,
            state,
            train_step,
            images,
            labels,
            data_keys,
            mesh,
            stochastic_keys=stochastic_keys,
            epochs=epochs,
            batch_size=batch_size,
            start=start,
            learning_rates=learning_rates,
            end_of_epoch=end_of_epoch,
            on_step=on_step,
            on_epoch_end=on_epoch_end,
            should_stop=should_stop,
        )


def _fit(
    running: contextlib.ExitStack,
    state: EnsembleState,
    train_step: Callable,
    images,
    labels,
    data_keys,
    mesh: Mesh,
    *,
    stochastic_keys,
    epochs: int,
    batch_size: int,
    start: DataPosition | None,
    learning_rates: Callable[[int], np.ndarray] | None,
    end_of_epoch: Callable[[int, EnsembleState], tuple[EnsembleState, dict]] | None,
    on_step: Callable[[int, int, int], None] | None,
    on_epoch_end: Callable[[int, EnsembleState, dict], None] | None,
    should_stop: Callable[[], bool] | None,
) -> tuple[EnsembleState, dict]:
    network = getattr(train_step, "network", None)
    idx_sharding = NamedSharding(mesh, P(ENSEMBLE_AXIS, DATA_AXIS))
    lr_sharding = NamedSharding(mesh, P(ENSEMBLE_AXIS))
    n = int(images.shape[0])
    compiled = None
    timing: dict = {"compile_seconds": 0.0, "train_seconds": 0.0, "steps": 0, "stopped_at": None}
    timing["order_seconds"] = 0.0
    # raw key data from the host: in a run across JAX processes each places its own rows
    stochastic_keys = jax.device_put(np.asarray(jax.random.key_data(stochastic_keys)), lr_sharding)
    start = start or data_position(0)
    start_epoch, start_step = start["epoch"], start["step_in_epoch"]
    for epoch in range(start_epoch, epochs):
        t0 = time.perf_counter()
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
        timing["order_seconds"] += time.perf_counter() - t0
        if compiled is None:
            t0 = time.perf_counter()
            lower = train_step.lower  # type: ignore[attr-defined]  # a jax.jit-wrapped function
            compiled = lower(state, images, labels, stochastic_keys, *first).compile()
            timing["compile_seconds"] = time.perf_counter() - t0
            if network is not None and user_network(network):
                what = f"network {network_name(network)} printed while it trained (jax.debug.print, callbacks)"
                running.enter_context(captured_output(what, fds=False))
        t0 = time.perf_counter()
        resumed = start if epoch == start_epoch and first_step else None
        loss_sum = np.asarray(resumed["loss_sum"]) if resumed else 0.0
        acc_sum = np.asarray(resumed["accuracy_sum"]) if resumed else 0.0
        nxt = first
        for s in range(first_step, steps):
            cur = nxt
            if s + 1 < steps:  # stage the next indices while this step runs
                nxt = staged(s + 1)
            state, metrics = compiled(state, images, labels, stochastic_keys, *cur)
            loss_sum = loss_sum + metrics["loss"]
            acc_sum = acc_sum + metrics["accuracy"]
            timing["steps"] += 1
            if on_step is not None:
                with output_released():
                    on_step(epoch, s, steps)
            if should_stop is not None and s + 1 < steps and _released(should_stop):
                timing["train_seconds"] += time.perf_counter() - t0
                timing["stopped_at"] = data_position(epoch, s + 1, loss_sum, acc_sum)
                return state, timing
        record = {
            "epoch": epoch + 1,
            "train_loss": (host_value(loss_sum) / steps).tolist(),
            "train_accuracy": (host_value(acc_sum) / steps).tolist(),
        }
        timing["train_seconds"] += time.perf_counter() - t0
        if end_of_epoch is not None:  # validation runs the user's network: its output is captured too
            state, extra = end_of_epoch(epoch, state)
            record.update(extra)
        if on_epoch_end is not None:
            with output_released():
                on_epoch_end(epoch, state, record)
        if should_stop is not None and epoch + 1 < epochs and _released(should_stop):
            timing["stopped_at"] = data_position(epoch + 1)
            return state, timing
    return state, timing


def _released(should_stop: Callable[[], bool]) -> bool:
    with output_released():
        return should_stop()
