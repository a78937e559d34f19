"""Labelled images as NumPy arrays: ``<root>/train.npz`` and optionally ``<root>/test.npz``,
each with ``image`` uint8 ``[N, H, W, C]`` (or ``[N, H, W]``) and ``label`` integer ``[N]``
(what ``numpy.savez`` writes from another system's export). Read without pickles."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from ensemble_core.data.sources import one_line
from ensemble_core.errors import DataError
from ensemble_core.special_files import special_kind

#: The files of an arrays source; ``train.npz`` is required.
ARRAY_FILES = {"train": "train.npz", "test": "test.npz"}


def array_files(root: str | os.PathLike) -> dict[str, Path]:
    """The split -> ``.npz`` file of ``root`` (``train`` always, ``test`` when present).

    Raises:
      DataError: ``root`` is not a directory, or has no ``train.npz``.
    """
    root = Path(root)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise DataError(f"data.path {root} {what}", fix="set data.path to the folder holding train.npz")
    for name in ARRAY_FILES.values():
        kind = special_kind(root / name)
        if kind is not None:  # np.load would block on a FIFO, read a device without end
            raise DataError(f"{root / name} is {kind}, not a file", fix="write it with numpy.savez")
    if not (root / ARRAY_FILES["train"]).is_file():
        raise DataError(
            f"{root} has no {ARRAY_FILES['train']}",
            fix="write it with numpy.savez(path, image=uint8 [N, H, W, C], label=int [N]); test.npz is optional",
        )
    return {split: root / name for split, name in ARRAY_FILES.items() if (root / name).is_file()}


def image_array_shape(path: Path) -> tuple[int, ...]:
    """The shape of ``path``'s ``image`` array, read from its ``.npy`` header only (no
    decompression of the data), so that memory can be checked before loading.

    Raises:
      DataError: the file is not a ``.npz`` holding ``image``.
    """
    try:
        with zipfile.ZipFile(path) as archive, archive.open("image.npy") as f:
            major, _ = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, _ = header(f)
    except KeyError:
        raise DataError(
            f"{path} has no 'image' array", fix="save it with numpy.savez(path, image=..., label=...)"
        ) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(
            f"{path} cannot be read as a .npz of arrays ({one_line(err)})",
            fix="write it again with numpy.savez from plain (non-object) arrays",
        ) from None
    return tuple(int(d) for d in shape)


def read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(image uint8 [N, H, W, C], label int64 [N])`` of one ``.npz`` file (a
    ``[N, H, W]`` image array gets ``C = 1``).

    Raises:
      DataError: one line naming the file and the fix: not a readable ``.npz`` (also a
        pickled object array: pickles are never loaded), ``image`` or ``label`` missing,
        images not uint8 of 3 or 4 dimensions, labels not integers of one per image, or no
        examples.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            missing = [k for k in ("image", "label") if k not in keys]
            if missing:
                raise DataError(
                    f"{path} has arrays {sorted(keys)}, no {' or '.join(missing)}",
                    fix="save it with numpy.savez(path, image=..., label=...)",
                )
            images, labels = npz["image"], npz["label"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(
            f"{path} cannot be read as a .npz of arrays ({one_line(err)})",
            fix="write it again with numpy.savez from plain (non-object) arrays",
        ) from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(
            f"{path}: 'image' is {images.dtype} of shape {images.shape}, not uint8 [N, H, W] or [N, H, W, C]",
            fix="convert to uint8 pixels in 0..255 (e.g. (x * 255).round().astype(np.uint8)) before saving",
        )
    if not np.issubdtype(labels.dtype, np.integer) or labels.shape != (len(images),):
        raise DataError(
            f"{path}: 'label' is {labels.dtype} of shape {labels.shape}, not integers of shape ({len(images)},)",
            fix="save one integer label per image",
        )
    if len(images) == 0:
        raise DataError(f"{path} holds no examples", fix="export at least one image per class")
    if images.ndim == 3:
        images = images[..., None]
    return images, labels.astype(np.int64)
