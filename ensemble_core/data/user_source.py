"""A user's own labelled images as a dataset's train and test splits: an image folder
(:mod:`.image_folder`) or arrays (:mod:`.npz_arrays`), brought to one geometry, with a
test split carved from ``train`` when the source has none.

:class:`UserSource` is what the config's ``data`` section says about such a source;
:func:`source_files` lists (and checks) what it is prepared from, before any decoding, so
that it can be fingerprinted; :func:`read_user_source` decodes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
from PIL import Image

from ensemble_core.data import image_folder as folder
from ensemble_core.data.npz_arrays import array_files, array_headers, read_arrays
from ensemble_core.errors import DataError
from ensemble_core.image_decoding import PILLOW_ERRORS, convert_images

log = logging.getLogger(__name__)

#: The seed of the carve of a test split from ``train`` (fixed: the same files every night).
TEST_SPLIT_SEED = "ensemble-pipeline test split v1"
#: Decoded images may take at most this share of the host's available memory (the
#: array is held once while TFDS writes it, and once more in serialized records).
MEMORY_SHARE = 0.5


class UserSource(pydantic.BaseModel):
    """An image folder or arrays source: ``kind``, ``path`` and the config's
    ``data.image_size`` ``(H, W)``, ``data.channels`` (1 or 3), ``data.class_names``,
    ``data.test_fraction`` and ``data.on_bad_image`` (see
    :class:`ensemble_core.config.DataConfig`)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    kind: Literal["image_folder", "arrays"]
    path: str
    image_size: tuple[int, int] | None = None
    channels: Literal[1, 3] | None = None
    class_names: tuple[str, ...] | None = None
    test_fraction: float = 0.2
    on_bad_image: Literal["fail", "skip"] = "fail"

    def settings(self) -> str:
        """What, besides the files, decides the prepared dataset (part of the fingerprint):
        one string from which every setting can be read back, so that two sources differing
        in any setting never share it.

        ``data.class_names`` end it as ``,names=`` and the names joined with ``|`` while no
        name holds a ``|`` (the form fingerprints have always had), else as ``,names_json=``
        and the JSON list of the names: ``['a|b', 'c']`` and ``['a', 'b|c']`` were one string.
        """
        size = "as-is" if self.image_size is None else f"{self.image_size[0]}x{self.image_size[1]}"
        if self.class_names is None:
            names = ""
        elif any("|" in name for name in self.class_names):
            names = ",names_json=" + json.dumps(list(self.class_names))
        else:
            names = ",names=" + "|".join(self.class_names)
        return (
            f"{self.kind}:size={size},channels={self.channels or 'as-is'},test_fraction={self.test_fraction!r},"
            f"on_bad_image={self.on_bad_image}{names}"
        )


@dataclasses.dataclass(frozen=True)
class UserSplits:
    """A user source decoded: ``train``/``test`` as (images uint8 ``[N, H, W, C]``, labels
    int64 ``[N]``), ``class_names`` (label ``i`` is ``class_names[i]``), ``test_carved``
    (the test split is a share of ``train``), ``skipped`` (files left out by
    ``data.on_bad_image=skip``)."""

    train: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    class_names: tuple[str, ...]
    test_carved: bool
    skipped: tuple[str, ...] = ()


def source_files(source: UserSource) -> list[Path]:
    """Every file ``source`` is prepared from, in a fixed order, after the checks that need
    no decoding (:func:`~.image_folder.scan_image_folder`, :func:`~.npz_arrays.array_files`).

    Raises:
      DataError: see those functions.
    """
    if source.kind == "image_folder":
        return folder.scan_image_folder(source.path).all_files()
    return list(array_files(source.path).values())


