"""matplotlib with the non-interactive Agg backend, the one way plots are saved, and the
one way grids of example images are drawn (unlabelled, :func:`image_grid`, or each image
captioned, :func:`labelled_image_grid`), with class names shortened for display by
:func:`short_label`.

matplotlib is imported on the first :func:`subplots`, not with this module: a command
that draws nothing (a refused or stopped run, a worker, ``--help``) does not pay its
import (about 0.5 CPU s per process)."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np

from ensemble_core.atomic import atomic_write_bytes

__all__ = ["image_grid", "import_matplotlib", "labelled_image_grid", "save", "short_label", "subplots"]


@functools.cache
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def import_matplotlib() -> None:
    """Import matplotlib (Agg) now rather than at the first :func:`subplots`: for a caller
    with idle time before it draws (:func:`ensemble_core.runs.evaluation.evaluate.import_libraries`)."""
    _pyplot()


def subplots(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` on the Agg backend (imported on first use): returns
    ``(figure, axes)``; pass the figure to :func:`save`, which closes it."""
    return _pyplot().subplots(*args, **kwargs)


def save(fig, path: Path) -> Path:
    """Lay out ``fig``, write it as a 100-dpi PNG at ``path`` (fast zlib level 1; creating the directory;
    atomically, so a full disk leaves the previous plot or none, never half a PNG), close it.

    Raises:
      OSError: the file cannot be written (the figure is closed all the same).
    """
    path = Path(path)
    from matplotlib.layout_engine import TightLayoutEngine

    try:
        # The tight layout applied once, as fig.tight_layout() computes it, without leaving a
        # layout engine on the figure: after tight_layout() the figure keeps a placeholder
        # engine, and savefig draws it once more, unrendered, to lay it out again (matplotlib
        # 3.11, backend_bases.print_figure): a second draw of every figure for the same PNG.
        TightLayoutEngine().execute(fig)
        png = io.BytesIO()
        # zlib level 1, not Pillow's 6: faster saves for files about a tenth larger (measured:
        # benchmarks/results/fixed-cost-2core.json, "plot"; python -m benchmarks.fixed_cost)
        fig.savefig(png, dpi=100, format="png", pil_kwargs={"compress_level": 1})
    finally:
        _pyplot().close(fig)
    atomic_write_bytes(path, png.getvalue())
    return path


