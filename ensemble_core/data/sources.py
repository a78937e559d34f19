"""Which datasets the pipeline knows without the TFDS catalog, and where their files are.

Shared by the builders (:mod:`.mnist5k`, :mod:`.idx`), the damage checks
(:mod:`.integrity`) and preparation (:mod:`.preparation`).
"""

from __future__ import annotations

EMBEDDED = "mnist5k"
FILE_FORMAT = "array_record"

IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
"""The four files of an IDX dataset, as MNIST and Fashion-MNIST publish them (each may
also be present uncompressed, without the ``.gz``)."""

IDX_SOURCES: dict[str, tuple[str, str | None]] = {
    "fashion_mnist": ("/usr/share/datasets/fashion-mnist", "apt-get install dataset-fashion-mnist"),
    "mnist": ("/usr/share/datasets/mnist", None),
}
"""The IDX datasets: name -> (directory read when ``data.manual_dir`` is not set, the
command that installs the files there, or None where no Debian package ships them: then
``data.manual_dir`` must name a directory holding :data:`IDX_FILES`)."""

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def one_line(err: BaseException) -> str:
    """``err`` as ``Type: message`` on one line, at most 240 characters (for the
    one-line errors of this package)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:240]
