"""The memory check before compute: its estimate against what training really allocates,
and a refusal with the figures, through the command line, before anything is compiled."""

import math
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from ensemble_core import ensemble_setup as setup
from ensemble_core import memory
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]


def _cfg(*extra):
    return load_config(None, ["ensemble.size=8", *extra])


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, slots",
    [
        (["model.name=cnn", "train.optimizer=sgd"], 1),
        (["model.name=mlp", "model.hidden_sizes=[64, 32]", "train.optimizer=adam"], 2),
        (["model.name=mlp", "model.hidden_sizes=[16]", "train.optimizer=sgd", "train.momentum=0"], 0),
        (["model.name=mlp", "model.hidden_sizes=[16]", "data.validation_fraction=0"], 1),
        (["model.name=tests.user_models.bn_dropout_net:build", "model.options={width: 8}"], 1),
        (["model.name=tests.user_models.nnx_nets:BNDropoutNet", "model.options={width: 8}"], 1),  # flax.nnx
        (["model.name=resnet", "model.options={depth: 8, width: 4}", "data.validation_fraction=0"], 1),
    ],
)
def test_persistent_state_matches_what_init_allocates(extra, slots):
    """Parameters, optimizer slots and mutable collections (batch_stats) of every member on
    a device, as estimated from shapes, against the bytes of the arrays init_ensemble really
    places on one device."""
    cfg = _cfg(*extra)
    plan = setup.plan(cfg)
    est = memory.estimate(cfg, plan, 10, (28, 28, 1), 1000)
    built = setup.build(cfg, 10)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    device = jax.devices()[0]
    on_device = sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves((state.params, state.model_state, state.opt_state, state.best))
        for shard in leaf.addressable_shards
        if shard.device == device and leaf.ndim > 0
    )
    params = sum(math.prod(p.shape[1:]) for p in jax.tree.leaves(state.params))
    collections = sum(math.prod(p.shape[1:]) for p in jax.tree.leaves(state.model_state))
    assert est.params_per_member == params and est.collection_elements == collections
    assert ("batch_stats" in state.model_state) == ("model.name=mlp" not in extra and "model.name=cnn" not in extra)
    persistent = est.state_bytes - est.params_per_member * 4  # less one member's gradients
    best = 1 if cfg.has_validation else 0  # each member's best-epoch parameters and collections
    m = est.members_per_device
    assert persistent == m * params * 4 * (1 + slots + best) + m * collections * 4 * (1 + best)
    # the real arrays: the estimate plus a few scalars per member (learning rate, counts)
    assert persistent <= on_device <= persistent + 64 * est.members_per_device


def test_training_split_and_activations():
    cfg = _cfg("model.name=mlp", "model.hidden_sizes=[100]", "train.batch_size=32", "mesh.member_strategy=vmap")
    est = memory.estimate(cfg, setup.plan(cfg), 10, (28, 28, 1), 1000, "vmap")
    assert est.data_bytes == 1000 * (28 * 28 + 4)
    # per member: the hidden layer (32 x 100) and the logits (32 x 10, as Dense_1 and __call__)
    assert est.activation_bytes == est.members_per_device * 32 * (100 + 10 + 10) * 4
    unrolled = memory.estimate(cfg, setup.plan(cfg), 10, (28, 28, 1), 1000, "unroll")
    assert unrolled.activation_bytes == 32 * (100 + 10 + 10) * 4


def test_augmentation_buffers_are_counted():
    """A padded and an augmented uint8 copy of the batch per member mapped at once."""
    base = ("model.name=mlp", "model.hidden_sizes=[16]", "train.batch_size=32", "mesh.member_strategy=vmap")
    plain = memory.estimate(_cfg(*base), setup.plan(_cfg(*base)), 10, (32, 32, 3), 1000, "vmap")
    cfg = _cfg(*base, "data.augment={crop_padding: 4, flip: true}")
    est = memory.estimate(cfg, setup.plan(cfg), 10, (32, 32, 3), 1000, "vmap")
    assert plain.augmentation_bytes == 0
    assert est.augmentation_bytes == est.members_per_device * 32 * (40 * 40 * 3 + 32 * 32 * 3)
    assert est.per_device_bytes - plain.per_device_bytes == est.augmentation_bytes


def test_check_refuses_with_the_figures_and_accepts_what_fits():
    cfg = _cfg("model.name=cnn")
    est = memory.estimate(cfg, setup.plan(cfg), 10, (28, 28, 1), 4000)
    need = est.per_device_bytes * est.devices  # CPU: the simulated devices share the host
    memory.check(est, cfg, available=(need, "available host memory"))  # fits exactly
    with pytest.raises(ConfigError) as err:
        memory.check(est, cfg, available=(need - 1, "available host memory"))
    msg = str(err.value)
    assert f"needs at least {need / memory.GIB:.1f} GiB" in msg and "fix:" in msg and "\n" not in msg


@pytest.mark.slow  # the CLI in a subprocess
def test_cli_refuses_an_ensemble_that_cannot_fit_before_compiling(tmp_path, tfds_dir, prefect_api):
    """1024 members of 73.6 M parameters: over 500 GiB of parameters and momentum, refused
    in seconds with the figure, exit 2, nothing written (it used to compile for minutes)."""
    out = tmp_path / "runs"
    args = ["--set", f"data.data_dir={tfds_dir}", "--set", "model.name=mlp", "--set", "model.hidden_sizes=[8192, 8192]"]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "flows.train_ensemble", *args, "--set", "ensemble.size=1024", "--output-dir", str(out)],
        cwd=ROOT,
        env=cli_env(prefect_api),  # the session's server: no temporary server of its own (tests/prefect_api.py)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: training ensemble.size=1024") and "GiB" in line and "fix:" in line
    needed = float(line.split("needs at least ")[1].split(" GiB")[0])
    assert needed > 500
    assert not out.exists()
    assert time.monotonic() - started < 120
