"""Datasets through TFDS: the embedded offline MNIST subset, MNIST and Fashion-MNIST from
their original IDX files, any TFDS catalog dataset or builder of the user's, and the user's
own labelled images (an image folder or arrays).

Everything is read with ``tfds.data_source`` from array_record files, which needs no
TensorFlow. Images are kept as uint8 ``[N, H, W, C]`` on the host and on device (4x less
memory than float32) and become float32 in [0, 1] inside the jitted step
(:func:`to_float`).

One concern per module: :mod:`.sources` (the datasets known without the catalog and
where their files are), :mod:`.mnist5k` (the embedded dataset and its builder),
:mod:`.idx` (the IDX reader and builder), :mod:`.image_folder` and :mod:`.npz_arrays` (a
user's image folder and arrays), :mod:`.user_source` (either as train and test splits of one
geometry), :mod:`.user_builder` (prepared as a TFDS dataset), :mod:`.integrity` (damage checks of prepared
datasets), :mod:`.preparation` (prepare in a TFDS data dir, load a split), :mod:`.snapshot`
(the data snapshots' layout, fingerprints, lineage), :mod:`.prepare_snapshot` (prepare as a
snapshot), :mod:`.validation_split` and :mod:`.class_subset` (a run's subset of the classes,
``data.classes``, and the held-out classes' test images).
"""

from __future__ import annotations

# TFDS is imported here, when this module is imported, and never later inside a function.
# tensorflow_datasets imports itself inside ``etils.epy.lazy_imports()``, which replaces
# ``builtins.__import__`` for the whole process while it runs: an import made by another
# thread in that window gets a lazy proxy. Inside a Prefect task run, Prefect's events and
# log workers are such threads; the events worker died of it and the run lost its task
# runs and events and never exited. At module import (the flow's entrypoint is loaded
# before Prefect starts those threads) no other thread is importing. dataset_metadata is
# the one TFDS module that opens such a window and is otherwise imported only while a
# dataset is prepared. tests/test_data.py::test_no_lazy_import_window_left_for_run_time
# and tests/test_deployment.py (every flow-run process, probed) check it.
import tensorflow_datasets
import tensorflow_datasets.core.dataset_metadata  # noqa: F401  (see above)

from ensemble_core.data.class_subset import (
    class_counts,
    full_class_names,
    held_out,
    keep_classes,
    load_held_out,
    resolve_classes,
    subset_view,
)
from ensemble_core.data.idx import idx_dir, idx_files_available, read_idx, read_idx_split, write_idx, write_idx_dataset
from ensemble_core.data.integrity import verify_prepared
from ensemble_core.data.mnist5k import mnist5k_split_indices, read_mnist5k_csv
from ensemble_core.data.preparation import DatasetInfo, check_examples, import_builder, load_split, to_float
from ensemble_core.data.prepare_snapshot import fingerprint_source, prepare, tfds_root
from ensemble_core.data.snapshot import DataSnapshot, SourceFingerprint
from ensemble_core.data.sources import EMBEDDED, FASHION_MNIST_CLASSES, FILE_FORMAT, IDX_FILES, IDX_SOURCES
from ensemble_core.data.user_source import UserSource, UserSplits, carve_test_split, read_user_source
from ensemble_core.data.validation_split import (
    CALIBRATION_SEED,
    VALIDATION_SEED,
    calibration_split,
    validation_size,
    validation_split,
)

__all__ = [
    "CALIBRATION_SEED",
    "EMBEDDED",
    "FASHION_MNIST_CLASSES",
    "FILE_FORMAT",
    "IDX_FILES",
    "IDX_SOURCES",
    "VALIDATION_SEED",
    "DataSnapshot",
    "DatasetInfo",
    "SourceFingerprint",
    "UserSource",
    "UserSplits",
    "calibration_split",
    "carve_test_split",
    "check_examples",
    "class_counts",
    "fingerprint_source",
    "full_class_names",
    "held_out",
    "idx_dir",
    "idx_files_available",
    "import_builder",
    "keep_classes",
    "load_held_out",
    "load_split",
    "mnist5k_split_indices",
    "prepare",
    "read_idx",
    "read_idx_split",
    "read_mnist5k_csv",
    "read_user_source",
    "resolve_classes",
    "subset_view",
    "tfds_root",
    "to_float",
    "validation_size",
    "validation_split",
    "verify_prepared",
    "write_idx",
    "write_idx_dataset",
]
