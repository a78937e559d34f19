"""matplotlib with the non-interactive Agg backend, and the one way plots are saved."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plt", "save"]


def save(fig, path: Path) -> Path:
    """Lay out ``fig``, write it as a 100-dpi PNG at ``path`` (creating the directory), close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
