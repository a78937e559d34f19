"""Dataset shifts for MNIST-like images: Ovadia et al. rotations and translations
(:mod:`.ovadia`), the MNIST-C corruptions (:mod:`.mnistc`, built from :mod:`.transforms`),
a notMNIST-like set of rendered letters A-J (:mod:`.rendered_letters`: not named
``letters``, so that the function ``letters`` the package re-exports does not hide it), and
images with their patches shuffled (:mod:`.patches`, any image size: an OOD set with the
data's own pixels).

numpy, scipy, scikit-image and matplotlib (no OpenCV, Wand/ImageMagick or PIL), host
only, deterministic. :func:`rotate` and :func:`translate` take and return any uint8
``[N, H, W, C]`` with C in {1, 3} (grey or RGB, e.g. CIFAR-10's ``[N, 32, 32, 3]``), each
channel transformed on its own; :func:`corrupt` and :func:`letters` are MNIST's: uint8
``[N, 28, 28, 1]`` (white strokes on black). Internally images are floats in [0, 1]
(``x / 255``, the reference code's scaling) and are returned as
``round(clip(y, 0, 1) * 255)``.

Sources:

* Ovadia et al. 2019, "Can You Trust Your Model's Uncertainty? Evaluating Predictive
  Uncertainty Under Dataset Shift" (NeurIPS 2019). Reference code:
  ``google-research/google-research``, ``uq_benchmark_2019/mnist/data_lib.py``
  (``build_dataset``: ``scipy.ndimage.rotate(images, degs, axes=[-2, -3])`` then
  ``_crop_center(images, 28)``; ``np.roll(images, k, axis=-2)``).
* Mu & Gilmer 2019, "MNIST-C: A Robustness Benchmark for Computer Vision" (ICML 2019
  UDL workshop, arXiv:1906.02337). Reference code: ``google-research/mnist-c``,
  ``corruptions.py`` (commit bba57e4). Each corruption here is that file's function at
  the ``severity`` its signature defaults to (the severity the published dataset uses; the
  values are quoted in each docstring). Where the reference calls a library we do not
  have, the docstring says what replaces it. The reference draws from numpy's global
  legacy RNG image by image; here each corruption draws the same distributions from one
  ``np.random.Generator`` for the whole batch, so outputs follow the same law but are not
  bit-identical to the published files.

The Canny edge detector and the affine warps are scikit-image's (``feature.canny``,
``transform.warp``), as in the reference. They replaced this project's own scipy versions
after a comparison on the 1,000 ``mnist5k`` test digits (2026-11-25, scikit-image 0.26.0):
0 of 784,000 edge pixels differed, and the warps of 1,000 random rotate/scale/translate
matrices differed by at most 3.3e-16 (0 grey levels after rounding to uint8). Newer
scikit-image (>= 0.19) defines ``AffineTransform(shear=c)`` as ``[[1, -tan c], [0, 1]]``;
MNIST-C (2019) ran the older ``[[1, -sin c], [0, cos c]]``, so the shear matrices are
built here (:func:`.transforms.affine_params`) and passed as ``matrix=``.
"""

from ensemble_core.shifts.layout import CHANNELS, H, W
from ensemble_core.shifts.mnistc import CORRUPTIONS, corrupt
from ensemble_core.shifts.ovadia import ROTATION_DEGREES, TRANSLATION_PIXELS, rotate, translate
from ensemble_core.shifts.patches import PATCH_GRID, shuffle_patches
from ensemble_core.shifts.rendered_letters import LETTERS, letter_fonts, letters

__all__ = [
    "CHANNELS",
    "CORRUPTIONS",
    "LETTERS",
    "PATCH_GRID",
    "ROTATION_DEGREES",
    "TRANSLATION_PIXELS",
    "H",
    "W",
    "corrupt",
    "letter_fonts",
    "letters",
    "rotate",
    "shuffle_patches",
    "translate",
]
