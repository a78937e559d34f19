"""Labelled images as NumPy arrays: ``<root>/train.npz`` and optionally ``<root>/test.npz``,
each with ``image`` uint8 ``[N, H, W, C]`` (or ``[N, H, W]``) and ``label`` integer ``[N]``
(what ``numpy.savez`` writes from another system's export). Read without pickles."""

from __future__ import annotations

import math
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


#: Deflate shrinks data by at most about 1032:1 (its longest match, 258 bytes, coded in two
#: bits or so): an archive member whose header claims more than this many times its compressed
#: bytes cannot hold the data it claims.
MAX_DEFLATE_RATIO = 1100

#: The arrays of a ``.npz`` the pipeline reads (every other member is never loaded).
MEMBERS = ("image", "label")


def _unreadable(path: Path, err: BaseException) -> DataError:
    return DataError(
        f"{path} cannot be read as a .npz of arrays ({one_line(err)})",
        fix="write it again with numpy.savez from plain (non-object) arrays",
    )


def npy_header(f, where: str, stored_bytes: int) -> tuple[tuple[int, ...], np.dtype]:
    """The ``(shape, dtype)`` of the ``.npy`` stream ``f`` (a ``.npy`` file or a ``.npz``
    member, positioned at its start), read from its header alone, after checking that the
    data it claims can be there: ``stored_bytes`` (the bytes the stream holds, or can
    decompress to) must cover the header and ``prod(shape) * itemsize`` bytes of data.

    Raises:
      DataError: a header that claims a negative dimension, or more data than is stored
        (naming the shape, the bytes claimed and the bytes there are).
      ValueError, EOFError, OSError: the stream is not a ``.npy``, or holds Python objects
        (a pickle), for the caller to name.
    """
    major, _ = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    if dtype.hasobject:  # its data is a pickle, never loaded
        raise ValueError(f"{where} holds Python objects, a pickle (never loaded)")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):  # numpy parses it; the product would pass the bound below
        raise DataError(
            f"{where}: its header claims {dtype} of shape {shape}, a negative dimension",
            fix="write the file again with numpy.save/numpy.savez (it is damaged or was not written by numpy)",
        )
    need = f.tell() + math.prod(shape) * dtype.itemsize
    if need > stored_bytes:
        raise DataError(
            f"{where}: its header claims {dtype} of shape {shape} ({need:,} bytes with the header) but only "
            f"{stored_bytes:,} bytes are stored",
            fix="write the file again with numpy.save/numpy.savez (it is damaged or was not written by numpy)",
        )
    return shape, dtype


