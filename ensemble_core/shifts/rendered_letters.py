"""A notMNIST-like out-of-distribution set: the letters A-J rendered from the DejaVu fonts
matplotlib ships, size-normalised and centred by mass as MNIST's digits are, with a
small random affine jitter."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from ensemble_core.shifts.layout import CENTRE, H, W

LETTERS = "ABCDEFGHIJ"
_SUPERSAMPLE = 4
_BOX = 20  # MNIST: digits size-normalised into a 20x20 box, centred by mass in 28x28
# Jitter (ours, not from a paper): small enough that the letters stay legible.
_JITTER_DEG = 12.0
_JITTER_SCALE = (0.85, 1.1)
_JITTER_SHEAR = 0.2
_JITTER_SHIFT = 1.5


def letter_fonts() -> tuple[Path, ...]:
    """The DejaVu TTFs that ship with matplotlib (``<get_data_path()>/fonts/ttf``), sorted
    by name, without the ``*Display`` subsets (they carry only a few glyphs). Typically 12:
    Sans, Sans Mono, Serif, each regular, bold, oblique/italic, bold oblique/italic."""
    import matplotlib

    d = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    fonts = tuple(sorted(p for p in d.glob("DejaVu*.ttf") if "Display" not in p.name))
    if not fonts:
        raise FileNotFoundError(f"no DejaVu TTF under {d}")
    return fonts


@functools.lru_cache(maxsize=1)
def _letter_templates() -> np.ndarray:
    """float64 ``[F, 10, 28, 28]`` coverage in [0, 1]: each letter of each font, its
    bounding box scaled (aspect kept) so the longer side is 20 px and centred; rendered
    anti-aliased by matplotlib's Agg at 4x and block-averaged to 28x28."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    ss = _SUPERSAMPLE
    size = H * ss
    out = []
    for font in letter_fonts():
        prop = FontProperties(fname=str(font))
        per_font = []
        for ch in LETTERS:
            path = TextPath((0, 0), ch, size=1.0, prop=prop)
            ext = path.get_extents()
            s = _BOX * ss / max(ext.width, ext.height)
            tr = (
                Affine2D()
                .translate(-(ext.x0 + ext.x1) / 2, -(ext.y0 + ext.y1) / 2)
                .scale(s)
                .translate(size / 2, size / 2)
            )
            renderer = RendererAgg(size, size, 72)
            gc = renderer.new_gc()
            gc.set_linewidth(0)
            gc.set_antialiased(True)
            renderer.draw_path(gc, path, tr, (1.0, 1.0, 1.0, 1.0))
            gc.restore()
            alpha = np.asarray(renderer.buffer_rgba())[..., 3].astype(np.float64) / 255.0
            per_font.append(alpha.reshape(H, ss, W, ss).mean(axis=(1, 3)))
        out.append(per_font)
    return np.asarray(out)


def letters(num_per_letter: int, seed: int = 0) -> np.ndarray:
    """A notMNIST-like out-of-distribution set: letters A-J rendered at 28x28.

    (notMNIST, Bulatov 2011, is letters A-J in many fonts; Ovadia et al. use it as MNIST's
    OOD set. It is not shipped here, so this is a stand-in built from fonts we have.)
    Each image: a DejaVu font drawn uniformly from :func:`letter_fonts`, the letter's
    glyph rendered white on black with matplotlib's Agg and fitted into a 20x20 box as
    MNIST digits are (LeCun et al.: size-normalised to 20x20 keeping the aspect ratio, then
    centred by centre of mass in the 28x28 field), then a seeded random affine jitter
    about the centre of mass applied with ``scipy.ndimage`` (bilinear): rotation
    ``U(-12, 12)`` degrees, isotropic scale ``U(0.85, 1.1)``, horizontal shear
    ``U(-0.2, 0.2)``, shift ``U(-1.5, 1.5)`` px per axis. Deterministic for a seed (and a
    given matplotlib's fonts and Agg).

    Args:
      num_per_letter: images per letter.
      seed: seed of ``np.random.default_rng``.

    Returns:
      uint8 ``[10 * num_per_letter, 28, 28, 1]``, letter-major: rows
      ``k * num_per_letter : (k + 1) * num_per_letter`` are ``LETTERS[k]`` (label ``k``).
    """
    num_per_letter = int(num_per_letter)
    if num_per_letter < 0:
        raise ValueError("num_per_letter must be >= 0")
    templates = _letter_templates()  # [F, 10, 28, 28]
    nf = templates.shape[0]
    flat = templates.reshape(nf * len(LETTERS), H, W)
    rr, cc = np.mgrid[0:H, 0:W].astype(np.float64)
    mass = flat.sum(axis=(1, 2))
    com = np.stack([(flat * rr).sum(axis=(1, 2)) / mass, (flat * cc).sum(axis=(1, 2)) / mass], axis=1)

    m = len(LETTERS) * num_per_letter
    rng = np.random.default_rng(seed)
    letter = np.repeat(np.arange(len(LETTERS)), num_per_letter)
    font = rng.integers(0, nf, size=m)
    theta = np.deg2rad(rng.uniform(-_JITTER_DEG, _JITTER_DEG, size=m))
    scale = rng.uniform(*_JITTER_SCALE, size=m)
    shear = rng.uniform(-_JITTER_SHEAR, _JITTER_SHEAR, size=m)
    shift = rng.uniform(-_JITTER_SHIFT, _JITTER_SHIFT, size=(m, 2))

    # Forward map in (row, col): o = A (i - com) + centre + shift, A = R(theta) Shear scale.
    cos, sin = np.cos(theta), np.sin(theta)
    rot = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    sh = np.tile(np.eye(2), (m, 1, 1))
    sh[:, 1, 0] = shear  # col += shear * row
    a = rot @ sh * scale[:, None, None]
    a_inv = np.linalg.inv(a)
    tid = font * len(LETTERS) + letter
    out = np.empty((m, H, W), np.uint8)
    chunk = 2048
    for s in range(0, m, chunk):
        e = min(m, s + chunk)
        o = np.stack([rr, cc])[None] - (CENTRE + shift[s:e])[:, :, None, None]  # [k, 2, 28, 28]
        src = np.einsum("kij,kjhw->kihw", a_inv[s:e], o) + com[tid[s:e]][:, :, None, None]
        idx = np.broadcast_to(tid[s:e, None, None].astype(np.float64), (e - s, H, W))
        vals = ndi.map_coordinates(flat, np.stack([idx, src[:, 0], src[:, 1]]), order=1, mode="constant", cval=0.0)
        out[s:e] = np.round(np.clip(vals, 0, 1) * 255)
    return out[..., None]
