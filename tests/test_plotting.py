"""ensemble_core.plotting.save: the tight layout matplotlib's own ``fig.tight_layout()``
gives, in one draw of the figure."""

import io

import numpy as np
import pytest
from PIL import Image

from ensemble_core import plotting


def _figure():
    fig, axes = plotting.subplots(1, 2, figsize=(6, 2.5))
    axes[0].plot(np.linspace(0, 1, 20), np.linspace(0, 1, 20) ** 2, label="ensemble")
    axes[0].set(title="accuracy under rotation", xlabel="degrees", ylabel="a long y label")
    axes[0].legend()
    axes[1].bar(range(10), np.arange(10.0))
    axes[1].set_title("class counts")
    return fig


def test_save_lays_out_as_tight_layout_in_one_draw(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    # the reference: matplotlib's own tight_layout, then savefig as save() writes
    ref = _figure()
    ref.tight_layout()
    buf = io.BytesIO()
    ref.savefig(buf, dpi=100, format="png", pil_kwargs={"compress_level": 1})
    import matplotlib.pyplot as plt

    plt.close(ref)
    draws = []
    real = Figure.draw

    def draw(self, renderer):
        draws.append(self)
        return real(self, renderer)

    monkeypatch.setattr(Figure, "draw", draw)
    path = plotting.save(_figure(), tmp_path / "plots" / "panel.png")
    # fig.tight_layout() leaves a placeholder layout engine, and savefig then draws the
    # figure a second time (unrendered) before the real draw: save() draws it once
    assert len(draws) == 1
    want = np.asarray(Image.open(io.BytesIO(buf.getvalue())))
    got = np.asarray(Image.open(path))
    assert got.shape == want.shape == (250, 600, 4)
    np.testing.assert_array_equal(got, want)


def test_save_closes_the_figure_when_it_cannot_write(tmp_path):
    import matplotlib.pyplot as plt

    fig = _figure()
    (tmp_path / "plots").write_text("a file where the directory should be")
    with pytest.raises(OSError):
        plotting.save(fig, tmp_path / "plots" / "panel.png")
    assert not plt.fignum_exists(fig.number)
