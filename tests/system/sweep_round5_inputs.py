"""Sweep cases of issue 59 (round five) in its classes 1, 2, 3 and 5 and their neighbours:
pixel formats (class 1), class names (class 2), array headers and evaluators' requirements
on the data (class 3), and messages that must name the real cause (class 5), through
training (an image folder or arrays as ``data.path``), ``flows.predict --images``,
``flows.monitor --images`` and an ``ood`` evaluator's source.

Every pixel mode either trains and predicts on pixels converted as documented (the case
reads the prepared dataset back, or predicts each file beside an 8-bit PNG of the values it
must decode to, and compares them exactly with the values computed here: NumPy on the
values written, or Pillow's own ``convert`` where the documentation says so) or is refused
in one line naming the mode. Every refusal is followed by a rerun with the input fixed as
the message says, which must complete: nothing a refusal left behind may block it.

The case names start with ``r5in-`` (``benchmarks.reliability_sweep --only r5in-``).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import struct
import unicodedata
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms

from tests.system.sweep import Ctx, Proc, case_table, check_json, error_lines, listing, nothing_under

T, PR, MO = "train CLI", "predict CLI", "monitor CLI"
CASES, case = case_table()
SIDE = 16  # pixels a side of every image written here
PER_CLASS = {"train": 12, "test": 4}
QUICK = 120  # seconds: a refusal before training
LONG = 300  # seconds: a run that trains (about 20 s on two cores)

# MARK: files written as an export would write them


def _png16_rgb(path: Path, raw: np.ndarray) -> None:
    """A 16-bit RGB PNG of uint16 ``raw`` ``[H, W, 3]``, written byte by byte (Pillow
    writes no 16-bit RGB PNG)."""
    height, width, _ = raw.shape
    rows = b"".join(b"\x00" + raw[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)  # 16 bits, truecolour
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    )


def _npy_header(shape: tuple[int, ...], descr: str = "|u1", fortran: bool = False) -> bytes:
    """A ``.npy`` version 1.0 header claiming ``shape`` of ``descr`` (no data)."""
    text = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype.hasobject)
    return buffer.getvalue()


def _npz(path: Path, members: dict[str, np.ndarray | bytes], compression: int = zipfile.ZIP_STORED) -> None:
    """A ``.npz`` whose members are arrays (saved as ``numpy.save`` does) or raw bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, value in members.items():
            archive.writestr(f"{name}.npy", value if isinstance(value, bytes) else _npy_bytes(value))


def _grey(rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[SIDE, SIDE]`` noise holding 0 and 255."""
    values = rng.integers(0, 256, (SIDE, SIDE), np.uint8)
    values[0, :2] = (0, 255)
    return values


def _rgb(rng: np.random.Generator) -> np.ndarray:
    values = rng.integers(0, 256, (SIDE, SIDE, 3), np.uint8)
    values[0, 0], values[0, 1] = (0, 0, 0), (255, 255, 255)
    return values


def _ramp16(rng: np.random.Generator, top: int = 65535) -> np.ndarray:
    """uint16-range values ``[SIDE, SIDE]`` (int64) over 0..top, both ends and the bytes' edges held."""
    values = rng.integers(0, top + 1, (SIDE, SIDE)).astype(np.int64)
    values[0, :6] = (0, 255, 256, 32767, 32768, top)
    return values


#: A pixel format: ``(suffix, channels, make(rng, path) -> expected)``: ``make`` writes one
#: image at ``path`` and returns the uint8 ``[SIDE, SIDE, channels]`` it must decode to with
#: ``data.channels: channels``, computed independently of the pipeline (NumPy on the values
#: written; Pillow's own ``convert`` for the modes the documentation says it converts).
Maker = Callable[[np.random.Generator, Path], np.ndarray]


def _png8(channels: int) -> Maker:
    def make(rng: np.random.Generator, path: Path) -> np.ndarray:
        values = _grey(rng) if channels == 1 else _rgb(rng)
        Image.fromarray(values).save(path)
        return values.reshape(SIDE, SIDE, channels)

    return make


def _bilevel(rng: np.random.Generator, path: Path) -> np.ndarray:
    bits = rng.random((SIDE, SIDE)) > 0.5
    bits[0, :2] = (False, True)
    Image.fromarray(bits).save(path)
    assert Image.open(path).mode == "1"
    return np.where(bits, 255, 0).astype(np.uint8)[..., None]


def _sixteen_big_endian(rng: np.random.Generator, path: Path) -> np.ndarray:
    raw = _ramp16(rng)
    Image.fromarray(raw.astype(">u2")).save(path)  # a big-endian 16-bit grey TIFF
    assert Image.open(path).mode == "I;16B", Image.open(path).mode
    return (raw >> 8).astype(np.uint8)[..., None]


def _int32(top: int = 65535) -> Maker:
    def make(rng: np.random.Generator, path: Path) -> np.ndarray:
        raw = _ramp16(rng, top)
        Image.fromarray(raw.astype(np.int32)).save(path)
        assert Image.open(path).mode == "I"
        return (np.clip(raw, 0, 65535) >> 8).astype(np.uint8)[..., None]

    return make


def _float(top: float = 1.0) -> Maker:
    """32-bit float grey (``F``) over ``[0, top]``: a TIFF, or by the path's suffix a PFM
    (the portable float map, an HDR format Pillow reads and writes)."""

    def make(rng: np.random.Generator, path: Path) -> np.ndarray:
        values = (rng.random((SIDE, SIDE)) * top).astype(np.float32)
        values[0, :3] = (0.0, top, 0.5 * top)
        Image.fromarray(values).save(path)
        with Image.open(path) as check:
            assert check.mode == "F" and np.array_equal(np.asarray(check), values)
        return np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8)[..., None]

    return make


def _pillow_converts(write: Callable[[np.random.Generator, Path], None], channels: int) -> Maker:
    """A mode the documentation converts with Pillow's own ``Image.convert``: the expected
    values are Pillow's conversion of the file as read (LAB to grey: LAB -> RGB -> L)."""

    def make(rng: np.random.Generator, path: Path) -> np.ndarray:
        write(rng, path)
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        target = rgb if channels == 3 else rgb.convert("L")
        return np.asarray(target, np.uint8).reshape(SIDE, SIDE, channels)

    return make


def _write_cmyk_jpeg(rng: np.random.Generator, path: Path) -> None:
    Image.fromarray(_rgb(rng)).convert("CMYK").save(path, quality=95)
    assert Image.open(path).mode == "CMYK"


def _write_lab_tiff(rng: np.random.Generator, path: Path) -> None:
    srgb, lab = ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB")
    transform = ImageCms.buildTransformFromOpenProfiles(srgb, lab, "RGB", "LAB")
    ImageCms.applyTransform(Image.fromarray(_rgb(rng)), transform).save(path)
    assert Image.open(path).mode == "LAB"


