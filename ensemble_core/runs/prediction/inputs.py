"""What the user hands prediction: image files, folders, globs or one array file, expanded
into an ordered list and decoded exactly as the run's training decoded its image folder.

:func:`expand_inputs` turns the user's paths into :class:`Inputs` (before anything is
decoded, so that a missing path or a special file is refused at once);
:func:`decode_settings` reads how the run decoded its images (``data.image_size``,
``data.channels``, ``data.on_bad_image`` and its image shape) from its checkpoint
metadata; :func:`decode_inputs` decodes the files with training's own function
(:func:`ensemble_core.image_decoding.decode_file`), so a file predicts the same whether it
came through training's folder or through prediction.

Rules, decided here and documented in docs/deployments.md:

- inputs keep the order given; a folder is walked recursively, entries sorted by name at
  each level (training's walk of a class folder), names starting with ``.`` ignored,
  symlinks followed (a loop refused); a glob (``*``, ``?``, ``[`` in a path that does not
  exist as such) expands with ``glob.glob(recursive=True)``, sorted; a file named twice is
  predicted twice;
- ``.npy``/``.npz`` (by suffix, or a file starting with NumPy's header) is an array file:
  one of them alone, never mixed with image files (its images are taken as they are, as
  before: no resizing or conversion);
- a ``.npz`` is read without pickles: its array ``images``, else ``image`` (an arrays
  source's ``train.npz``/``test.npz``), else its only array;
- every other file is an image: with the run's ``data.on_bad_image`` ``fail`` (the
  default) a file that does not decode to the run's geometry is refused in one line
  naming the first such file, its reason and how many there are; with ``skip`` such
  files are listed (a log line each, a table row with its ``error``), never silently
  dropped. Unlike training, which skips only unreadable files and refuses a size or
  mode it could fix by its config, prediction cannot change the run's config: a file of
  another size or mode is a bad file of this run like an unreadable one.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ensemble_core import image_decoding
from ensemble_core.data.image_folder import walk_files
from ensemble_core.data.npz_arrays import check_npz_member
from ensemble_core.errors import DataError
from ensemble_core.special_files import special_kind

log = logging.getLogger(__name__)

#: Suffixes of array files (lower case).
ARRAY_SUFFIXES = (".npy", ".npz")
#: What ``.npy`` files start with.
NPY_MAGIC = b"\x93NUMPY"
#: Characters that make an input a glob pattern (when no path of that name exists).
GLOB_CHARS = ("*", "?", "[")
#: The keys of a ``.npz`` tried in order before its only array.
NPZ_KEYS = ("images", "image")
#: The fix of every refusal of an input path.
INPUT_FIX = "pass image files, folders or glob patterns, or one .npy/.npz array file"


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The user's inputs expanded: ``files``, the image files in order, or ``array``, one
    ``.npy``/``.npz`` file (exactly one of them is set)."""

    files: tuple[Path, ...] = ()
    array: Path | None = None


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """How the run decoded its images: ``image_size`` ``(H, W)`` and ``channels`` (1 or 3)
    where its config set them (``data.image_size``, ``data.channels``), ``on_bad_image``
    (``"fail"`` or ``"skip"``) and ``shape``, the ``(H, W, C)`` its model takes."""

    image_size: tuple[int, int] | None
    channels: int | None
    on_bad_image: str
    shape: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class DecodedInputs:
    """Image files decoded: ``images`` uint8 ``[n, H, W, C]`` of the files that decoded,
    ``sources`` (one per file, its path as given by the expansion, :func:`shown_path`), ``ok`` bool ``[N]``
    (``images`` holds ``ok``'s files, in order) and ``errors`` (file index -> reason, one
    line, for the files that did not decode)."""

    images: np.ndarray
    sources: tuple[str, ...]
    ok: np.ndarray
    errors: dict[int, str]


def is_glob(raw: str) -> bool:
    """Whether ``raw`` is a glob pattern: it holds ``*``, ``?`` or ``[`` and no path of that
    name exists."""
    return any(c in raw for c in GLOB_CHARS) and not os.path.lexists(raw)


def _is_array_file(path: Path) -> bool:
    if path.suffix.lower() in ARRAY_SUFFIXES:
        return True
    try:
        with path.open("rb") as f:
            return f.read(len(NPY_MAGIC)) == NPY_MAGIC
    except OSError:
        return False


def _explicit_file(path: Path) -> tuple[str, Path]:
    """``("array" | "image", path)`` for a file named by the user (or matched by a glob).

    Raises:
      DataError: a file that is neither an image Pillow identifies nor an array file.
    """
    if _is_array_file(path):
        return "array", path
    try:
        with Image.open(path):
            pass
    except UnidentifiedImageError:
        raise DataError(
            f"{str(path)!r} is neither an image Pillow reads nor a .npy/.npz array", fix=INPUT_FIX
        ) from None
    except image_decoding.PILLOW_ERRORS:
        pass  # a damaged image: decoding reports it, by the run's data.on_bad_image
    return "image", path


