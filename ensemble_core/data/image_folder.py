"""A directory of labelled images, ``<root>/<split>/<class>/<image file>``: the layout of
``torchvision.datasets.ImageFolder`` and of TFDS's ``ImageFolder``.

:func:`scan_image_folder` finds the classes and files (before anything is decoded, so
that the source can be fingerprinted and checked); :func:`decode_images` decodes them
with Pillow on every core into one uint8 ``[N, H, W, C]`` array.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from PIL import Image

from ensemble_core.data.sources import one_line
from ensemble_core.errors import DataError

log = logging.getLogger(__name__)

#: The splits read from an image folder; ``train`` is required.
FOLDER_SPLITS = ("train", "test")
#: Pillow's modes taken as they are: grey and RGB. Any other (palette, alpha, CMYK,
#: 16-bit, bilevel) needs ``data.channels``, which converts.
MODE_CHANNELS = {"L": 1, "RGB": 3}
#: Pillow's mode for each ``data.channels``.
CHANNEL_MODES = {1: "L", 3: "RGB"}


@dataclasses.dataclass(frozen=True)
class FolderScan:
    """What an image folder holds, before decoding.

    ``class_names``: the class folders of ``train``, sorted (label ``i`` is
    ``class_names[i]``); ``files``: per split, ``(path, label)`` in file-name order
    across classes (by the path below the class folder, then the class), so a folder
    exported with numbered file names keeps the export's order.
    """

    root: Path
    class_names: tuple[str, ...]
    files: dict[str, list[tuple[Path, int]]]

    def all_files(self) -> list[Path]:
        """Every image file of every split."""
        return [path for split in self.files.values() for path, _ in split]


def _visible(entries: Sequence[os.DirEntry]) -> list[os.DirEntry]:
    return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)


def _walk(directory: Path, ancestors: tuple[str, ...] = ()) -> list[Path]:
    """Every visible file under ``directory``, following symlinks; a directory that links
    back to one of its ancestors is refused rather than followed forever."""
    real = os.path.realpath(directory)
    if real in ancestors:
        raise DataError(
            f"symlink loop: {directory} leads back to {real}, which contains it",
            fix="remove or retarget the link so that every class folder is a tree",
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
            out.extend(_walk(path, (*ancestors, real)))
        elif entry.is_file():
            out.append(path)
        elif entry.is_symlink():
            raise DataError(f"{path} is a broken symlink", fix="remove it or point it at an image")
    return out


def scan_image_folder(root: str | os.PathLike) -> FolderScan:
    """List the classes and image files of ``root`` (``<root>/<split>/<class>/...``; files
    may lie in subfolders of a class folder; names starting with ``.`` are ignored).

    Raises:
      DataError: one line naming the path and the fix: ``root`` missing or not a
        directory; no ``train`` folder; a file directly in a split folder (outside every
        class folder); fewer than two classes; an empty class folder; a ``test`` class
        that ``train`` lacks; a symlink loop or a broken symlink.
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
        names = tuple(e.name for e in entries)
        if split == "train":
            if len(names) < 2:
                raise DataError(
                    f"{split_dir} has {len(names)} class folder(s) {list(names)}: a classifier needs two or more",
                    fix=f"add a folder per class under {split_dir}",
                )
            class_names = names
        else:
            unknown = sorted(set(names) - set(class_names))
            if unknown:
                raise DataError(
                    f"{split_dir / unknown[0]} is a class that {root / 'train'} does not have",
                    fix=f"add {root / 'train' / unknown[0]} with training images, or remove the test folder",
                )
        found: list[tuple[str, str, Path, int]] = []
        for name in names:
            label = class_names.index(name)
            class_dir = split_dir / name
            paths = _walk(class_dir)
            if not paths:
                raise DataError(f"class folder {class_dir} holds no files", fix="add images to it or remove it")
            found.extend((str(p.relative_to(class_dir)), name, p, label) for p in paths)
        found.sort(key=lambda item: (item[0], item[1]))
        files[split] = [(path, label) for _, _, path, label in found]
    return FolderScan(root=root, class_names=class_names, files=files)


def image_geometry(path: Path, image_size: tuple[int, int] | None, channels: int | None) -> tuple[int, int, int]:
    """The ``(H, W, C)`` the images decode to: ``image_size`` and ``channels`` where set,
    else those of ``path`` (read from its header only).

    Raises:
      DataError: ``path`` cannot be opened as an image (with ``data.on_bad_image=fail``'s
        message), or its mode needs ``data.channels``.
    """
    try:
        with Image.open(path) as image:
            size, mode = image.size, image.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise bad_image(path, err) from None
    height, width = image_size if image_size is not None else (size[1], size[0])
    return height, width, channels if channels is not None else mode_channels(path, mode)


def mode_channels(path: Path, mode: str) -> int:
    """The channel count of Pillow mode ``mode`` (:data:`MODE_CHANNELS`).

    Raises:
      DataError: a mode that must be converted, naming ``path`` and the fix (``data.channels``).
    """
    if mode not in MODE_CHANNELS:
        raise DataError(
            f"{path} is a Pillow '{mode}' image, neither grey ('L') nor RGB",
            fix="set data.channels: 1 or 3 to convert every image",
        )
    return MODE_CHANNELS[mode]


