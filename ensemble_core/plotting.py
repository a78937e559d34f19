"""matplotlib with the non-interactive Agg backend, and the one way plots are saved."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ensemble_core.atomic import atomic_write_bytes

__all__ = ["plt", "save"]


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
        plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
    return path
