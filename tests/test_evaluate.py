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
