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

import sys

if sys.argv[:1] == ["-m"] and "ensemble_core.runs.training.processes" in sys.orig_argv:
    # A JAX process of one program (``python -m ensemble_core.runs.training.processes``):
    # runpy imports this package first. The garbage collector is off while it imports its
    # modules; its main() resumes it (ensemble_core.startup_gc).
    from ensemble_core import startup_gc

    startup_gc.pause()