def carve_test_split(keys: list[str], labels: np.ndarray, fraction: float) -> np.ndarray:
    """The test split carved from a training split with no test split of its own.

    Of each class with ``n`` examples, ``round(fraction * n)`` (at least one when ``n >= 2``)
    go to test: those whose ``sha256(seed + key)`` is smallest, ``key`` being the file's
    path below the split folder (or the example's index in ``train.npz``). So the carve is
    stratified, fixed while the files are unchanged, and a file keeps its side when
    others are added (unless it is at the margin of its class's quota).

    Args:
      keys: one string per example; labels: int ``[N]``; fraction: in (0, 1).

    Returns:
      A bool mask ``[N]``: True for the test split.
    """
    mask = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        take = round(fraction * len(members))
        take = min(max(take, 1), len(members) - 1) if len(members) >= 2 else 0
        # surrogateescape: a file name that is not UTF-8 hashes as its bytes (others as their UTF-8)
        rank = sorted(
            members,
            key=lambda i: hashlib.sha256(f"{TEST_SPLIT_SEED}:{keys[i]}".encode("utf-8", "surrogateescape")).hexdigest(),
        )
        mask[rank[:take]] = True
    return mask


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_memory(count: int, shape: tuple[int, int, int], where: str) -> None:
    """Refuse, before decoding, ``count`` images of ``shape`` that cannot fit in
    :data:`MEMORY_SHARE` of the host's available memory.

    Raises:
      DataError: naming the decoded size, the memory there is and the fix.
    """
    # Imported here: ensemble_core.memory imports the models and the train step, which import
    # this package, so a module-level import made ``import ensemble_core.models`` (or anything
    # importing it first) fail with a circular import.
    from ensemble_core.memory import host_available_bytes

    need = count * math.prod(shape)
    have, what = host_available_bytes()
    if have and need > MEMORY_SHARE * have:
        raise DataError(
            f"{where}: {count:,} images of {shape[0]}x{shape[1]}x{shape[2]} decode to {_bytes(need)}, "
            f"more than half the {_bytes(have)} of {what}",
            fix="set data.image_size to a smaller [H, W], or prepare on a machine with more memory",
        )


def _progress(split: str):
    def report(done: int, total: int) -> None:
        log.info("decoding %s: %d/%d images", split, done, total)

    return report


def _geometry(source: UserSource, paths: list[Path]) -> tuple[int, int, int]:
    """The ``(H, W, C)`` of every decoded image: the config's where set, else the first
    readable file's (with ``on_bad_image=skip``, unreadable ones before it are passed)."""
    for path in paths:
        try:
            return folder.image_geometry(path, source.image_size, source.channels)
        except DataError:
            if source.on_bad_image == "fail" or not _unreadable(path):
                raise
    raise DataError(f"no file under {source.path} can be decoded as an image", fix="check the files")