def image_grid(images: np.ndarray, row_labels: list[str] | None = None, title: str = "", pad: int = 2):
    """A figure showing uint8 ``images`` ``[R, C, H, W, Ch]`` as R rows of C images, in one
    axes: the images are tiled into one array (``pad`` white pixels between them) and drawn
    by a single ``imshow``, which costs a fraction of R * C axes (the examples plots of the
    evaluators were a third of a small run's evaluation time with one axes per image).

    ``Ch`` = 1 is drawn in grey (0 black, 255 white), ``Ch`` = 3 as RGB. ``row_labels``
    (R strings) label the rows on the left. Returns the matplotlib figure (pass it to
    :func:`save`).

    Raises:
      ValueError: ``images`` is not uint8 ``[R, C, H, W, 1 or 3]`` with R, C >= 1, or
        ``row_labels`` is not R long.
    """
    images = np.asarray(images)
    if images.ndim != 5 or images.dtype != np.uint8 or images.shape[-1] not in (1, 3) or 0 in images.shape[:2]:
        raise ValueError(f"image_grid takes uint8 [R, C, H, W, 1 or 3] images; got {images.dtype} {images.shape}")
    rows, cols, h, w, ch = images.shape
    if row_labels is not None and len(row_labels) != rows:
        raise ValueError(f"image_grid: {len(row_labels)} row labels for {rows} rows")
    tiled = np.full((rows * (h + pad) - pad, cols * (w + pad) - pad, ch), 255, np.uint8)
    for r in range(rows):
        for c in range(cols):
            tiled[r * (h + pad) : r * (h + pad) + h, c * (w + pad) : c * (w + pad) + w] = images[r, c]
    label_width = 0.08 * max((len(label) for label in row_labels), default=0) if row_labels is not None else 0.0
    fig, ax = subplots(figsize=(cols * 0.9 + label_width + 0.2, rows * 0.9 + 0.4))
    if ch == 1:
        ax.imshow(tiled[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    else:
        ax.imshow(tiled, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([r * (h + pad) + h / 2 for r in range(rows)] if row_labels is not None else [])
    if row_labels is not None:
        ax.set_yticklabels(row_labels, fontsize=7)
        ax.tick_params(axis="y", length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


#: Caption font size (points) and the inches per caption line of :func:`labelled_image_grid`.
CAPTION_FONTSIZE = 6
CAPTION_LINE_IN = 0.13


def short_label(text: str, max_chars: int = 18) -> str:
    """``text`` made fit for a plot label: characters that are not printable (control
    characters, line breaks, format characters such as zero-width joiners) become spaces,
    runs of white space one space, and a result longer than ``max_chars`` characters is cut
    to ``max_chars - 1`` and ends in "…" (U+2026). Any printable Unicode is kept (a glyph
    the plot font lacks is drawn as a box by matplotlib, with its warning); an empty result
    is "?". Draw it with ``parse_math=False`` (a ``$`` is then no mathtext).

    Raises:
      ValueError: ``max_chars < 2``.
    """
    if max_chars < 2:
        raise ValueError(f"max_chars must be >= 2; got {max_chars}")
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    if len(cleaned) > max_chars:
        cleaned = cleaned[: max_chars - 1].rstrip() + "\u2026"
    return cleaned or "?"


def labelled_image_grid(images: np.ndarray, captions: list[str], cols: int = 8, title: str = ""):
    """A figure showing uint8 ``images`` ``[N, H, W, Ch]`` in rows of ``cols``, each with
    its caption above it (``captions``: N strings, "\\n" for a second line; drawn as given,
    without mathtext: shorten names first with :func:`short_label`). As :func:`image_grid`,
    one axes and a single ``imshow`` of the tiled images (white gaps and a white caption
    band above each row), the captions placed in its pixel coordinates; each image is
    drawn 1.3 inches wide, centred in a 1.8-inch column (a titled figure at least 4
    inches wide), ``Ch`` = 1 in grey (0 black, 255 white),
    ``Ch`` = 3 as RGB. Returns the matplotlib figure (pass it to :func:`save`).

    Raises:
      ValueError: ``images`` is not uint8 ``[N, H, W, 1 or 3]`` with N >= 1, ``captions``
        is not N long, or ``cols < 1``.
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.dtype != np.uint8 or images.shape[-1] not in (1, 3) or 0 in images.shape:
        raise ValueError(
            f"labelled_image_grid takes uint8 [N, H, W, 1 or 3] images with N >= 1; got {images.dtype} {images.shape}"
        )
    n, h, w, ch = images.shape
    if len(captions) != n:
        raise ValueError(f"labelled_image_grid: {len(captions)} captions for {n} images")
    if cols < 1:
        raise ValueError(f"labelled_image_grid: cols must be >= 1; got {cols}")
    cols = min(cols, n)
    rows = -(-n // cols)
    image_in, column_in = 1.3, 1.8
    lines = max(caption.count("\n") + 1 for caption in captions)
    band_in, gap_in = CAPTION_LINE_IN * lines + 0.06, 0.08
    px_per_in = w / image_in
    hgap = int(np.ceil((column_in - image_in) * px_per_in))
    band = int(np.ceil(band_in * px_per_in))
    vgap = int(np.ceil(gap_in * px_per_in))
    row_h, col_w = band + h + vgap, w + hgap
    left = hgap // 2  # each image centred in its column: its caption has room on both sides
    canvas = np.full((rows * row_h - vgap, cols * col_w, ch), 255, np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        canvas[r * row_h + band : r * row_h + band + h, left + c * col_w : left + c * col_w + w] = images[i]
    height_in = canvas.shape[0] / px_per_in + (0.35 if title else 0.1)
    width_in = max(canvas.shape[1] / px_per_in + 0.2, 4.0 if title else 0.0)
    fig, ax = subplots(figsize=(width_in, height_in))
    if ch == 1:
        ax.imshow(canvas[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    else:
        ax.imshow(canvas, interpolation="nearest")
    for i, caption in enumerate(captions):
        r, c = divmod(i, cols)
        ax.text(
            left + c * col_w + w / 2,
            r * row_h + band / 2,
            caption,
            ha="center",
            va="center",
            fontsize=CAPTION_FONTSIZE,
            parse_math=False,
        )
    ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
