"""FLOPs counted from the jaxpr (benchmarks/flops.py) against hand formulas from the layers'
shapes, against XLA's own cost analysis on CPU, and the per-member loops of benchmarks/bench.py
(the fair loop, the guide's loop, the old gather loop) end to end."""

from __future__ import annotations

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

from benchmarks import bench
from benchmarks.flops import count_flops
from ensemble_core import data as data_lib  # noqa: F401  (imported before the models: ensemble_core's import order)
from ensemble_core.models.cnn import CNN


def _out_size(size: int, kernel: int, stride: int, padding) -> int:
    """Output length of one spatial dimension (the definitions of lax.conv_general_dilated's padding)."""
    if padding == "SAME":
        return -(-size // stride)
    lo, hi = (0, 0) if padding == "VALID" else padding
    return (size + lo + hi - kernel) // stride + 1


def _forward_flops(module: nn.Module, x) -> int:
    variables = module.init(jax.random.key(0), x)
    return count_flops(lambda v, x: module.apply(v, x), variables, x)


def _cnn_forward_by_hand(batch: int) -> int:
    """The registry CNN on 28x28x1: Conv32 3x3 SAME, pool, Conv64 3x3 SAME, pool, Dense256, Dense10."""
    conv1 = 2 * 28 * 28 * 32 * (3 * 3 * 1)
    conv2 = 2 * 14 * 14 * 64 * (3 * 3 * 32)
    dense1 = 2 * (7 * 7 * 64) * 256
    dense2 = 2 * 256 * 10
    return batch * (conv1 + conv2 + dense1 + dense2)


def _cnn_train_step(model: nn.Module):
    tx = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, images, labels):
        def loss_fn(p):
            logits = model.apply({"params": p}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step, tx


@pytest.mark.parametrize(("batch", "features_in", "features_out"), [(1, 3, 5), (7, 784, 512), (128, 256, 10)])
def test_dense_is_two_in_out_batch(batch, features_in, features_out):
    x = jnp.ones((batch, features_in))
    assert _forward_flops(nn.Dense(features_out), x) == 2 * features_in * features_out * batch


@pytest.mark.parametrize(
    ("hw", "c_in", "c_out", "kernel", "stride", "padding", "groups"),
    [
        ((28, 28), 1, 32, (3, 3), 1, "SAME", 1),
        ((14, 14), 32, 64, (3, 3), 1, "SAME", 1),
        ((9, 8), 3, 6, (3, 3), 2, "SAME", 1),
        ((9, 8), 3, 5, (5, 3), 2, "VALID", 1),
        ((10, 7), 4, 8, (3, 3), 1, ((0, 2), (1, 0)), 1),
        ((12, 12), 8, 16, (3, 3), 1, "SAME", 4),  # grouped: 2 input channels per group
        ((12, 12), 8, 8, (3, 3), 2, "SAME", 8),  # depthwise
    ],
)
def test_conv_is_hand_formula(hw, c_in, c_out, kernel, stride, padding, groups):
    batch = 3
    conv = nn.Conv(c_out, kernel, strides=stride, padding=padding, feature_group_count=groups)
    x = jnp.ones((batch, *hw, c_in))
    pads = [padding, padding] if isinstance(padding, str) else list(padding)
    h_out = _out_size(hw[0], kernel[0], stride, pads[0])
    w_out = _out_size(hw[1], kernel[1], stride, pads[1])
    by_hand = 2 * h_out * w_out * c_out * kernel[0] * kernel[1] * (c_in // groups) * batch
    assert _forward_flops(conv, x) == by_hand


def test_cnn_forward_is_the_sum_of_its_layers():
    x = jnp.ones((16, 28, 28, 1))
    assert _forward_flops(CNN(), x) == _cnn_forward_by_hand(16)


def test_cnn_forward_agrees_with_xla_on_cpu():
    if jax.default_backend() != "cpu":
        pytest.skip("XLA's GPU cost analysis leaves out cuDNN's convolutions: the comparison is a CPU one")
    model, x = CNN(), jnp.ones((128, 28, 28, 1))
    variables = model.init(jax.random.key(0), x[:1])
    fn = jax.jit(lambda v, x: model.apply(v, x))
    cost = fn.lower(variables, x).compile().cost_analysis()
    xla = float((cost[0] if isinstance(cost, list) else cost)["flops"])
    counted = count_flops(fn, variables, x)
    assert abs(counted - xla) / xla < 0.2, (counted, xla)


def test_cnn_training_step_is_about_three_forwards():
    model = CNN()
    x, y = jnp.ones((32, 28, 28, 1)), jnp.zeros((32,), jnp.int32)
    params = model.init(jax.random.key(0), x[:1])["params"]
    step, tx = _cnn_train_step(model)
    train = count_flops(step, params, tx.init(params), x, y)
    forward = _cnn_forward_by_hand(32)
    assert 2.5 < train / forward < 3.5
    # as executed: forward, every kernel's gradient (a forward's worth), every input's
    # gradient but the first convolution's (the images need none)
    assert train == 3 * forward - 32 * 2 * 28 * 28 * 32 * (3 * 3 * 1)


def test_nested_jit_and_scan_are_counted():
    w = jnp.ones((4, 6))
    one = 2 * 3 * 4 * 6  # a [3, 4] @ [4, 6] product

    def inner(a):
        return a @ w

    assert count_flops(jax.jit(lambda a: jax.jit(inner)(a)), jnp.ones((3, 4))) == one

    square = jnp.ones((4, 4))

    def scanned(a):
        def body(carry, _):
            return carry @ square, None

        return jax.lax.scan(body, a, None, length=4)[0]

    assert count_flops(scanned, jnp.ones((3, 4))) == 4 * (2 * 3 * 4 * 4)


def test_vmap_cond_and_remat():
    w = jnp.ones((4, 6))
    one = 2 * 3 * 4 * 6
    assert count_flops(jax.vmap(lambda a: a @ w), jnp.ones((5, 3, 4))) == 5 * one  # the mapped axis in the shapes

    # cond: one branch runs, the larger counts
    def branches(a, p):
        return jax.lax.cond(p, lambda a: a @ w, lambda a: a[:, :1] * w[:1], a)

    assert count_flops(branches, jnp.ones((3, 4)), True) == one
    assert count_flops(jax.checkpoint(lambda a: a @ w), jnp.ones((3, 4))) == one


def test_precision_overrides():
    assert bench.precision_overrides("float32") == {}
    assert bench.precision_overrides("bfloat16") == {"train": {"precision": "bfloat16"}}
    with pytest.raises(ValueError, match="unknown precision"):
        bench.precision_overrides("fp8")


def _mlp_forward_by_hand() -> int:
    """The registry MLP (hidden 512, 512) on 28x28x1 images, per image."""
    return 2 * (784 * 512 + 512 * 512 + 512 * 10)


@pytest.mark.slow
def test_loop_worker_end_to_end(tfds_dir, capsys):
    """The bench's loop worker (``--method loop``) for a small MLP ensemble: every loop is
    timed, the fair loop is the faster of its two feeds, and the FLOPs it records are the
    MLP's by hand (training: every weight gradient, the input gradient of all but the first layer)."""
    bench.main(
        [
            *("--worker", "--model", "mlp", "--size", "2", "--method", "loop"),
            *("--steps", "2", "--repeats", "1", "--data-dir", tfds_dir, "--skip-same-options"),
        ]
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rates = {name: out[f"train_member_images_per_s_{name}"] for name in bench.LOOPS}
    assert all(r > 0 for r in rates.values()), rates
    assert out["train_member_images_per_s"] == max(rates["fair_host"], rates["fair_device"])
    assert out["fair_variant"] in ("host", "device")
    assert out["fair_over_guide"] == pytest.approx(out["train_member_images_per_s"] / rates["guide"])
    evals = (out["eval_member_images_per_s_host"], out["eval_member_images_per_s_device"])
    assert out["eval_member_images_per_s"] == max(evals)
    forward = _mlp_forward_by_hand()
    assert out["eval_flops_per_image"] == forward
    assert out["train_flops_per_image"] == 3 * forward - 2 * 784 * 512
    assert math.isclose(out["xla_train_flops_per_image"], out["train_flops_per_image"], rel_tol=0.2)
    row = bench.compare("mlp", 2, {**out, "train_member_images_per_s": 2 * rates["fair_host"]}, out)
    assert row["train_speedup"] == pytest.approx(2 * rates["fair_host"] / out["train_member_images_per_s"])
    assert row["train_speedup_guide"] == pytest.approx(2 * rates["fair_host"] / rates["guide"])
    bench.add_roofline([row])
    achieved = out["train_member_images_per_s"] * row["train_flops_per_image"] / 1e9
    assert row["loop"]["train_gflops_per_s"] == pytest.approx(achieved)