def _expand_one(raw: str) -> list[tuple[str, Path]]:
    """The ``(kind, path)`` items of one input, in order."""
    if is_glob(raw):
        matches = sorted(glob.glob(raw, recursive=True))
        if not matches:
            raise DataError(
                f"no file matches the pattern {raw!r}",
                fix="check the pattern (quote it so that the shell leaves it to prediction)",
            )
        paths = [Path(m) for m in matches]
        where = f"the pattern {raw!r}"
    else:
        paths = [Path(raw)]
        where = repr(raw)
    items: list[tuple[str, Path]] = []
    for path in paths:
        kind = special_kind(path)
        if kind is not None:  # opening a FIFO would block, a device read without end
            raise DataError(f"images file {str(path)!r} is {kind}, not a file", fix=INPUT_FIX)
        if path.is_dir():
            found = walk_files(path, refuse_special=True)
            if not found:
                raise DataError(f"no image file under {str(path)!r}", fix="add images to it or pass another folder")
            items.extend(("image", p) for p in found)
        elif path.is_file():
            items.append(_explicit_file(path))
        elif path.is_symlink():
            raise DataError(f"{str(path)!r} is a broken symlink", fix="remove it or point it at an image")
        else:
            raise DataError(f"images file {str(path)!r} does not exist", fix=INPUT_FIX)
    if not items:
        raise DataError(f"no image file in {where}", fix=INPUT_FIX)
    return items


def expand_inputs(raw: str | Sequence[str]) -> Inputs:
    """The user's inputs (one path or several: image files, folders, glob patterns, or one
    ``.npy``/``.npz``) as :class:`Inputs`, in the order given (rules: the module's doc).

    Raises:
      DataError: in one line naming the input: no input; a path that is not UTF-8 (files
        under a folder or matched by a pattern may be: :func:`shown_path`); a path that
        does not exist; a special file; a folder or pattern with no file; a file that is
        neither an image Pillow reads nor an array file; several array files, or arrays
        mixed with images.
    """
    raws = [raw] if isinstance(raw, str) else list(raw)
    if not raws:
        raise DataError("no input", fix=INPUT_FIX)
    for r in raws:
        if shown_path(r) != str(r):  # the inputs reach the flow run (and its record) as JSON text
            raise DataError(
                f"the input path {os.fsencode(str(r))!r} is not valid UTF-8 (the inputs are passed to the flow run "
                "as text)",
                fix="rename it, or pass a glob pattern in UTF-8 that matches it (e.g. with * for the byte), quoted",
            )
    items = [item for r in raws for item in _expand_one(str(r))]
    arrays = [p for kind, p in items if kind == "array"]
    if arrays and len(items) > 1:
        what = "several array files" if len(arrays) == len(items) else "array files and image files"
        raise DataError(
            f"the inputs mix {what} (first array: {str(arrays[0])!r})",
            fix="predict one .npy/.npz at a time (or concatenate them), image files in a run of their own",
        )
    if arrays:
        return Inputs(array=arrays[0])
    return Inputs(files=tuple(p for _, p in items))


def input_list(images: str | Sequence[str] | None) -> list[str]:
    """The user's inputs as a list of paths: one path, a list of them, or None (``[]``)."""
    if images is None:
        return []
    return [images] if isinstance(images, str) else [str(x) for x in images]


def output_stem(raw: str | Sequence[str] | None, tfds_name: str | None = None, tfds_split: str = "test") -> str:
    """The name the outputs are written under (``predictions-<stem>.npz``): one input's file
    or folder name without its suffix, ``<tfds_name>-<tfds_split>`` for a TFDS split, else
    ``images`` (several inputs, or a glob)."""
    raws = [raw] if isinstance(raw, str) else list(raw or [])
    if len(raws) == 1 and not is_glob(raws[0]):
        stem = Path(raws[0].rstrip("/")).stem
        if stem and stem not in (".", ".."):
            return stem
    if not raws and tfds_name:
        return f"{tfds_name}-{tfds_split}"
    return "images"