def _write_palette_transparency(rng: np.random.Generator, path: Path) -> None:
    """A palette PNG with a tRNS chunk of 16 alpha values (transparency as bytes)."""
    image = Image.fromarray(_rgb(rng)).quantize(16)
    image.save(path, transparency=bytes(range(0, 256, 16)))
    with Image.open(path) as check:
        assert check.mode == "P" and isinstance(check.info.get("transparency"), bytes)


def _rgb16(rng: np.random.Generator, path: Path) -> np.ndarray:
    raw = np.stack([_ramp16(rng) for _ in range(3)], axis=-1)
    _png16_rgb(path, raw)
    return (raw >> 8).astype(np.uint8)


def _frames(kind: str) -> Maker:
    """An animated GIF or a multi-page TIFF of three grey frames: the first is the image."""

    def make(rng: np.random.Generator, path: Path) -> np.ndarray:
        frames = [Image.fromarray(_grey(rng)) for _ in range(3)]
        frames[0].save(path, save_all=True, append_images=frames[1:], **({"loop": 0} if kind == "gif" else {}))
        with Image.open(path) as check:
            assert check.n_frames == 3
            assert np.array_equal(np.asarray(check.convert("L")), np.asarray(frames[0]))  # a grey GIF palette is exact
        return np.asarray(frames[0], np.uint8)[..., None]

    return make


#: name -> (file suffix, data.channels, maker, what)
MODES: dict[str, tuple[str, int, Maker, str]] = {
    "1bit-png": (".png", 1, _bilevel, "bilevel PNGs (Pillow mode '1'): 0 and 255"),
    "i16b-tiff": (".tif", 1, _sixteen_big_endian, "big-endian 16-bit grey TIFFs (I;16B): the high byte"),
    "int32-tiff": (".tif", 1, _int32(), "32-bit integer TIFFs (I) of 16-bit data: the high byte"),
    "float-tiff": (".tif", 1, _float(), "32-bit float TIFFs (F) in [0, 1]: round(v * 255)"),
    "pfm": (".pfm", 1, _float(), "portable float maps (PFM, an HDR format) in [0, 1]"),
    "cmyk-jpeg": (".jpg", 3, _pillow_converts(_write_cmyk_jpeg, 3), "CMYK JPEGs: Pillow's CMYK -> RGB"),
    "lab-tiff": (".tif", 3, _pillow_converts(_write_lab_tiff, 3), "CIELAB TIFFs: littleCMS's LAB -> sRGB"),
    "palette-trns": (
        ".png",
        3,
        _pillow_converts(_write_palette_transparency, 3),
        "palette PNGs with a transparency chunk: the colours stored, alpha dropped",
    ),
    "rgb16-png": (".png", 3, _rgb16, "16-bit RGB PNGs: the high byte of each channel"),
    "animated-gif": (".gif", 1, _frames("gif"), "animated GIFs of 3 frames: the first frame"),
    "multipage-tiff": (".tif", 1, _frames("tiff"), "3-page TIFFs: the first page"),
}