def array_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The ``(shape, dtype)`` of ``path``'s ``image`` and ``label`` arrays, from their
    ``.npy`` headers only (nothing decompressed or allocated), each bounded by the bytes
    its archive member holds (:func:`npy_header`; a deflated member by
    :data:`MAX_DEFLATE_RATIO` times its compressed bytes, which must lie in the file),
    so that every array's size can be checked before loading.

    Raises:
      DataError: the file is not a ``.npz``, lacks ``image`` or ``label``, or a header
        claims more data than the member holds.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {i.filename.removesuffix(".npy"): i for i in archive.infolist()}
            missing = [k for k in MEMBERS if k not in infos]
            if missing:
                raise DataError(
                    f"{path} has arrays {sorted(infos)}, no {' or '.join(missing)}",
                    fix="save it with numpy.savez(path, image=..., label=...)",
                )
            out = {name: _member_header(archive, infos[name], path) for name in MEMBERS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise _unreadable(path, err) from None
    image, label = out["image"], out["label"]
    check_headers(path, image, label)
    return out


def _member_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """The bounded header (:func:`npy_header`) of the member ``info`` of ``archive``, the
    ``.npz`` at ``path``: a stored member by its size, a deflated one by
    :data:`MAX_DEFLATE_RATIO` times its compressed bytes, which must lie in the file."""
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else MAX_DEFLATE_RATIO
    stored = min(info.file_size, ratio * min(info.compress_size, path.stat().st_size))
    with archive.open(info) as f:
        return npy_header(f, f"{path}: '{info.filename.removesuffix('.npy')}'", stored)


def check_npy_file(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """The ``(shape, dtype)`` of the ``.npy`` file ``path`` from its header, bounded by the
    file's size (:func:`npy_header`), before anything is loaded: what ``numpy.load``
    would allocate is then at most what the file holds.

    Raises:
      DataError: a negative dimension, or more data claimed than the file holds.
      ValueError, EOFError, OSError: not a ``.npy``, a truncated header, or an object array.
    """
    with open(path, "rb") as f:
        return npy_header(f, repr(str(path)), os.fstat(f.fileno()).st_size)


def check_npz_member(path: Path, member: str) -> tuple[tuple[int, ...], np.dtype]:
    """The ``(shape, dtype)`` of the array ``member`` of the ``.npz`` ``path`` from its
    header, bounded by the bytes its archive member holds (as :func:`array_headers`),
    before anything is loaded.

    Raises:
      DataError: a negative dimension, or more data claimed than the member holds.
      KeyError: no such member. ValueError, EOFError, OSError, zipfile.BadZipFile: the
        member is not a ``.npy``, its header is truncated, or it holds objects.
    """
    with zipfile.ZipFile(path) as archive:
        return _member_header(archive, archive.getinfo(f"{member}.npy"), path)


def uint8_fix(dtype: np.dtype) -> str:
    """How to bring images of ``dtype`` to uint8 0..255 by their range: 16-bit by their
    bit depth (the high byte), floats from [0, 1], others rescaled."""
    if dtype.kind == "u" and dtype.itemsize == 2:
        return "convert 16-bit pixels by their bit depth, (x >> 8).astype(np.uint8), before saving"
    if dtype.kind == "f":
        return "convert float pixels in [0, 1] to uint8, (x * 255).round().astype(np.uint8), before saving"
    return "rescale the pixels to 0..255 and save them as np.uint8"


def check_headers(path: Path, image: tuple, label: tuple) -> None:
    """Refuse, from the headers alone, images that are not uint8 ``[N, H, W(, C)]`` and
    labels that are not integers of shape ``(N,)``.

    Raises:
      DataError: one line naming the array, its dtype and shape, and the fix.
    """
    (shape, dtype), (label_shape, label_dtype) = image, label
    if dtype != np.uint8 or len(shape) not in (3, 4):
        raise DataError(
            f"{path}: 'image' is {dtype} of shape {shape}, not uint8 [N, H, W] or [N, H, W, C]",
            fix=uint8_fix(dtype) if dtype != np.uint8 else "save the images as [N, H, W] or [N, H, W, C]",
        )
    if not np.issubdtype(label_dtype, np.integer) or label_shape != (shape[0],):
        raise DataError(
            f"{path}: 'label' is {label_dtype} of shape {label_shape}, not integers of shape ({shape[0]},)",
            fix="save one integer label per image",
        )


def image_array_shape(path: Path) -> tuple[int, ...]:
    """The shape of ``path``'s ``image`` array, from its header (:func:`array_headers`)."""
    return array_headers(path)["image"][0]


def read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(image uint8 [N, H, W, C], label int64 [N])`` of one ``.npz`` file (a
    ``[N, H, W]`` image array gets ``C = 1``), loaded after :func:`array_headers` bounded
    both arrays by their headers (the caller checks their size against memory first).

    Raises:
      DataError: one line naming the file and the fix: not a readable ``.npz`` (also a
        pickled object array: pickles are never loaded), ``image`` or ``label`` missing,
        images not uint8 of 3 or 4 dimensions, labels not integers of one per image, or no
        examples.
    """
    array_headers(path)  # every refusal the headers allow, before anything is allocated
    try:
        with np.load(path, allow_pickle=False) as npz:
            images, labels = npz["image"], npz["label"]
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise _unreadable(path, err) from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(
            f"{path}: 'image' is {images.dtype} of shape {images.shape}, not uint8 [N, H, W] or [N, H, W, C]",
            fix=uint8_fix(images.dtype) if images.dtype != np.uint8 else "save the images as [N, H, W] or [N, H, W, C]",
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
