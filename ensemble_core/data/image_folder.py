"""A directory of labelled images, ``<root>/<split>/<class>/<image file>``: the layout of
``torchvision.datasets.ImageFolder`` and of TFDS's ``ImageFolder``.

:func:`scan_image_folder` finds the classes and files (before anything is decoded, so
that the source can be fingerprinted and checked); :func:`decode_images` decodes them
with Pillow (:mod:`ensemble_core.image_decoding`), in worker processes on every core for a
large folder, into one uint8 ``[N, H, W, C]`` array.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from PIL import Image

from ensemble_core import image_decoding
from ensemble_core.data.sources import one_line
from ensemble_core.errors import DataError
from ensemble_core.special_files import special_kind

log = logging.getLogger(__name__)

#: The splits read from an image folder; ``train`` is required.
FOLDER_SPLITS = ("train", "test")
#: Below this many files, decoding stays in this process (starting workers costs more).
PROCESS_POOL_MIN = 4096
#: Files per task of the worker processes.
BLOCK = 2048


@dataclasses.dataclass(frozen=True)
class FolderScan:
    """What an image folder holds, before decoding.

    ``class_names``: the names of the class folders of ``train`` in Unicode NFC,
    sorted (label ``i`` is ``class_names[i]``); ``files``: per split, ``(path, label)``
    in file-name order across classes (by the path below the class folder, then the
    class), so a folder exported with numbered file names keeps the export's order.
    """

    root: Path
    class_names: tuple[str, ...]
    files: dict[str, list[tuple[Path, int]]]

    def all_files(self) -> list[Path]:
        """Every image file of every split."""
        return [path for split in self.files.values() for path, _ in split]


def _visible(entries: Sequence[os.DirEntry]) -> list[os.DirEntry]:
    return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)


def walk_files(directory: Path, ancestors: tuple[str, ...] = (), *, refuse_special: bool = False) -> list[Path]:
    """Every visible file under ``directory``, depth first, entries sorted by name at each
    level (names starting with ``.`` ignored), following symlinks: the order an image
    folder's files are read in, by training (a class folder) and by ``flows.predict`` (a
    folder of images to predict).

    Args:
      refuse_special: refuse a FIFO, device or socket among the files (prediction names
        every file it is given); else they are passed over, as a class folder's are.

    Raises:
      DataError: a directory that links back to one of its ancestors (a symlink loop),
        a broken symlink, a directory that cannot be listed, or (``refuse_special``) a
        special file, naming the path.
    """
    real = os.path.realpath(directory)
    if real in ancestors:
        raise DataError(
            f"symlink loop: {directory} leads back to {real}, which contains it",
            fix="remove or retarget the link so that every folder is a tree",
        )
    try:
        with os.scandir(directory) as it:
            entries = _visible(list(it))
    except OSError as err:
        raise DataError(f"cannot list {directory} ({one_line(err)})", fix="check the folder's permissions") from None
    out: list[Path] = []
    for entry in entries:
        path = Path(entry.path)
        try:
            is_dir = entry.is_dir()  # follows symlinks
        except OSError:
            is_dir = False
        if is_dir:
            out.extend(walk_files(path, (*ancestors, real), refuse_special=refuse_special))
        elif entry.is_file():
            out.append(path)
        elif refuse_special and path.exists():  # a FIFO, device or socket, or a link to one
            kind = special_kind(path) or "not a regular file"
            raise DataError(f"{path} is {kind}, not an image file", fix="move it out of the folder")
        elif entry.is_symlink() and not path.exists():  # a link to a FIFO or device is one: passed over
            raise DataError(f"{path} is a broken symlink", fix="remove it or point it at an image")
    return out


def class_folder_name(name: str, split_dir: Path) -> str:
    """The class name of the class folder ``name`` of ``split_dir``: ``name`` normalised to
    Unicode NFC, so that a folder spelled in NFD (as macOS writes it) is the same class as
    one spelled in NFC.

    Raises:
      DataError: one line, the name escaped with ``repr``: a name that is not UTF-8 (the
        class map is stored as UTF-8 text; such bytes reach Python as lone surrogates), a
        control character (Unicode category Cc: newline, tab, ...) or a line or paragraph
        separator in the name (the class map is stored one name per line, and messages
        would break), or a name that begins or ends with white space (TFDS reads its label
        names back stripped).
    """
    if any(unicodedata.category(ch) == "Cs" for ch in name):  # bytes that are not UTF-8, escaped by os.fsdecode
        raise _not_utf8(os.fsencode(name), split_dir)
    nfc = unicodedata.normalize("NFC", name)
    bad = [ch for ch in nfc if unicodedata.category(ch) in ("Cc", "Zl", "Zp")]
    if bad:
        raise DataError(
            f"class folder {name!r} in {str(split_dir)!r} has the control character {bad[0]!r} in its name: "
            "a class name is stored as one line of the class map",
            fix="rename the folder without newlines, tabs or other control characters",
        )
    if nfc != nfc.strip():
        raise DataError(
            f"class folder {name!r} in {str(split_dir)!r} begins or ends with white space: the class map "
            "stores names stripped, so the class would be read back as another name",
            fix=f"rename the folder to {nfc.strip()!r}" if nfc.strip() else "give the folder a name",
        )
    return nfc


def _not_utf8(raw: bytes, split_dir: Path) -> DataError:
    """The one-line refusal of the class folder named by the bytes ``raw``, which are not
    UTF-8: the name as bytes (``repr``) and the first byte that is not UTF-8."""
    try:
        raw.decode("utf-8")
        bad = ""
    except UnicodeDecodeError as err:
        bad = f" (byte 0x{raw[err.start]:02x} at {err.start})"
    return DataError(
        f"class folder {raw!r} in {str(split_dir)!r} is not valid UTF-8{bad}: a class name is stored as UTF-8 text "
        "in the class map",
        fix="rename the folder so that its name is UTF-8 (e.g. with convmv -f latin1 -t utf8)",
    )


def scan_image_folder(root: str | os.PathLike) -> FolderScan:
    """List the classes and image files of ``root`` (``<root>/<split>/<class>/...``; files
    may lie in subfolders of a class folder; names starting with ``.`` are ignored).

    Class names are the class folders' names normalised to Unicode NFC
    (:func:`class_folder_name`): ``train/é`` and ``test/é`` in NFC and NFD are one class.

    Raises:
      DataError: one line naming the path and the fix (names escaped with ``repr``):
        ``root`` missing or not a directory; no ``train`` folder; a file directly in a
        split folder (outside every class folder); a class folder name with a control
        character or leading/trailing white space; two class folders of a split whose
        names are one name in NFC; fewer than two classes; an empty class folder; a
        ``test`` class that ``train`` lacks; a ``test`` folder without class folders
        (empty, or only hidden files such as ``.DS_Store``); no ``test`` folder and one
        file per class, so that the test split carved from ``train`` would be empty; a
        symlink loop or a broken symlink.
    """
    root = Path(root)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise DataError(f"data.path {root} {what}", fix="set data.path to the folder holding train/<class>/<image>")
    if not (root / "train").is_dir():
        raise DataError(
            f"{root} has no train folder",
            fix=f"put the training images in {root}/train/<class name>/<image file> (test/ is optional)",
        )
    class_names: tuple[str, ...] = ()
    files: dict[str, list[tuple[Path, int]]] = {}
    per_class: dict[str, list[int]] = {}
    for split in FOLDER_SPLITS:
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        with os.scandir(split_dir) as it:
            entries = _visible(list(it))
        stray = [e.name for e in entries if not e.is_dir()]
        if stray:
            raise DataError(
                f"{split_dir / stray[0]} lies outside every class folder ({len(stray)} such file(s) in {split_dir})",
                fix=f"move it into {split_dir}/<class name>/ or remove it",
            )
        folders: dict[str, str] = {}  # class name (NFC) -> the folder's name on disk
        for entry in entries:
            name = class_folder_name(entry.name, split_dir)
            if name in folders:
                raise DataError(
                    f"class folders {folders[name]!r} and {entry.name!r} in {str(split_dir)!r} are one name, "
                    f"{name!r}, in Unicode NFC: two folders of one class",
                    fix="merge them into one folder",
                )
            folders[name] = entry.name
        names = tuple(sorted(folders))
        if split == "train":
            if len(names) < 2:
                raise DataError(
                    f"{split_dir} has {len(names)} class folder(s) {list(names)}: a classifier needs two or more",
                    fix=f"add a folder per class under {split_dir}",
                )
            class_names = names
        else:
            if not names:
                raise DataError(
                    f"test folder {split_dir} holds no class folder, so no test images "
                    "(names starting with '.', such as .DS_Store, are ignored)",
                    fix=f"put the test images in {split_dir}/<class name>/<image file>, or remove {split_dir} "
                    "to hold out data.test_fraction of train as the test split",
                )
            unknown = sorted(set(names) - set(class_names))
            if unknown:
                raise DataError(
                    f"{split_dir / folders[unknown[0]]} is a class that {root / 'train'} does not have "
                    f"(no class folder there is named {unknown[0]!r} in Unicode NFC)",
                    fix=f"add {root / 'train' / unknown[0]} with training images, or remove the test folder",
                )
        found: list[tuple[str, str, Path, int]] = []
        counts = per_class.setdefault(split, [])
        for name in names:
            label = class_names.index(name)
            class_dir = split_dir / folders[name]
            paths = walk_files(class_dir)
            if not paths:
                raise DataError(f"class folder {class_dir} holds no files", fix="add images to it or remove it")
            counts.append(len(paths))
            found.extend((str(p.relative_to(class_dir)), name, p, label) for p in paths)
        found.sort(key=lambda item: (item[0], item[1]))
        files[split] = [(path, label) for _, _, path, label in found]
    if "test" not in files and max(per_class["train"]) < 2:
        raise DataError(
            f"{root} has no test folder and every class folder of {root / 'train'} holds one file: too few "
            "images per class to hold out data.test_fraction of train as a test split (it would be empty)",
            fix=f"add test images in {root}/test/<class name>/<image file>, or two or more images per class",
        )
    return FolderScan(root=root, class_names=class_names, files=files)


def image_geometry(path: Path, image_size: tuple[int, int] | None, channels: int | None) -> tuple[int, int, int]:
    """The ``(H, W, C)`` the images decode to: ``image_size`` and ``channels`` where set,
    else those of ``path`` (read from its header: its size once turned upright by its EXIF
    orientation, as :func:`~ensemble_core.image_decoding.decode_file` turns it).

    Raises:
      DataError: ``path`` cannot be opened as an image (with ``data.on_bad_image=fail``'s
        message), or its mode needs ``data.channels``.
    """
    try:
        with Image.open(path) as image:
            mode = image.mode
            upright = image_decoding.upright_size(image) if image_size is None else image_size
    except image_decoding.PILLOW_ERRORS as err:
        raise bad_image(path, one_line(err)) from None
    height, width = upright
    return height, width, channels if channels is not None else mode_channels(path, mode)


def mode_channels(path: Path, mode: str) -> int:
    """The channel count of Pillow mode ``mode`` (``image_decoding.MODE_CHANNELS``).

    Raises:
      DataError: a mode that must be converted, naming ``path`` and the fix (``data.channels``).
    """
    if mode not in image_decoding.MODE_CHANNELS:
        raise mode_error(path, mode)
    return image_decoding.MODE_CHANNELS[mode]


def mode_error(path: Path, mode: str) -> DataError:
    """The one-line error for an image whose Pillow mode is neither grey nor RGB (the fix:
    ``data.channels`` where it converts that mode, else saving the image otherwise)."""
    converts = mode in image_decoding.CONVERTED_MODES
    return DataError(
        f"{path} is a Pillow '{mode}' image, neither grey ('L') nor RGB"
        + ("" if converts else ", and data.channels does not convert it"),
        fix="set data.channels: 1 or 3 to convert every image" if converts else image_decoding.UNCONVERTED_FIX,
    )


def bad_image(path: Path, detail: str) -> DataError:
    """The one-line error for an image file Pillow cannot decode (``detail``: its error)."""
    return DataError(
        f"{path} cannot be decoded as an image ({detail})",
        fix="replace or remove the file, or set data.on_bad_image: skip to leave such files out",
    )


def decode_images(
    paths: Sequence[Path],
    image_size: tuple[int, int] | None,
    channels: int | None,
    shape: tuple[int, int, int],
    on_bad_image: str = "fail",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Decode ``paths`` with Pillow (:func:`ensemble_core.image_decoding.decode_file`) into
    one uint8 ``[N, H, W, C]`` array, in blocks of :data:`BLOCK` files.

    With ``workers`` > 1 (default: one per core) and at least :data:`PROCESS_POOL_MIN`
    files, the blocks are decoded by that many worker processes (``spawn``: they import
    NumPy and Pillow only). Processes, not threads: for small images most of the time is
    Python's per-file work under the GIL, which threads would contend for
    (``benchmarks/own_data.py`` measured two threads at 0.44x one on 28x28 PNGs).

    Args:
      shape: ``(H, W, C)`` every image decodes to (:func:`image_geometry` of the first).
      on_bad_image: ``"fail"`` raises on a file that cannot be decoded; ``"skip"`` leaves
        such files out (logged one by one).
      progress: called as ``progress(done, total)`` at most once a second and at the end.

    Returns:
      ``(images, kept)``: the decoded images and the indices into ``paths`` they came from.

    Raises:
      DataError: a file that cannot be decoded (``on_bad_image="fail"``), a file that
        disappeared while the folder was read, a mode that needs ``data.channels``, a
        size or channel count other than the first image's, or values outside the range
        the file's mode maps to 0-255 (whatever ``on_bad_image`` says), naming the file:
        the first in ``paths`` order among the blocks decoded.
    """
    total = len(paths)
    workers = workers or os.cpu_count() or 1
    names = [str(p) for p in paths]
    images = np.empty((total, *shape), np.uint8)
    ok = np.zeros(total, bool)
    errors: list[tuple[int, str, str]] = []
    skip = on_bad_image == "skip"
    blocks = [range(start, min(start + BLOCK, total)) for start in range(0, total, BLOCK)]
    last, done = time.monotonic(), 0

    def take(block: range, result: tuple[np.ndarray, np.ndarray, list[tuple[int, str, str]]]) -> bool:
        nonlocal last, done
        block_images, block_ok, block_errors = result
        images[block.start : block.stop] = block_images
        ok[block.start : block.stop] = block_ok
        errors.extend((block.start + i, kind, detail) for i, kind, detail in block_errors)
        done += len(block)
        if progress is not None and time.monotonic() - last >= 1.0:
            progress(done, total)
            last = time.monotonic()
        return any(not (skip and kind == image_decoding.UNREADABLE) for _, kind, _ in block_errors)

    args = (image_size, channels, shape, skip)
    if workers > 1 and total >= PROCESS_POOL_MIN:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(image_decoding.decode_block, names[b.start : b.stop], *args): b for b in blocks}
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                if take(futures[future], future.result()):
                    for pending in futures:
                        pending.cancel()
    else:
        for block in blocks:
            if take(block, image_decoding.decode_block(names[block.start : block.stop], *args)):
                break
    errors.sort()
    for i, kind, detail in errors:
        if not (skip and kind == image_decoding.UNREADABLE):
            raise _decode_error(paths[i], kind, detail, shape)
    for i, _, detail in errors:
        log.warning("skipped %s: %s", paths[i], detail)
    if progress is not None:
        progress(total, total)
    kept = np.flatnonzero(ok)
    return (images if len(kept) == total else images[kept]), kept.tolist()


def _decode_error(path: Path, kind: str, detail: str, shape: tuple[int, int, int]) -> DataError:
    if kind == image_decoding.MISSING:
        return DataError(
            f"{path} disappeared while the folder was read",
            fix="rerun once the files are complete (e.g. after the export that writes them has finished)",
        )
    if kind == image_decoding.MODE:
        return mode_error(path, detail)
    if kind == image_decoding.CHANNELS:
        return DataError(
            f"{path} has {detail}, the images before it {shape[2]}",
            fix="set data.channels: 1 or 3 to convert every image",
        )
    if kind == image_decoding.SIZE:
        return DataError(
            f"{path} is {detail} pixels, the images before it {shape[0]}x{shape[1]}",
            fix="set data.image_size: [H, W] to resize every image",
        )
    if kind == image_decoding.RANGE:
        return range_error(path, detail)
    return bad_image(path, detail)


def range_error(path: Path, detail: str) -> DataError:
    """The one-line error for an image whose values lie outside the range its Pillow mode
    maps to 0-255 (``detail``: the mode, the values found and the range): a convention of
    the export, refused whatever ``data.on_bad_image`` says (no file to leave out)."""
    return DataError(f"{path} is a {detail}", fix=image_decoding.RANGE_FIX)
