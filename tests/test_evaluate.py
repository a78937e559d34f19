"""Vmapped (struct-of-arrays) evaluation equals a per-member Python loop."""

import jax
import numpy as np
import pytest

from ensemble_core.data import to_float
from ensemble_core.predict import member_probs
from ensemble_core.train import unstacked
from tests.ensembles import small_setup


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_name, strategy, data_axis, grouped",
    [("cnn", "vmap", 1, False), ("cnn", "unroll", 2, False), ("cnn", "unroll", 1, True), ("mlp", "vmap", 4, False)],
)
def test_vmapped_evaluation_equals_member_loop(mnist_test, model_name, strategy, data_axis, grouped):
    images = mnist_test[0][:230]  # not a multiple of the chunk: exercises padding
    e = 4
    built = small_setup(model_name, e, strategy, data=data_axis, ensemble=2)
    model, mesh = built.model, built.mesh
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    predict = built.predict_fn()
    got = member_probs(predict, state.variables, images, mesh, batch_size=100, one_member_per_device=grouped)
    assert got.shape == (e, 230, 10) and got.dtype == np.float32
    for m in range(e):
        logits = model.apply({"params": unstacked(state.params, m)}, to_float(images))
        np.testing.assert_allclose(got[m], np.asarray(jax.nn.softmax(logits)), atol=1e-6)


def test_a_setup_traces_its_network_once_however_often_it_predicts(mnist_test):
    """``EnsembleSetup.predict_fn`` gives one function per kind (probabilities, logits): a
    second prediction on images of the same shape traces nothing (a new function each call
    traced the network again, inside the evaluators' timed passes)."""
    images = mnist_test[0][:64]
    built = small_setup("mlp", 4, "vmap", data=1, ensemble=4)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    traces: list[str] = []

    def on_event(event: str, _seconds: float, **_kwargs) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":  # jax._src.dispatch.JAXPR_TRACE_EVENT
            traces.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        counts = []
        for logits in (False, False, True, True):
            member_probs(built.predict_fn(logits=logits), state.variables, images, built.mesh, batch_size=64)
            counts.append(len(traces))
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    first, again, first_logits, again_logits = counts
    assert first > 0 and again == first, counts
    assert first_logits > again and again_logits == first_logits, counts
