"""ensemble_core: deep ensembles in JAX, without Prefect.

Pure layer (arrays and config in, arrays and dataclasses out, no files):
:mod:`.config` -> :mod:`.setup` (mesh plan, mesh, model from :mod:`.models`, optimizer,
member keys from :mod:`.rngs`) -> :mod:`.train` (struct-of-arrays training on a
``('ensemble', 'data')`` mesh, :mod:`.mesh`) -> :mod:`.predict` -> :mod:`.metrics` and the
evaluators of :mod:`.evaluators`; :mod:`.data` prepares and reads TFDS datasets,
:mod:`.memory` estimates what training needs.

Run layer :mod:`.runs` (files, still no Prefect): a run directory's layout and atomic
writes, its lock, orbax checkpoints, preflight, training with resume and stop signals,
evaluation and prediction, the champion, the report, and :func:`.runs.run`, the
sequence every caller uses.
"""