def _folder(
    root: Path,
    make: Maker,
    suffix: str,
    classes: tuple[str, ...] = ("a", "b"),
    per_class: dict[str, int] | None = None,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``root/<split>/<class>/<i:03d><suffix>`` for each split of ``per_class``, and per
    split the ``(images, labels)`` the pipeline must prepare, in the order it reads them
    (by the file's path below its class folder, then the class)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (per_class or PER_CLASS).items():
        rows = []
        for label, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                path = root / split / name / f"{i:03d}{suffix}"
                rows.append((f"{i:03d}{suffix}", name, make(rng, path), label))
        rows.sort(key=lambda r: (r[0], r[1]))
        out[split] = (np.stack([r[2] for r in rows]), np.asarray([r[3] for r in rows]))
    return out


# MARK: what the cases run


def _train_folder(
    ctx: Ctx,
    root: Path,
    *sets: str,
    channels: int | None = None,
    out: Path | None = None,
    run: str = "r",
    data: Path | None = None,
    timeout: float = LONG,
) -> Proc:
    """The training CLI on the image folder or arrays ``root`` (the source by what it holds),
    prepared in the case's own data dir."""
    source = "arrays" if (root / "train.npz").exists() else "image_folder"
    argv = ["--set", f"data.source={source}", "--set", f"data.path={root}"]
    argv += ["--set", f"data.data_dir={data or ctx.dir / 'data'}", "--set", "train.batch_size=16"]
    argv += ["--set", f"data.channels={channels}"] if channels else []
    return ctx.train(*argv, *sets, out=out or ctx.dir / "runs", run=run, timeout=timeout)


READER = """import json, sys
import numpy as np
from ensemble_core import data
snap = json.load(open(sys.argv[1]))
arrays = {}
for split in ("train", "test"):
    images, labels = data.load_split(snap["name"], split, snap["path"])
    arrays[split + "_images"], arrays[split + "_labels"] = images, labels
np.savez(sys.argv[2], **arrays)
"""


def _prepared(ctx: Ctx, run_dir: Path) -> dict[str, np.ndarray] | None:
    """The run's prepared dataset as the pipeline reads it back (a process of its own
    through ``ensemble_core.data.load_split``): ``<split>_images``/``<split>_labels``."""
    snapshot = run_dir / "data_snapshot.json"
    if not check_json(snapshot):
        return None
    out = ctx.dir / "prepared.npz"
    proc = ctx.cli(["-c", READER, str(snapshot), str(out)], timeout=180)
    if proc.rc != 0 or not out.exists():
        return None
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def _same_pixels(prepared: dict | None, expected: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[bool, str]:
    """Whether the prepared splits hold exactly the expected images and labels."""
    if prepared is None:
        return False, "no prepared dataset to read back"
    for split, (images, labels) in expected.items():
        got, got_labels = prepared[f"{split}_images"], prepared[f"{split}_labels"]
        if got.shape != images.shape or not np.array_equal(got_labels, labels):
            return False, f"{split}: prepared {got.shape} labels {got_labels[:6]}, expected {images.shape} {labels[:6]}"
        if not np.array_equal(got, images):
            diff = int(np.abs(got.astype(int) - images.astype(int)).max())
            return False, f"{split}: pixels differ from the documented conversion (by up to {diff})"
    return True, "prepared pixels equal the documented conversion"


def _no_dataset(data: Path) -> bool:
    """No prepared dataset and no partial one under the data dir ``data``."""
    return not any(data.rglob("dataset_info.json")) and not any("incomplete" in p.name for p in data.rglob("*"))


def _refused_nothing_left(ctx: Ctx, out: Path | None = None) -> tuple[bool, str]:
    out = out or ctx.dir / "runs"
    clean = nothing_under(out) and _no_dataset(ctx.dir / "data")
    return clean, "nothing written" if clean else f"left {listing(out)[:3]} / {listing(ctx.dir / 'data')[:5]}"


def _rerun(ctx: Ctx, ok: bool, note: str, fixed: Callable[[], Proc]) -> tuple[bool, str]:
    """After a refusal: the input fixed as the message says, the command again must complete."""
    again = fixed()
    done = again.rc == 0
    return ok and done, f"{note}; rerun with the input fixed: exit {again.rc}"


def _shared_run(ctx: Ctx, channels: int) -> Path | None:
    """A finished run trained on 16x16 8-bit PNGs with ``data.channels: channels``, trained
    once per sweep (by the first case that needs it; a lock for cases side by side)."""
    kind = "grey" if channels == 1 else "rgb"
    root = ctx.dir.parents[1] / "r5in-shared"
    root.mkdir(exist_ok=True)
    run = root / kind / "runs" / kind
    with open(root / f"{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not check_json(run / "report.json"):
            shutil.rmtree(root / kind, ignore_errors=True)
            images = root / kind / "images"
            _folder(images, _png8(channels), ".png", per_class={"train": 40, "test": 8})
            proc = _train_folder(
                ctx, images, channels=channels, out=root / kind / "runs", run=kind, data=root / kind / "data"
            )
            if proc.rc != 0:
                ctx.notes.append(f"the shared {kind} run failed: exit {proc.rc}")
                return None
    return run


def _files_and_references(
    ctx: Ctx, make: Maker, suffix: str, channels: int, n: int = 4
) -> tuple[list[Path], list[Path]]:
    """``n`` files of a pixel format and, for each, an 8-bit PNG of the values it must decode to."""
    rng = np.random.default_rng(7)
    files, refs = [], []
    (ctx.dir / "in").mkdir()
    for i in range(n):
        path, ref = ctx.dir / "in" / f"x{i}{suffix}", ctx.dir / "in" / f"ref{i}.png"
        expected = make(rng, path)
        Image.fromarray(expected[..., 0] if channels == 1 else expected).save(ref)
        files.append(path)
        refs.append(ref)
    return files, refs


def _same_predictions(path: Path, n: int) -> tuple[bool, str]:
    """Whether the first ``n`` rows of the predictions at ``path`` (a ``.npz``) equal the
    next ``n`` exactly (every member's probabilities), and differ between images."""
    if not path.exists():
        return False, f"no {path.name}"
    with np.load(path, allow_pickle=False) as z:
        probs, members = z["ensemble_probs"], z["member_probs"]
    if len(probs) != 2 * n:
        return False, f"{len(probs)} predictions for {2 * n} files"
    same = np.array_equal(probs[:n], probs[n:]) and np.array_equal(members[:, :n], members[:, n:])
    distinct = len({row.tobytes() for row in probs[:n]}) > 1  # the model tells these images apart
    note = (
        "each file predicted exactly as its documented conversion" if same else "predictions differ from the reference"
    )
    return same and distinct, note + ("" if distinct else "; the images are not told apart (vacuous)")


def _predict(ctx: Ctx, run: Path, files: list[Path], out: Path | None = None, timeout: float = 180) -> Proc:
    out = out or ctx.dir / "pred.npz"
    return ctx.predict("--images", *map(str, files), "--run-dir", str(run), "--output", str(out), timeout=timeout)


def _monitor(ctx: Ctx, run: Path, files: list[Path], night: str, out: Path | None = None) -> Proc:
    out = out or ctx.dir / "mon"
    argv = ["-m", "flows.monitor", "--images", *map(str, files), "--run-dir", str(run), "--output-dir", str(out)]
    return ctx.cli([*argv, "--night", night], timeout=180)


# MARK: class 1: pixel formats through training, prediction and monitoring


def _train_mode(name: str, suffix: str, channels: int, make: Maker, what: str) -> None:
    @case(T, f"r5in-train-{name}", 0, f"an image folder of {what} (data.channels: {channels})")
    def run(ctx: Ctx):
        expected = _folder(ctx.dir / "images", make, suffix)
        proc = _train_folder(ctx, ctx.dir / "images", channels=channels)
        ok, note = _same_pixels(_prepared(ctx, ctx.dir / "runs" / "r"), expected)
        return proc, ok and check_json(ctx.dir / "runs" / "r" / "report.json"), note


def _predict_mode(name: str, suffix: str, channels: int, make: Maker, what: str) -> None:
    @case(PR, f"r5in-predict-{name}", 0, f"--images of {what}, beside 8-bit PNGs of their documented conversion")
    def run(ctx: Ctx):
        shared = _shared_run(ctx, channels)
        files, refs = _files_and_references(ctx, make, suffix, channels)
        if shared is None:
            return ctx.procs[-1], False, "no shared run"
        proc = _predict(ctx, shared, [*files, *refs])
        ok, note = _same_predictions(ctx.dir / "pred.npz", len(files))
        return proc, ok, note


for _name, (_suffix, _channels, _make, _what) in MODES.items():
    _train_mode(_name, _suffix, _channels, _make, _what)
    if _name not in ("i16b-tiff", "animated-gif", "int32-tiff"):  # those three: training's only
        _predict_mode(_name, _suffix, _channels, _make, _what)


def _monitor_mode(name: str, suffix: str, channels: int, make: Maker, what: str) -> None:
    @case(MO, f"r5in-monitor-{name}", 0, f"a monitored night of {what}, and a night of their documented conversion")
    def run(ctx: Ctx):
        shared = _shared_run(ctx, channels)
        files, refs = _files_and_references(ctx, make, suffix, channels)
        if shared is None:
            return ctx.procs[-1], False, "no shared run"
        proc = _monitor(ctx, shared, files, "files")
        again = _monitor(ctx, shared, refs, "references")
        folder = ctx.dir / "mon" / "monitoring"
        if proc.rc != 0 or again.rc != 0 or not (folder / "files.npz").exists():
            return proc, False, f"exits {proc.rc}, {again.rc}"
        with np.load(folder / "files.npz") as a, np.load(folder / "references.npz") as b:
            same = np.array_equal(a["ensemble_probs"], b["ensemble_probs"])
        return proc, same, "the night scored its files as their documented conversion" if same else "nights differ"


_monitor_mode("i16b-tiff", *MODES["i16b-tiff"])
_monitor_mode("lab-tiff", *MODES["lab-tiff"])


def _sixteen_bit_png(rng: np.random.Generator, path: Path) -> np.ndarray:
    raw = _ramp16(rng)
    Image.fromarray(raw.astype(np.uint16)).save(path)
    return (raw >> 8).astype(np.uint8)[..., None]


#: A refusal of values outside a mode's range, not of a file that cannot be decoded.
NOT_UNDECODABLE = "^(?!.*cannot be decoded).*"
#: name -> (suffix, bad maker, good maker, sets, cause, what): one bad file among good ones
REFUSED_MODES = {
    "int32-beyond-16bit": (
        ".tif",
        _int32(70_000),
        _int32(),
        (),
        NOT_UNDECODABLE + r"'I'.*0\.\.70000.*outside \[0, 65535\]",
        "one 32-bit integer TIFF with values up to 70,000 among 16-bit ones",
    ),
    "float-0-255": (
        ".tif",
        _float(255.0),
        _float(),
        (),
        NOT_UNDECODABLE + r"'F'.*0\.\.255.*outside \[0, 1\]",
        "one float TIFF of 0..255 (not the documented [0, 1]) among float TIFFs of [0, 1]",
    ),
    "float-0-255-skip": (
        ".tif",
        _float(255.0),
        _float(),
        ("--set", "data.on_bad_image=skip"),
        NOT_UNDECODABLE + r"'F'.*0\.\.255.*outside \[0, 1\]",
        "the same with data.on_bad_image: skip: values out of range are no unreadable file to leave out",
    ),
    "pfm-hdr": (
        ".pfm",
        _float(12.5),
        _float(),
        (),
        NOT_UNDECODABLE + r"'F'.*0\.\.12\.5.*outside \[0, 1\]",
        "one HDR portable float map with radiances up to 12.5",
    ),
}


def _train_refused_mode(name: str, suffix: str, bad: Maker, good: Maker, sets: tuple, cause: str, what: str) -> None:
    @case(T, f"r5in-train-{name}", 2, what, cause=cause)
    def run(ctx: Ctx):
        root = ctx.dir / "images"
        _folder(root, good, suffix)
        bad(np.random.default_rng(1), root / "train" / "b" / f"005{suffix}")
        proc = _train_folder(ctx, root, *sets, channels=1, timeout=QUICK)
        ok, note = _refused_nothing_left(ctx)
        line = (error_lines(proc.err, "err") or [""])[0]
        named = "005" in line  # the file
        good(np.random.default_rng(1), root / "train" / "b" / f"005{suffix}")
        ok, note = _rerun(ctx, ok and named, note, lambda: _train_folder(ctx, root, *sets, channels=1))
        return proc, ok, note + ("" if named else "; the line does not name the file")


for _name, (_suffix, _bad, _good, _sets, _cause, _what) in REFUSED_MODES.items():
    _train_refused_mode(_name, _suffix, _bad, _good, _sets, _cause, _what)


def _predict_refused_mode(name: str, suffix: str, bad: Maker, good: Maker, cause: str, what: str) -> None:
    @case(PR, f"r5in-predict-{name}", 2, f"--images: {what}", cause=cause)
    def run(ctx: Ctx):
        shared = _shared_run(ctx, 1)
        files, _ = _files_and_references(ctx, good, suffix, 1, n=3)
        bad(np.random.default_rng(1), files[1])
        if shared is None:
            return ctx.procs[-1], False, "no shared run"
        proc = _predict(ctx, shared, files)
        ok = not any(p.name.startswith("pred") for p in ctx.dir.iterdir())
        good(np.random.default_rng(1), files[1])
        ok, note = _rerun(
            ctx, ok, "nothing written" if ok else "wrote predictions", lambda: _predict(ctx, shared, files)
        )
        return proc, ok, note


_predict_refused_mode("int32-beyond-16bit", *[REFUSED_MODES["int32-beyond-16bit"][i] for i in (0, 1, 2, 4, 5)])
_predict_refused_mode("float-0-255", *[REFUSED_MODES["float-0-255"][i] for i in (0, 1, 2, 4, 5)])


@case(
    MO,
    "r5in-monitor-float-0-255",
    2,
    "a night holding a float TIFF of 0..255",
    cause=NOT_UNDECODABLE + r"'F'.*outside \[0, 1\]",
)
def monitor_float_out_of_range(ctx: Ctx):
    shared = _shared_run(ctx, 1)
    files, _ = _files_and_references(ctx, _float(), ".tif", 1, n=3)
    _float(255.0)(np.random.default_rng(1), files[2])
    if shared is None:
        return ctx.procs[-1], False, "no shared run"
    proc = _monitor(ctx, shared, files, "night")
    ok = not listing(ctx.dir / "mon" / "monitoring")
    _float()(np.random.default_rng(1), files[2])
    ok, note = _rerun(
        ctx, ok, "no night recorded" if ok else "a night recorded", lambda: _monitor(ctx, shared, files, "night")
    )
    return proc, ok, note


@case(T, "r5in-train-16bit-png-no-channels", 2, "16-bit grey PNGs without data.channels", cause=r"'I;16'")
def sixteen_bit_without_channels(ctx: Ctx):
    root = ctx.dir / "images"
    _folder(root, _sixteen_bit_png, ".png")
    proc = _train_folder(ctx, root, timeout=QUICK)
    ok, note = _refused_nothing_left(ctx)
    line = (error_lines(proc.err, "err") or [""])[0]
    fix_named = "data.channels" in line.split("fix:")[-1]
    ok, note = _rerun(ctx, ok and fix_named, note, lambda: _train_folder(ctx, root, channels=1))
    return proc, ok, note + ("" if fix_named else "; the fix does not name data.channels")


@case(
    PR,
    "r5in-predict-16bit-png-on-grey-8bit-run",
    2,
    "16-bit PNGs to the base run (trained without data.channels)",
    cause=r"'I;16'",
)
def sixteen_bit_to_base(ctx: Ctx):
    rng = np.random.default_rng(3)
    (ctx.dir / "in").mkdir()
    path = ctx.dir / "in" / "x.png"
    Image.fromarray(rng.integers(0, 65536, (28, 28)).astype(np.uint16)).save(path)
    out = ctx.dir / "pred.npz"
    proc = ctx.predict("--images", str(path), "--run-dir", str(ctx.base / "base"), "--output", str(out))
    ok = not out.exists() and not out.with_suffix(".csv").exists()
    Image.fromarray((rng.integers(0, 256, (28, 28))).astype(np.uint8)).save(path)
    again = ctx.predict("--images", str(path), "--run-dir", str(ctx.base / "base"), "--output", str(out))
    return proc, ok and again.rc == 0, f"rerun with an 8-bit PNG: exit {again.rc}"


# MARK: class 1 and 5 on an ood evaluator's source


def _ood_sets(name: str, path: Path) -> tuple[str, ...]:
    return ("--set", f"eval.evaluators={{test: {{}}, {name}: {{type: ood, source: image_folder, path: {path}}}}}")


@case(
    T,
    "r5in-ood-folder-16bit",
    0,
    "an ood evaluator's image folder (a classifier's layout) of 16-bit PNGs; the run converts (data.channels: 1)",
)
def ood_sixteen_bit(ctx: Ctx):
    _folder(ctx.dir / "images", _png8(1), ".png")
    _folder(ctx.dir / "far", _sixteen_bit_png, ".png", seed=4)
    proc = _train_folder(ctx, ctx.dir / "images", *_ood_sets("far", ctx.dir / "far"), channels=1)
    report = ctx.dir / "runs" / "r" / "report.json"
    far = json.loads(report.read_text()).get("evaluations", {}).get("far", {}) if check_json(report) else {}
    scored = bool(far.get("metrics")) and not far.get("skipped") and "skipped" not in json.dumps(far)[:300]
    return proc, scored, "the OOD set scored" if scored else f"ood: {json.dumps(far)[:200]}"


@case(
    T,
    "r5in-ood-loose-float-0-255",
    2,
    "an ood evaluator's loose images, one a float TIFF of 0..255: refused before training",
    cause=NOT_UNDECODABLE + r"'F'.*outside \[0, 1\]",
)
def ood_loose_float(ctx: Ctx):
    _folder(ctx.dir / "images", _png8(1), ".png")
    far = ctx.dir / "far"
    far.mkdir()
    rng = np.random.default_rng(5)
    for i in range(12):
        _png8(1)(rng, far / f"{i:03d}.png")
    _float(255.0)(rng, far / "zz-last.tif")
    proc = _train_folder(ctx, ctx.dir / "images", *_ood_sets("far", far), channels=1)
    ok, note = nothing_under(ctx.dir / "runs"), "no run written" if nothing_under(ctx.dir / "runs") else "trained first"
    _float()(rng, far / "zz-last.tif")
    ok, note = _rerun(ctx, ok, note, lambda: _train_folder(ctx, ctx.dir / "images", *_ood_sets("far", far), channels=1))
    return proc, ok, note


# MARK: class 2: class names


def _named_folder(root: Path, classes: tuple[str | bytes, ...], seed: int = 0) -> None:
    """An image folder of 8-bit grey PNGs with class folders named ``classes`` (bytes: a
    name that is not UTF-8) in train and test."""
    rng = np.random.default_rng(seed)
    for split, n in PER_CLASS.items():
        for name in classes:
            folder = os.path.join(os.fsencode(root / split), name if isinstance(name, bytes) else os.fsencode(name))
            os.makedirs(folder)
            for i in range(n):
                Image.fromarray(_grey(rng)).save(os.path.join(folder, b"%03d.png" % i))


def _rename(root: Path, old: str | bytes, new: str) -> None:
    for split in PER_CLASS:
        base = os.fsencode(root / split)
        os.rename(
            os.path.join(base, old if isinstance(old, bytes) else os.fsencode(old)),
            os.path.join(base, os.fsencode(new)),
        )


#: name -> (class folders, the folder to rename for the rerun, cause, what)
BAD_NAMES = {
    "name-tab": (("a\tb", "c"), "a\tb", r"control character '\\t'", "a class folder named with a tab"),
    "name-leading-space": ((" a", "b"), " a", r"white space", "a class folder whose name begins with a space"),
    "name-trailing-space": (("a", "b "), "b ", r"white space", "a class folder whose name ends with a space"),
    "name-not-utf8": (
        (b"a\xff", "b"),
        b"a\xff",
        r"class folder b'a\\xff'.*not valid UTF-8",
        "a class folder whose name is not UTF-8 (byte 0xff)",
    ),
    "name-carriage-return": (("a\r", "b"), "a\r", r"control character '\\r'", "a class folder name ending in CR"),
}


def _bad_name(name: str, classes: tuple, old: str | bytes, cause: str, what: str) -> None:
    @case(T, f"r5in-{name}", 2, what, cause=cause)
    def run(ctx: Ctx):
        root = ctx.dir / "images"
        _named_folder(root, classes)
        proc = _train_folder(ctx, root, timeout=QUICK)
        ok, note = _refused_nothing_left(ctx)
        _rename(root, old, "renamed")
        return (proc, *_rerun(ctx, ok, note, lambda: _train_folder(ctx, root)))


for _name, (_classes, _old, _cause, _what) in BAD_NAMES.items():
    _bad_name(_name, _classes, _old, _cause, _what)


def _class_map(run_dir: Path) -> list[str] | None:
    snapshot = run_dir / "data_snapshot.json"
    return json.loads(snapshot.read_text()).get("class_names") if check_json(snapshot) else None


def _kept_names(classes: tuple[str, ...], what: str, name: str) -> None:
    @case(T, f"r5in-{name}", 0, what)
    def run(ctx: Ctx):
        root = ctx.dir / "images"
        _named_folder(root, classes)
        proc = _train_folder(ctx, root)
        names = _class_map(ctx.dir / "runs" / "r")
        want = sorted(unicodedata.normalize("NFC", c) for c in classes)
        pred = ctx.dir / "pred.npz"
        files = [root / "test" / c / "000.png" for c in classes]
        predicted = _predict(ctx, ctx.dir / "runs" / "r", files, pred) if proc.rc == 0 else proc
        in_pred = None
        if predicted.rc == 0 and pred.exists():
            with np.load(pred, allow_pickle=False) as z:
                in_pred = [str(n) for n in z["class_names"]]
        ok = names == want and in_pred == want
        return proc, ok, f"class map {names!r}, predictions' {in_pred!r}, expected {want!r}"


_kept_names(
    ("Cat", "cat", "CAT"),
    "three class folders whose names differ only in case: three distinct classes",
    "name-case-only",
)
_kept_names(
    ("1\u22152", "a\uff0fb", "c\u2044d"),
    "class folders named with slash look-alikes (division slash, fullwidth solidus, fraction slash)",
    "name-slash-lookalikes",
)
_kept_names(("\u00e9" * 127 + "x", "b"), "a class folder name of 255 bytes (the file system's limit)", "name-255-bytes")


def _latin1_names(folder: Path, n: int, rng: np.random.Generator, channels: int = 1) -> list[Path]:
    """``n`` 8-bit PNGs in ``folder`` named in Latin-1 (``café`` with the byte 0xe9: not UTF-8)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        raw = os.path.join(os.fsencode(folder), b"%03d-caf\xe9.png" % i)
        Image.fromarray(_grey(rng) if channels == 1 else _rgb(rng)).save(raw)
        paths.append(Path(os.fsdecode(raw)))
    return paths


@case(T, "r5in-file-names-not-utf8-carved", 0, "image files named in Latin-1 (not UTF-8), no test/ folder: the carve")
def file_names_not_utf8(ctx: Ctx):
    rng = np.random.default_rng(11)
    for c in ("a", "b"):
        _latin1_names(ctx.dir / "images" / "train" / c, 12, rng)
    proc = _train_folder(ctx, ctx.dir / "images")
    prepared = _prepared(ctx, ctx.dir / "runs" / "r")
    counts = None if prepared is None else (len(prepared["train_labels"]), len(prepared["test_labels"]))
    ok = counts is not None and sum(counts) == 24 and counts[1] > 0
    return proc, ok, f"train/test {counts} of 24 images"


def _not_utf8_night(ctx: Ctx, command: str) -> tuple[Proc, bool, str]:
    shared = _shared_run(ctx, 1)
    rng = np.random.default_rng(12)
    files = _latin1_names(ctx.dir / "in", 3, rng)
    refs = []
    for i, path in enumerate(files):
        refs.append(ctx.dir / f"ref{i}.png")
        shutil.copyfile(path, refs[-1])
    if shared is None:
        return ctx.procs[-1], False, "no shared run"
    if command == "predict":
        proc = _predict(ctx, shared, [ctx.dir / "in", *refs])
        table, npz = ctx.dir / "pred.csv", ctx.dir / "pred.npz"
    else:
        proc = _monitor(ctx, shared, [ctx.dir / "in", *refs], "night")
        table, npz = ctx.dir / "mon" / "monitoring" / "night.csv", ctx.dir / "mon" / "monitoring" / "night.npz"
    same, note = _same_predictions(npz, 3)
    named = table.exists() and "000-caf\\xe9.png" in table.read_text(encoding="utf-8")
    return proc, same and named, note + ("; the table names the files, escaped" if named else "; no row names them")


@case(PR, "r5in-predict-file-names-not-utf8", 0, "--images of a folder of files named in Latin-1 (not UTF-8)")
def predict_not_utf8(ctx: Ctx):
    return _not_utf8_night(ctx, "predict")


@case(MO, "r5in-monitor-file-names-not-utf8", 0, "a monitored night of files named in Latin-1 (not UTF-8)")
def monitor_not_utf8(ctx: Ctx):
    return _not_utf8_night(ctx, "monitor")


def _not_utf8_argument(ctx: Ctx, command: str) -> tuple[Proc, bool, str]:
    """A folder named in Latin-1 passed as the input itself (it would be a flow run
    parameter); then, as the fix says, a UTF-8 glob pattern that matches it."""
    shared = _shared_run(ctx, 1)
    folder = ctx.dir / os.fsdecode(b"caf\xe9")
    _latin1_names(folder, 2, np.random.default_rng(13))
    if shared is None:
        return ctx.procs[-1], False, "no shared run"
    run = (
        (lambda x: _predict(ctx, shared, [x])) if command == "predict" else (lambda x: _monitor(ctx, shared, [x], "n"))
    )
    proc = run(folder)
    written = sorted(p.name for p in ctx.dir.iterdir() if p.name.startswith(("pred", "mon")))
    again = run(ctx.dir / "caf*")
    ok = not written and again.rc == 0
    return proc, ok, f"{'nothing written' if not written else f'wrote {written}'}; rerun with a glob: exit {again.rc}"


@case(
    PR,
    "r5in-predict-argument-not-utf8",
    2,
    "--images naming a folder whose name is not UTF-8",
    cause=r"input path b'.*not valid UTF-8",
)
def predict_argument_not_utf8(ctx: Ctx):
    return _not_utf8_argument(ctx, "predict")


@case(
    MO,
    "r5in-monitor-argument-not-utf8",
    2,
    "--images naming a folder whose name is not UTF-8",
    cause=r"input path b'.*not valid UTF-8",
)
def monitor_argument_not_utf8(ctx: Ctx):
    return _not_utf8_argument(ctx, "monitor")


def _arrays(root: Path, n: int = 48, classes: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, SIDE, SIDE, 1), np.uint8)
    labels = np.arange(n) % classes
    _npz(root / "train.npz", {"image": images, "label": labels})
    return images, labels


def _class_names_set(names: list[str]) -> tuple[str, str]:
    return ("--set", "data.class_names=" + json.dumps(names))


#: name -> (data.class_names, cause, what)
BAD_CLASS_NAMES = {
    "class-names-duplicate": (["cat", "cat"], r"distinct", "data.class_names listing one name twice"),
    "class-names-newline": (["a\nb", "c"], r"control character '\\n'", "data.class_names with a newline in a name"),
    "class-names-nfc-nfd-twins": (
        ["\u00e9", "e\u0301"],
        r"distinct.*NFC",
        "data.class_names with é in NFC and in NFD: one name twice",
    ),
    "class-names-tab": (["a\tb", "c"], r"control character '\\t'", "data.class_names with a tab in a name"),
}


def _bad_class_names(name: str, names: list[str], cause: str, what: str) -> None:
    @case(T, f"r5in-{name}", 2, what, cause=cause)
    def run(ctx: Ctx):
        _arrays(ctx.dir / "arrays")
        proc = _train_folder(ctx, ctx.dir / "arrays", *_class_names_set(names), timeout=QUICK)
        ok, note = _refused_nothing_left(ctx)
        return (
            proc,
            *_rerun(ctx, ok, note, lambda: _train_folder(ctx, ctx.dir / "arrays", *_class_names_set(["x", "y"]))),
        )


for _name, (_names, _cause, _what) in BAD_CLASS_NAMES.items():
    _bad_class_names(_name, _names, _cause, _what)


@case(
    T,
    "r5in-class-names-pipe-fingerprint",
    0,
    "one arrays source named ['a|b', 'c'] then ['a', 'b|c'] in one data dir: each run its own names",
)
def class_names_fingerprint(ctx: Ctx):
    _arrays(ctx.dir / "arrays")
    first = _train_folder(ctx, ctx.dir / "arrays", *_class_names_set(["a|b", "c"]), run="first")
    # another output dir (the first run is that one's champion, whose classes guard it), one data dir
    second = _train_folder(
        ctx, ctx.dir / "arrays", *_class_names_set(["a", "b|c"]), run="second", out=ctx.dir / "runs2"
    )
    names = (_class_map(ctx.dir / "runs" / "first"), _class_map(ctx.dir / "runs2" / "second"))
    ok = first.rc == 0 and names == (["a|b", "c"], ["a", "b|c"])
    return second, ok, f"class maps {names!r}"


@case(T, "r5in-classes-nfd-name", 0, "data.classes naming a class in NFD (as macOS types it) whose folder is NFC")
def classes_nfd(ctx: Ctx):
    root = ctx.dir / "images"
    _named_folder(root, ("\u00e9t\u00e9", "b", "c"))
    proc = _train_folder(ctx, root, "--set", 'data.classes=["e\u0301te\u0301", "b"]')
    report = ctx.dir / "runs" / "r" / "report.json"
    names = None
    if check_json(report):
        names = json.loads(report.read_text()).get("per_class", {})
        names = sorted(names) if isinstance(names, dict) else names
    pred = ctx.dir / "pred.npz"
    in_pred = None
    if proc.rc == 0 and _predict(ctx, ctx.dir / "runs" / "r", [root / "test" / "b" / "000.png"], pred).rc == 0:
        with np.load(pred, allow_pickle=False) as z:
            in_pred = [str(n) for n in z["class_names"]]
    ok = in_pred == ["\u00e9t\u00e9", "b"] or in_pred == ["b", "\u00e9t\u00e9"]
    return proc, ok, f"the run's classes {in_pred!r}"


@case(
    T, "r5in-classes-control-character", 2, "data.classes naming a class with a tab", cause=r"control character '\\t'"
)
def classes_control(ctx: Ctx):
    root = ctx.dir / "images"
    _named_folder(root, ("a", "b", "c"))
    proc = _train_folder(ctx, root, "--set", 'data.classes=["a\\tb", "c"]', timeout=QUICK)
    ok, note = nothing_under(ctx.dir / "runs"), "no run written"
    return (proc, *_rerun(ctx, ok, note, lambda: _train_folder(ctx, root, "--set", "data.classes=[a, c]")))


# MARK: class 3: array headers


def _train_arrays_ok(name: str, members: Callable[[np.ndarray, np.ndarray], dict], what: str) -> None:
    @case(T, f"r5in-{name}", 0, what)
    def run(ctx: Ctx):
        rng = np.random.default_rng(2)
        images = rng.integers(0, 256, (48, SIDE, SIDE, 1), np.uint8)
        labels = np.arange(48) % 2
        test_images = rng.integers(0, 256, (16, SIDE, SIDE, 1), np.uint8)
        test_labels = np.arange(16) % 2
        _npz(ctx.dir / "arrays" / "train.npz", members(images, labels))
        _npz(ctx.dir / "arrays" / "test.npz", members(test_images, test_labels))
        proc = _train_folder(ctx, ctx.dir / "arrays")
        expected = {"train": (images, labels), "test": (test_images, test_labels)}
        ok, note = _same_pixels(_prepared(ctx, ctx.dir / "runs" / "r"), expected)
        return proc, ok, note


_train_arrays_ok(
    "npz-fortran-order",
    lambda i, lab: {"image": np.asfortranarray(i), "label": lab},
    "arrays saved in Fortran order (fortran_order: True in the .npy header)",
)
_train_arrays_ok(
    "npz-big-endian-labels",
    lambda i, lab: {"image": i, "label": lab.astype(">i8")},
    "labels of a big-endian int64 dtype ('>i8')",
)


#: name -> (train.npz members from (images, labels), cause, what)
BAD_ARRAYS: dict[str, tuple[Callable[[np.ndarray, np.ndarray], dict], str, str]] = {
    "npz-image-header-huge": (
        lambda i, lab: {"image": _npy_header((10**9, SIDE, SIDE, 1)) + i.tobytes(), "label": lab},
        r"'image'.*claims.*1000000000",
        "an image member whose header claims 10^9 images (16 KB stored)",
    ),
    "npz-negative-dimension": (
        lambda i, lab: {"image": _npy_header((-48, SIDE, SIDE, 1)) + i.tobytes(), "label": lab},
        r"'image'.*a negative dimension",
        "an image member whose header claims a shape of (-48, 16, 16, 1)",
    ),
    "npz-truncated-header": (
        lambda i, lab: {"image": _npy_bytes(i)[:30], "label": lab},
        r"cannot be read as a \.npz.*reading array header",
        "an image member cut off inside its header",
    ),
    "npz-object-labels": (
        lambda i, lab: {"image": i, "label": lab.astype(object)},
        r"Python objects|pickle",
        "labels saved as an object array (a pickle)",
    ),
    "npz-float-labels": (
        lambda i, lab: {"image": i, "label": lab.astype(np.float32)},
        r"'label' is float32",
        "labels of float32",
    ),
    "npz-negative-label": (
        lambda i, lab: {"image": i, "label": np.where(np.arange(len(lab)) == 5, -1, lab)},
        r"label -1 in .*\) is negative",
        "one label of -1",
    ),
    "npz-uint16-images": (
        lambda i, lab: {"image": i.astype(np.uint16) * 257, "label": lab},
        r"'image' is uint16",
        "16-bit images (uint16) in an arrays source",
    ),
}


def _bad_arrays(name: str, members: Callable, cause: str, what: str) -> None:
    @case(T, f"r5in-{name}", 2, what, cause=cause)
    def run(ctx: Ctx):
        images, labels = _arrays(ctx.dir / "arrays")
        _npz(ctx.dir / "arrays" / "train.npz", members(images, labels))
        proc = _train_folder(ctx, ctx.dir / "arrays", timeout=QUICK)
        ok, note = _refused_nothing_left(ctx)
        if name == "npz-uint16-images":  # the fix must convert 16-bit values by their bit depth
            line = (error_lines(proc.err, "err") or [""])[0]
            ok = ok and ">> 8" in line.split("fix:")[-1]
            note += "" if ">> 8" in line else "; the fix does not scale 16-bit values"
        _arrays(ctx.dir / "arrays")
        return (proc, *_rerun(ctx, ok, note, lambda: _train_folder(ctx, ctx.dir / "arrays")))


for _name, (_members, _cause, _what) in BAD_ARRAYS.items():
    _bad_arrays(_name, _members, _cause, _what)


def _base_images(n: int = 8) -> np.ndarray:
    return np.random.default_rng(9).integers(0, 256, (n, 28, 28, 1), np.uint8)


#: name -> (write(path) of a bad --images file, suffix, cause, what)
BAD_IMAGE_ARRAYS = {
    "npy-header-huge": (
        lambda p: p.write_bytes(_npy_header((10**12, 28, 28, 1)) + _base_images().tobytes()),
        ".npy",
        r"claims.*1000000000000",
        "a .npy whose header claims 10^12 images (6 KB stored)",
    ),
    "npy-negative-dimension": (
        lambda p: p.write_bytes(_npy_header((-8, 28, 28, 1)) + _base_images().tobytes()),
        ".npy",
        r"a negative dimension",
        "a .npy whose header claims a shape of (-8, 28, 28, 1)",
    ),
    "npz-member-header-huge": (
        lambda p: _npz(p, {"images": _npy_header((10**12, 28, 28, 1)) + _base_images().tobytes()}),
        ".npz",
        r"claims.*1000000000000",
        "a .npz whose images member's header claims 10^12 images",
    ),
    "npy-truncated-header": (
        lambda p: p.write_bytes(_npy_bytes(_base_images())[:40]),
        ".npy",
        r"cannot read images from .*reading array header",
        "a .npy cut off inside its header",
    ),
}


def _bad_image_array(name: str, write: Callable[[Path], None], suffix: str, cause: str, what: str) -> None:
    @case(PR, f"r5in-predict-{name}", 2, f"--images {what}", cause=cause)
    def run(ctx: Ctx):
        path, out = ctx.dir / f"x{suffix}", ctx.dir / "pred.npz"
        write(path)
        proc = ctx.predict(
            "--images", str(path), "--run-dir", str(ctx.base / "base"), "--output", str(out), timeout=QUICK
        )
        ok = not out.exists()
        path.unlink()
        np.save(ctx.dir / "x.npy", _base_images())
        again = ctx.predict(
            "--images", str(ctx.dir / "x.npy"), "--run-dir", str(ctx.base / "base"), "--output", str(out)
        )
        return (
            proc,
            ok and again.rc == 0,
            f"{'nothing written' if ok else 'wrote predictions'}; rerun with a good .npy: exit {again.rc}",
        )


for _name, (_write, _suffix, _cause, _what) in BAD_IMAGE_ARRAYS.items():
    _bad_image_array(_name, _write, _suffix, _cause, _what)


@case(PR, "r5in-predict-npy-fortran-order", 0, "--images of a .npy in Fortran order, beside the same images in C order")
def predict_fortran(ctx: Ctx):
    images = _base_images()
    np.save(ctx.dir / "f.npy", np.asfortranarray(images))
    np.save(ctx.dir / "c.npy", images)
    proc = ctx.predict(
        "--images", str(ctx.dir / "f.npy"), "--run-dir", str(ctx.base / "base"), "--output", str(ctx.dir / "f.npz")
    )
    ctx.predict(
        "--images", str(ctx.dir / "c.npy"), "--run-dir", str(ctx.base / "base"), "--output", str(ctx.dir / "c.npz")
    )
    if not (ctx.dir / "f.npz").exists() or not (ctx.dir / "c.npz").exists():
        return proc, False, "no predictions"
    with np.load(ctx.dir / "f.npz") as f, np.load(ctx.dir / "c.npz") as c:
        same = np.array_equal(f["member_probs"], c["member_probs"])
    return proc, same, "Fortran and C order predict alike" if same else "the orders predict differently"


# MARK: class 3: evaluators' requirements on the data, in the preflight


def _evaluator_refused(
    name: str, evaluators: str, make: Callable[[Path], None], cause: str, what: str, *sets: str
) -> None:
    @case(T, f"r5in-{name}", 2, what, cause=cause)
    def run(ctx: Ctx):
        make(ctx.dir / "images")
        argv = ("--set", f"eval.evaluators={evaluators}", *sets)
        proc = _train_folder(ctx, ctx.dir / "images", *argv, timeout=QUICK)
        ok = nothing_under(ctx.dir / "runs")
        note = "refused before training" if ok else "trained first"
        return (proc, *_rerun(ctx, ok, note, lambda: _train_folder(ctx, ctx.dir / "images", *sets)))


def _small_grey(side: int) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        def png(rng: np.random.Generator, path: Path) -> np.ndarray:
            values = rng.integers(0, 256, (side, side), np.uint8)
            Image.fromarray(values).save(path)
            return values[..., None]

        _folder(root, png, ".png")

    return make


def _rgb_folder(root: Path) -> None:
    _folder(root, _png8(3), ".png")


_evaluator_refused(
    "eval-translation-beyond-width",
    "{test: {}, shift: {type: translation, pixels: [0, 4, 20]}}",
    _small_grey(16),
    r"translation.*20.*16",
    "a translation evaluator named with a shift of 20 pixels on 16-pixel-wide images (a roll by 20 is one by 4)",
)
_evaluator_refused(
    "eval-corruptions-on-6x6",
    "[test, common_corruptions]",
    _small_grey(6),
    r"at least 8x8.*6x6",
    "common_corruptions named on 6x6 images",
)
_evaluator_refused(
    "eval-letters-on-rgb",
    "[test, letters]",
    _rgb_folder,
    r"28x28x1",
    "the letters OOD set (28x28x1) named on 16x16 RGB images",
)
_evaluator_refused(
    "eval-patches-beyond-size",
    "{test: {}, mixed: {type: ood, source: shuffled_patches, patches: 20}}",
    _small_grey(16),
    r"20 x 20.*16x16",
    "shuffled patches named with a 20 x 20 grid on 16x16 images",
)
_evaluator_refused(
    "eval-held-out-none-left",
    "{test: {}, unseen: {type: ood, source: held_out_classes}}",
    _small_grey(16),
    r"data.classes lists all 2 classes",
    "an ood evaluator on the held-out classes with data.classes listing both classes",
    "--set",
    "data.classes=[a, b]",
)


@case(
    T, "r5in-eval-defaults-on-6x6", 0, "the default evaluators on 6x6 images: those that cannot run are skipped, logged"
)
def defaults_small(ctx: Ctx):
    _small_grey(6)(ctx.dir / "images")
    out = ctx.dir / "runs"
    args = ctx.train_args(out=out)
    at = args.index("eval.evaluators=[test]")
    del args[at - 1 : at + 1]  # the dataset's default evaluators instead of the sweep's test one
    sets = ["--set", "data.source=image_folder", "--set", f"data.path={ctx.dir / 'images'}"]
    sets += ["--set", f"data.data_dir={ctx.dir / 'data'}", "--set", "train.batch_size=16"]
    proc = ctx.cli([*args, *sets], timeout=LONG)
    report = out / "r" / "report.json"
    evaluations = json.loads(report.read_text()).get("evaluations", {}) if check_json(report) else {}
    skipped = sorted(k for k, v in evaluations.items() if (v.get("metrics") or {}).get("skipped"))
    logged = [ln for ln in proc.err.splitlines() if "common_corruptions" in ln and "skip" in ln]
    shifted = (evaluations.get("translation") or {}).get("metrics", {}).get("levels") or []
    shifts = [round(level["level"]) for level in shifted]  # the default 0..14 rolls, below the width: 0..5
    ok = proc.rc == 0 and "common_corruptions" in skipped and "rotation" in evaluations and len(logged) >= 1
    ok = ok and shifts == list(range(6))
    return proc, ok, f"skipped {skipped}, {len(logged)} line(s) logged; translations {shifts}"
