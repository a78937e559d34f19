"""Vmapped (struct-of-arrays) evaluation equals a per-member Python loop."""

import jax
import numpy as np
import pytest

from ensemble_core import mesh as mesh_lib
from ensemble_core import rngs
from ensemble_core.config import ModelConfig, TrainConfig
from ensemble_core.data import to_float
from ensemble_core.evaluate import make_predict, member_probs
from ensemble_core.models import build_model
from ensemble_core.train import init_ensemble, make_optimizer, unstacked


@pytest.mark.parametrize(
    "model_name, strategy, data_axis, grouped",
    [("cnn", "vmap", 1, False), ("cnn", "unroll", 2, False), ("cnn", "unroll", 1, True), ("mlp", "vmap", 4, False)],
)
def test_vmapped_evaluation_equals_member_loop(mnist_test, model_name, strategy, data_axis, grouped):
    images = mnist_test[0][:230]  # not a multiple of the chunk: exercises padding
    e = 4
    model = build_model(ModelConfig(name=model_name, hidden_sizes=(32,)), 10)
    plan = mesh_lib.plan_mesh(e, 8, data=data_axis, ensemble=2)
    mesh = mesh_lib.make_mesh(plan)
    keys = rngs.member_keys(0, e)
    state = init_ensemble(model, make_optimizer(TrainConfig()), keys["init"], (28, 28, 1), mesh)
    predict = make_predict(model, mesh, strategy)
    got = member_probs(predict, state.params, images, mesh, batch_size=100, one_member_per_device=grouped)
    assert got.shape == (e, 230, 10) and got.dtype == np.float32
    for m in range(e):
        logits = model.apply({"params": unstacked(state.params, m)}, to_float(images))
        np.testing.assert_allclose(got[m], np.asarray(jax.nn.softmax(logits)), atol=1e-6)