def _unreadable(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            image.load()
    except PILLOW_ERRORS:
        return True
    return False


def _read_folder(source: UserSource) -> UserSplits:
    scan = folder.scan_image_folder(source.path)
    all_paths = scan.all_files()
    shape = _geometry(source, all_paths)
    check_memory(len(all_paths), shape, f"{source.path}")
    splits, skipped = {}, []
    for split, items in scan.files.items():
        paths = [p for p, _ in items]
        images, kept = folder.decode_images(
            paths, source.image_size, source.channels, shape, source.on_bad_image, progress=_progress(split)
        )
        skipped += [str(paths[i]) for i in sorted(set(range(len(paths))) - set(kept))]
        labels = np.asarray([items[i][1] for i in kept], np.int64)
        keys = [str(paths[i].relative_to(scan.root / split)) for i in kept]
        splits[split] = (images, labels, keys)
    if skipped:
        log.warning("left out %d file(s) that cannot be decoded (data.on_bad_image=skip)", len(skipped))
    for split, (_, labels, _) in splits.items():
        empty = [scan.class_names[c] for c in range(len(scan.class_names)) if not (labels == c).any()]
        if split == "train" and empty:
            raise DataError(
                f"class '{empty[0]}' has no decodable image in {scan.root / 'train'}",
                fix="add readable images to its folder or remove the folder",
            )
    return _with_test(splits, scan.class_names, source, tuple(skipped))


def _convert(images: np.ndarray, source: UserSource, where: Path) -> np.ndarray:
    """Arrays brought to ``data.channels`` and ``data.image_size`` with Pillow, as image
    files are (:func:`ensemble_core.image_decoding.convert_images`)."""
    try:
        return convert_images(images, source.image_size, source.channels)
    except ValueError as err:
        raise DataError(f"{where}: {err}", fix="set data.channels: 1 or 3 to convert them") from None


def check_array_bytes(nbytes: int, what: str) -> None:
    """Refuse, before loading, an array of ``nbytes`` (from its header) that cannot fit in
    :data:`MEMORY_SHARE` of the host's available memory.

    Raises:
      DataError: naming the array, its size, the memory there is and the fix.
    """
    from ensemble_core.memory import host_available_bytes  # see check_memory

    have, where = host_available_bytes()
    if have and nbytes > MEMORY_SHARE * have:
        raise DataError(
            f"{what} takes {_bytes(nbytes)}, more than half the {_bytes(have)} of {where}",
            fix="export fewer or smaller images, or prepare on a machine with more memory",
        )


def check_labels(labels: dict[Path, np.ndarray], class_names: tuple[str, ...] | None) -> tuple[str, ...]:
    """The class names of an arrays source, after refusing a label that cannot be a class
    index, before anything is allocated per class: a negative label, and one not below the
    number of classes: ``len(data.class_names)`` where given, else the number of examples
    (every class has at least one, so there are no more classes than examples).

    Args:
      labels: each file's int64 labels; class_names: ``data.class_names``.

    Raises:
      DataError: one line naming the label, how many examples carry it, the bound and the fix.
    """
    total = sum(len(v) for v in labels.values())
    bound = len(class_names) if class_names else total
    for path, values in labels.items():
        bad = (values < 0) | (values >= bound)
        if not bad.any():
            continue
        first = int(np.flatnonzero(bad)[0])
        label = int(values[first])
        carried = int(np.count_nonzero(values == label))
        if class_names:
            raise DataError(
                f"{int(bad.sum())} label(s) in {path} are outside [0, {bound}) (first: {label} at index {first}); "
                f"label {label} is on {carried} example(s) and data.class_names lists {bound} classes",
                fix="fix the labels, or list every class in data.class_names",
            )
        why = "negative" if label < 0 else f"not below the {total:,} examples of the source (a class index must be)"
        raise DataError(
            f"label {label:,} in {path} (on {carried:,} example(s), first at index {first}) is {why}",
            fix="number the classes 0..K-1 (e.g. numpy.unique(labels, return_inverse=True)[1]) "
            "and list their names in data.class_names",
        )
    largest = max(int(v.max()) for v in labels.values())
    return class_names or tuple(str(c) for c in range(largest + 1))


def _read_arrays(source: UserSource) -> UserSplits:
    files = array_files(source.path)
    raw = {}
    for split, path in files.items():
        headers = array_headers(path)  # every header bounded by the bytes stored, nothing loaded
        for name, (shape, dtype) in headers.items():
            check_array_bytes(math.prod(shape) * dtype.itemsize, f"{path}: '{name}' of shape {shape}")
        shape = headers["image"][0]
        height, width = source.image_size or (shape[1], shape[2])
        check_memory(shape[0], (height, width, source.channels or (shape[3] if len(shape) == 4 else 1)), str(path))
        raw[split] = read_arrays(path)
    names = check_labels({files[split]: labels for split, (_, labels) in raw.items()}, source.class_names)
    splits = {
        split: (_convert(images, source, files[split]), labels, [str(i) for i in range(len(labels))])
        for split, (images, labels) in raw.items()
    }
    shapes = {split: images.shape[1:] for split, (images, _, _) in splits.items()}
    if len(set(shapes.values())) > 1:
        raise DataError(
            f"{files['test']} holds images of {shapes['test']}, {files['train']} of {shapes['train']}",
            fix="set data.image_size and data.channels to bring both to one geometry",
        )
    present = np.unique(splits["train"][1])
    if len(present) < 2:
        raise DataError(
            f"{files['train']} holds one class ({names[int(present[0])]}): a classifier needs two or more",
            fix="export examples of every class",
        )
    return _with_test(splits, tuple(names), source, ())


def _with_test(splits: dict, class_names: tuple[str, ...], source: UserSource, skipped: tuple[str, ...]) -> UserSplits:
    images, labels, keys = splits["train"]
    if "test" in splits:
        test_images, test_labels, _ = splits["test"]
        return UserSplits((images, labels), (test_images, test_labels), class_names, False, skipped)
    test = carve_test_split(keys, labels, source.test_fraction)
    return UserSplits((images[~test], labels[~test]), (images[test], labels[test]), class_names, True, skipped)


def read_user_source(source: UserSource) -> UserSplits:
    """Decode ``source`` into its train and test splits.

    Image files are decoded with Pillow on every core (:func:`~.image_folder.decode_images`);
    arrays are read without pickles and, where ``data.image_size``/``data.channels`` ask,
    converted with Pillow the same way. Without a test split, :func:`carve_test_split`
    takes ``data.test_fraction`` of ``train``.

    Raises:
      DataError: every refusal of :mod:`.image_folder` and :mod:`.npz_arrays`; decoded
        images that would not fit in memory (:func:`check_memory`, before decoding);
        a class left without images; an array whose header claims more than is stored or
        than memory holds (before loading it); a label that cannot be a class index
        (:func:`check_labels`, before any per-class allocation); arrays of one class.
    """
    return _read_folder(source) if source.kind == "image_folder" else _read_arrays(source)
