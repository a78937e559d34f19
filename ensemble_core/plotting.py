"""matplotlib with the non-interactive Agg backend, the one way plots are saved, and the
one way grids of example images are drawn.

matplotlib is imported on the first :func:`subplots`, not with this module: a command
that draws nothing (a refused or stopped run, a worker, ``--help``) does not pay its
import (about 0.5 CPU s per process)."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np

from ensemble_core.atomic import atomic_write_bytes

__all__ = ["image_grid", "save", "subplots"]


@functools.cache
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def subplots(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` on the Agg backend (imported on first use): returns
    ``(figure, axes)``; pass the figure to :func:`save`, which closes it."""
    return _pyplot().subplots(*args, **kwargs)


def save(fig, path: Path) -> Path:
    """Lay out ``fig``, write it as a 100-dpi PNG at ``path`` (creating the directory;
    atomically, so a full disk leaves the previous plot or none, never half a PNG), close it.

    Raises:
      OSError: the file cannot be written (the figure is closed all the same).
    """
    path = Path(path)
    try:
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, dpi=100, format="png")
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
