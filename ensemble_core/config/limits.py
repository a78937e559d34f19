"""Limits of the config's values: what JAX, optax and the file reader can actually take.

Each bound says where it comes from; the schema (:mod:`ensemble_core.config.sections`) uses
them as pydantic field bounds.
"""

from __future__ import annotations

import struct

#: Largest root seed. With JAX's default (x64 disabled) ``jax.random.key(seed)`` accepts any
#: int in [-2**63, 2**63) but keeps only its low 32 bits (measured with jax 0.10.2):
#: ``key(2**32)`` is ``key(0)`` and ``key(-1)`` is ``key(2**32 - 1)``, and 2**63 raises
#: OverflowError. Seeds are therefore [0, 2**32 - 1]: every accepted seed gives its own keys.
MAX_SEED = 2**32 - 1
#: Epoch k's data order is ``fold_in(data_key, k)``, which takes a uint32 (k = 2**32 raises
#: OverflowError), so the last epoch index is 2**32 - 1.
MAX_EPOCHS = 2**32
#: Array dimensions (batch sizes) beyond int32 cannot be built.
MAX_DIM = 2**31 - 1
#: MLP limits: width of one hidden layer, number of hidden layers, and the hidden-to-hidden
#: weights of one member (2**28 float32 = 1 GiB, e.g. one 16384 x 16384 layer).
MAX_WIDTH = 65536
MAX_DEPTH = 64
MAX_HIDDEN_WEIGHTS = 2**28
#: A config file larger than this is not a config.
MAX_CONFIG_BYTES = 1 << 20
#: Prefect's limit on a flow run's (and a deployment's) parameters, JSON-serialised
#: (``PREFECT_SERVER_API_MAX_PARAMETER_SIZE``, default 524,288 bytes in Prefect 3.9): a
#: config that passes our checks but not Prefect's died in a 48-line traceback (issue 43).
PREFECT_MAX_PARAMETER_BYTES = 524_288
#: The most a validated config may take as compact JSON: below Prefect's limit, with room
#: for the flow's other parameters (output_dir, run_name). The one limit every entry point
#: applies (load_config and the flow's own validation of a deployment's parameters).
MAX_CONFIG_JSON_BYTES = PREFECT_MAX_PARAMETER_BYTES - 16_384
#: optax (inject_hyperparams) holds learning rate, momentum and weight decay as float32:
#: a larger value becomes inf, a nonzero value below the smallest normal float32 becomes 0
#: (or a denormal), and momentum 1 - 1e-9 becomes 1.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as optax holds a hyperparameter), as a Python float."""
    return struct.unpack("f", struct.pack("f", value))[0]


#: Simulated CPU devices of one program on one machine (flows/environment.py sets as many).
HOST_DEVICES = 8