def read_npz(path: str | Path) -> np.ndarray:
    """The image array of a ``.npz``, read without pickles: its array ``images``, else
    ``image``, else its only array.

    Raises:
      DataError: the file is special, missing or not a readable ``.npz`` (a pickled
        object array included), holds several arrays and none of those names, or the
        array's header claims a negative dimension or more data than its member holds
        (checked before anything is allocated).
    """
    path = Path(path)
    fix = "fix: save the images with numpy.savez(path, images=images) as uint8 [N, H, W, C] (or float in [0, 1])"
    kind = special_kind(path)
    if kind is not None:
        raise DataError(f"images file {str(path)!r} is {kind}, not a file; {fix}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = list(npz.files)
            key = next((k for k in NPZ_KEYS if k in keys), keys[0] if len(keys) == 1 else None)
            if key is None:
                raise DataError(
                    f"{str(path)!r} holds {len(keys)} arrays {keys}, none named {' or '.join(NPZ_KEYS)}; {fix}"
                )
            check_npz_member(path, key)  # its header bounded by the bytes stored before numpy allocates it
            return npz[key]
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"images file {str(path)!r} does not exist", fix=INPUT_FIX) from None
    except ValueError as err:
        if "pickle" in str(err):
            raise DataError(
                f"{str(path)!r} holds Python objects (a pickled object array), not image values; {fix}"
            ) from None
        raise DataError(f"cannot read images from {str(path)!r} ({_one_line(err)}); {fix}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{str(path)!r} is not a readable .npz ({_one_line(err)}); {fix}") from None


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:240]


def decode_settings(meta: dict) -> DecodeSettings:
    """The run's decoding, from its checkpoint metadata (``meta["config"]["data"]`` and
    ``meta["dataset"]["image_shape"]``); a run that predates a key gets its default (no
    resizing, no conversion, ``fail``)."""
    data = (meta.get("config") or {}).get("data") or {}
    size = data.get("image_size")
    channels = data.get("channels")
    height, width, c = (int(d) for d in meta["dataset"]["image_shape"])
    return DecodeSettings(
        image_size=(int(size[0]), int(size[1])) if size else None,
        channels=int(channels) if channels else None,
        on_bad_image=str(data.get("on_bad_image") or "fail"),
        shape=(height, width, c),
    )


def _reason(kind: str, detail: str, settings: DecodeSettings) -> str:
    """One line saying why a file does not decode to the run's geometry."""
    height, width, channels = settings.shape
    if kind == image_decoding.MODE:
        return f"a Pillow '{detail}' image, neither grey ('L') nor RGB, and the run converts none (no data.channels)"
    if kind == image_decoding.CHANNELS:
        return f"{detail}, the run takes {channels} (it converts none: no data.channels)"
    if kind == image_decoding.SIZE:
        return f"{detail} pixels, the run takes {height}x{width} (it resizes none: no data.image_size)"
    if kind == image_decoding.MISSING:
        return "disappeared while the images were read"
    if kind == image_decoding.RANGE:  # it decodes: its values are outside its mode's range
        return f"is a {detail}"
    return f"cannot be decoded as an image ({detail})"


def decode_inputs(files: Sequence[Path], settings: DecodeSettings) -> DecodedInputs:
    """Decode ``files`` in order with training's
    :func:`ensemble_core.image_decoding.decode_file` (the run's ``image_size``,
    ``channels`` and ``shape``), every file tried.

    With ``settings.on_bad_image == "skip"`` the files that do not decode are logged one by
    one and returned in ``errors``; with ``"fail"`` they are refused.

    Raises:
      DataError: ``fail`` and a file that does not decode: one line naming the first, its
        reason and how many there are; or no file decoded at all (``skip``).
    """
    shape = settings.shape
    images = np.zeros((len(files), *shape), np.uint8)
    ok = np.zeros(len(files), bool)
    errors: dict[int, str] = {}
    for i, path in enumerate(files):
        try:
            images[i] = image_decoding.decode_file(str(path), settings.image_size, settings.channels, shape)
            ok[i] = True
        except image_decoding.ImageDecodeError as err:
            errors[i] = _reason(err.kind, err.detail, settings)
    if errors:
        first = min(errors)
        count = f"{len(errors)} of {len(files)} image files" if len(errors) > 1 else "1 image file"
        problem = f"{str(files[first])!r} {errors[first]} ({count} bad)"
        if settings.on_bad_image != "skip":
            raise DataError(
                problem,
                fix="replace or remove the bad files, or save them as the run's images: "
                f"{shape[0]}x{shape[1]} {'grey' if shape[2] == 1 else 'RGB'} (the run's data.on_bad_image is "
                "'fail'; a run trained with 'skip' lists them instead)",
            )
        if not ok.any():
            raise DataError(f"no image decodes: {problem}", fix="pass images of the run's geometry")
        for i, reason in sorted(errors.items()):
            log.warning("skipped %r: %s", str(files[i]), reason)
    return DecodedInputs(images=images[ok], sources=tuple(shown_path(p) for p in files), ok=ok, errors=errors)


def shown_path(path: str | Path) -> str:
    """``path`` as text every UTF-8 writer takes (the table, the ``.npz``, artifacts): as it
    is, or for a name that is not UTF-8 (which Python holds as lone surrogates) its bytes
    that are not UTF-8 escaped as ``\\xNN``: ``b'caf\\xe9.png'`` is ``'caf\\\\xe9.png'``."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    return text
