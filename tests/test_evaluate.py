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


@pytest.mark.parametrize("strategy, ensemble_axis", [("vmap", 1), ("unroll", 2)])
def test_a_new_program_is_compiled_on_one_chunk_and_the_timed_pass_compiles_nothing(
    mnist_test, monkeypatch, strategy, ensemble_axis
):
    """``Members.predict`` compiles a program it has not run on one chunk of one member group
    (``compile_member_probs``), then times a pass that compiles nothing. The warm-up on the
    first ``eval.batch_size`` images it replaced pushed 4 chunks through a vmapped network
    (250 images, 62 a chunk) and both member groups through an unrolled one."""
    from ensemble_core.ensemble_setup import EnsembleSetup
    from ensemble_core.runs.ensemble.load import Members

    images = mnist_test[0][:230]
    built = small_setup("mlp", 4, strategy, data=1, ensemble=ensemble_axis)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    calls: list[int] = []  # images of every call of the network's program
    compiles: list[str] = []
    compiled_before: list[int] = []  # programs compiled before each call
    original = EnsembleSetup.predict_fn

    def counted_predict_fn(setup, **kwargs):
        program = original(setup, **kwargs)

        def counted(variables, x):
            calls.append(x.shape[0])
            compiled_before.append(len(compiles))
            return program(variables, x)

        return counted

    def on_event(event: str, _seconds: float, **_kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":  # jax._src.dispatch.BACKEND_COMPILE_EVENT
            compiles.append(event)

    monkeypatch.setattr(EnsembleSetup, "predict_fn", counted_predict_fn)
    members = Members(
        variables=state.variables, setup=built, rows=np.arange(4), healthy=np.ones(4, bool), expand=np.arange(4)
    )
    cfg = built.config
    assert cfg.eval.batch_size == 250
    chunk = 250 // 4 if strategy == "vmap" else 230  # images per call: 4 members a device / one member a device
    passes = -(-230 // chunk) * (1 if strategy == "vmap" else 2)  # calls of one pass over the 230 images
    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        probs, throughput = members.predict(cfg, images)
        first = (len(calls), len(compiles))
        again, _ = members.predict(cfg, images)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert calls[0] == chunk and first[0] == 1 + passes, calls  # the warm-up: one call
    # the timed passes compile nothing (the member slices of an unrolled network included)
    assert compiled_before[1] == first[1] == len(compiles), (compiled_before, compiles)
    assert len(calls) == 1 + 2 * passes, calls
    assert first[1] > 0 and throughput > 0
    np.testing.assert_array_equal(again, probs)
    reference = member_probs(built.predict_fn(), state.variables, images, built.mesh, 250)
    np.testing.assert_allclose(probs, reference, atol=1e-6)


def test_no_images_is_refused_in_one_line_before_any_program_runs(monkeypatch):
    """Zero images: ``member_probs`` and ``compile_member_probs`` refuse with the problem and
    the fix before the network is called (an empty join used to fail in NumPy's words)."""
    from ensemble_core.predict import compile_member_probs

    built = small_setup("mlp", 2, "vmap", data=1, ensemble=1)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    called: list[int] = []
    predict = built.predict_fn()

    def counted(variables, x):
        called.append(len(x))
        return predict(variables, x)

    empty = np.zeros((0, 28, 28, 1), np.uint8)
    for fn in (member_probs, compile_member_probs):
        with pytest.raises(ValueError, match=r"no images to predict .*; fix: pass at least one image"):
            fn(counted, state.variables, empty, built.mesh, 250)
    assert called == []
