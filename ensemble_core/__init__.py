"""ensemble_core: pure JAX/Flax deep ensembles (no Prefect, no global state).

Stages: :mod:`.data` (TFDS datasets) -> :mod:`.rngs` (per-member keys) ->
:mod:`.train` (struct-of-arrays training on a ``('ensemble', 'data')`` mesh) ->
:mod:`.checkpoint` (orbax) -> :mod:`.evaluate` / :mod:`.metrics` -> :mod:`.report`.
"""

__version__ = "0.1.0"