def bad_image(path: Path, err: BaseException) -> DataError:
    """The one-line error for an image file Pillow cannot decode."""
    return DataError(
        f"{path} cannot be decoded as an image ({one_line(err)})",
        fix="replace or remove the file, or set data.on_bad_image: skip to leave such files out",
    )


class UnreadableImageError(Exception):
    """An image file that failed to decode (carried back from a worker thread)."""

    def __init__(self, path: Path, err: BaseException):
        super().__init__(str(err))
        self.path, self.err = path, err


def decode_one(
    path: Path, image_size: tuple[int, int] | None, channels: int | None, shape: tuple[int, int, int]
) -> np.ndarray:
    """One image as uint8 ``[H, W, C]`` of ``shape``: converted to ``channels`` (Pillow's
    ``Image.convert``) and resized to ``image_size`` (``Image.resize`` with
    ``Resampling.BILINEAR``: bilinear, antialiased when shrinking) where they are set.

    Raises:
      UnreadableImageError: Pillow cannot open or fully decode the file (truncated, damaged, not an image).
      FileNotFoundError: the file disappeared since the scan.
      DataError: without ``image_size``/``channels``, a size or mode other than ``shape``'s.
    """
    try:
        with Image.open(path) as opened:
            opened.load()
            image: Image.Image = opened
            if channels is not None:
                image = image.convert(CHANNEL_MODES[channels])
            elif mode_channels(path, image.mode) != shape[2]:
                raise DataError(
                    f"{path} has {MODE_CHANNELS[image.mode]} channel(s) ({image.mode}), "
                    f"the images before it {shape[2]}",
                    fix="set data.channels: 1 or 3 to convert every image",
                )
            if image_size is not None:
                image = image.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            elif (image.height, image.width) != shape[:2]:
                raise DataError(
                    f"{path} is {image.height}x{image.width} pixels, the images before it {shape[0]}x{shape[1]}",
                    fix="set data.image_size: [H, W] to resize every image",
                )
            array = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise UnreadableImageError(path, err) from None
    return array.reshape(shape)


def decode_images(
    paths: Sequence[Path],
    image_size: tuple[int, int] | None,
    channels: int | None,
    shape: tuple[int, int, int],
    on_bad_image: str = "fail",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Decode ``paths`` with Pillow on ``workers`` threads (default: one per core) into one
    uint8 ``[N, H, W, C]`` array, in contiguous blocks. Pillow releases the GIL while it
    decodes pixel data, so large images decode in parallel; for small ones (28x28) the
    per-file Python work dominates and a second thread gains little
    (``benchmarks/own_data.py`` measures it).

    Args:
      shape: ``(H, W, C)`` every image decodes to (:func:`image_geometry` of the first).
      on_bad_image: ``"fail"`` raises on the first file that cannot be decoded;
        ``"skip"`` leaves such files out (logged one by one).
      progress: called as ``progress(done, total)`` at most once a second and at the end.

    Returns:
      ``(images, kept)``: the decoded images and the indices into ``paths`` they came from.

    Raises:
      DataError: a file that cannot be decoded (``on_bad_image="fail"``), a file that
        disappeared while the folder was read, or a size or channel count that differs
        from the first image's (naming the first such file in ``paths`` order).
    """
    total = len(paths)
    images = np.empty((total, *shape), np.uint8)
    ok = np.zeros(total, bool)
    first_error: dict[int, BaseException] = {}
    workers = workers or os.cpu_count() or 1

    stop = threading.Event()  # a refusal: the other blocks end early

    def work(block: range) -> int:
        for i in block:
            if stop.is_set():
                break
            try:
                images[i] = decode_one(paths[i], image_size, channels, shape)
                ok[i] = True
            except (UnreadableImageError, DataError, FileNotFoundError) as err:
                first_error[i] = err
                if not isinstance(err, UnreadableImageError) or on_bad_image == "fail":
                    stop.set()
        return len(block)

    # Contiguous blocks, one task each: a task per image costs more than decoding a small one.
    size = max(64, min(2048, total // (workers * 16) or 1))
    blocks = [range(start, min(start + size, total)) for start in range(0, total, size)]
    last, done = time.monotonic(), 0
    finished: Iterator[int]
    if workers == 1:
        finished = map(work, blocks)
    else:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode")
        finished = (future.result() for future in as_completed([pool.submit(work, b) for b in blocks]))
    try:
        for n in finished:
            done += n
            if progress is not None and time.monotonic() - last >= 1.0:
                progress(done, total)
                last = time.monotonic()
    finally:
        stop.set()
        if workers != 1:
            pool.shutdown(wait=True)
    for i in sorted(first_error):
        err = first_error[i]
        if isinstance(err, FileNotFoundError):
            raise DataError(
                f"{paths[i]} disappeared while the folder was read",
                fix="rerun once the files are complete (e.g. after the export that writes them has finished)",
            )
        if isinstance(err, DataError):
            raise err
        if isinstance(err, UnreadableImageError) and on_bad_image == "fail":
            raise bad_image(err.path, err.err)
    for i in sorted(first_error):
        log.warning("skipped %s: %s", paths[i], one_line(first_error[i]))
    if progress is not None:
        progress(total, total)
    kept = np.flatnonzero(ok)
    return (images if len(kept) == total else images[kept]), kept.tolist()
