"""Prediction's inputs (ensemble_core.runs.prediction.inputs) and its per-image table
(ensemble_core.runs.prediction.table), without a trained run: image files decode exactly
as training's image folder decodes them (PNG, JPEG, grey, RGB, 16-bit grey, palette);
folders, globs and several inputs expand in order; bad files are refused in one line
(``on_bad_image: fail``) or listed (``skip``); the table reads back with pandas."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from ensemble_core.data import image_folder
from ensemble_core.errors import DataError
from ensemble_core.runs.prediction import inputs, table

RNG = np.random.default_rng(0)


def _save(path, mode: str, size=(12, 10), fmt=None) -> None:
    """A random image of Pillow ``mode`` and ``size`` (W, H) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w, h = size
    if mode == "RGB":
        image = Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8))
    elif mode == "L":
        image = Image.fromarray(RNG.integers(0, 256, (h, w), dtype=np.uint8))
    elif mode == "I;16":
        image = Image.fromarray(RNG.integers(0, 65536, (h, w), dtype=np.uint16))
    elif mode == "P":
        image = Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)).quantize(16)
    elif mode == "RGBA":
        image = Image.fromarray(RNG.integers(0, 256, (h, w, 4), dtype=np.uint8))
    else:
        raise ValueError(mode)
    assert image.mode == mode, (image.mode, mode)
    image.save(path, format=fmt)


def _mixed_folder(root):
    """``root/train/<class>/<file>`` with every kind of image: PNG and JPEG, grey and RGB,
    16-bit grey, palette, RGBA, in two sizes."""
    _save(root / "train" / "cat" / "rgb.png", "RGB")
    _save(root / "train" / "cat" / "rgb.jpg", "RGB", fmt="JPEG")
    _save(root / "train" / "cat" / "grey.jpg", "L", (9, 7), fmt="JPEG")
    _save(root / "train" / "cat" / "sub" / "palette.png", "P")
    _save(root / "train" / "dog" / "grey.png", "L", (9, 7))
    _save(root / "train" / "dog" / "deep.png", "I;16")
    _save(root / "train" / "dog" / "alpha.png", "RGBA")
    return root


def _training_decode(root, size, channels) -> dict[str, np.ndarray]:
    """Training's decoding of an image folder (data/user_source.py's path: scan, the first
    file's geometry, decode_images), by file."""
    scan = image_folder.scan_image_folder(root)
    paths = [p for p, _ in scan.files["train"]]
    shape = image_folder.image_geometry(paths[0], size, channels)
    images, kept = image_folder.decode_images(paths, size, channels, shape)
    assert kept == list(range(len(paths)))
    return {str(paths[i]): images[j] for j, i in enumerate(kept)}, shape


@pytest.mark.parametrize("size, channels", [((8, 6), 1), ((8, 6), 3), ((16, 20), 3), ((10, 12), 1)])
def test_prediction_decodes_every_image_kind_as_training_does(tmp_path, size, channels):
    """PNG, JPEG, grey, RGB, 16-bit grey (I;16), palette (P) and RGBA files, resized and
    converted by the run's data settings: byte for byte what training decoded."""
    root = _mixed_folder(tmp_path / "data")
    want, shape = _training_decode(root, size, channels)
    meta = {
        "config": {"data": {"image_size": list(size), "channels": channels, "on_bad_image": "fail"}},
        "dataset": {"image_shape": list(shape)},
    }
    settings = inputs.decode_settings(meta)
    assert settings == inputs.DecodeSettings(size, channels, "fail", shape)
    found = inputs.expand_inputs([str(root / "train")])
    assert sorted(map(str, found.files)) == sorted(want)
    decoded = inputs.decode_inputs(found.files, settings)
    assert decoded.ok.all() and decoded.errors == {}
    assert decoded.images.dtype == np.uint8 and decoded.images.shape == (len(want), *shape)
    for source, got in zip(decoded.sources, decoded.images, strict=True):
        np.testing.assert_array_equal(got, want[source], err_msg=source)


def test_images_as_they_are_decode_as_training_does_without_conversion(tmp_path):
    """A run without data.image_size/channels (a TFDS run, 28x28 grey): grey files of its
    size decode unchanged, as training's folder would; others are bad files, by reason."""
    root = tmp_path / "data"
    for name in ("a", "b"):
        _save(root / "train" / name / "x.png", "L", (28, 28))
        _save(root / "train" / name / "y.jpg", "L", (28, 28), fmt="JPEG")
    want, shape = _training_decode(root, None, None)
    settings = inputs.decode_settings({"config": {"data": {}}, "dataset": {"image_shape": [28, 28, 1]}})
    assert settings == inputs.DecodeSettings(None, None, "fail", (28, 28, 1)) and shape == (28, 28, 1)
    decoded = inputs.decode_inputs(inputs.expand_inputs(str(root)).files, settings)
    for source, got in zip(decoded.sources, decoded.images, strict=True):
        np.testing.assert_array_equal(got, want[source])
    _save(tmp_path / "odd" / "rgb.png", "RGB", (28, 28))
    _save(tmp_path / "odd" / "small.png", "L", (20, 28))
    _save(tmp_path / "odd" / "palette.png", "P", (28, 28))
    skip = inputs.DecodeSettings(None, None, "skip", (28, 28, 1))
    files = [*inputs.expand_inputs(str(tmp_path / "odd")).files, root / "train" / "a" / "x.png"]
    decoded = inputs.decode_inputs(files, skip)
    reasons = {os.path.basename(decoded.sources[i]): r for i, r in decoded.errors.items()}
    assert "Pillow 'P' image" in reasons["palette.png"]
    assert "3 channel(s) (RGB), the run takes 1" in reasons["rgb.png"]
    assert "28x20 pixels, the run takes 28x28" in reasons["small.png"]
    assert decoded.ok.tolist() == [False, False, False, True] and len(decoded.images) == 1


def test_folders_recursive_globs_and_several_inputs_keep_their_order(tmp_path):
    """A folder walks depth first, sorted by name at each level, hidden names ignored; a
    glob expands sorted (recursive with **); several inputs keep the order given."""
    for rel in ("b/2.png", "b/10.png", "a.png", "a/z/1.png", ".hidden.png", "c/.x/9.png"):
        _save(tmp_path / "f" / rel, "L", (4, 4))
    _save(tmp_path / "one.png", "L", (4, 4))
    rel = [str(p.relative_to(tmp_path / "f")) for p in inputs.expand_inputs(str(tmp_path / "f")).files]
    assert rel == ["a/z/1.png", "a.png", "b/10.png", "b/2.png"]
    found = inputs.expand_inputs(
        [str(tmp_path / "one.png"), str(tmp_path / "f" / "**" / "*.png"), str(tmp_path / "f/b")]
    )
    names = [str(p.relative_to(tmp_path)) for p in found.files]
    assert names == ["one.png", "f/a.png", "f/a/z/1.png", "f/b/10.png", "f/b/2.png", "f/b/10.png", "f/b/2.png"]
    assert found.array is None
    assert inputs.output_stem([str(tmp_path / "f")]) == "f"
    assert inputs.output_stem([str(tmp_path / "one.png")]) == "one"
    assert inputs.output_stem([str(tmp_path / "f" / "*.png")]) == "images"
    assert inputs.output_stem([], "mnist5k", "test") == "mnist5k-test"


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and "; fix: " in message, message
    return message


def test_refusals_of_inputs_are_one_line_each(tmp_path):
    """A missing path, a FIFO, an empty folder, a glob matching nothing, a file neither an
    image nor an array, several arrays, arrays with images: one line naming it, escaped."""
    _save(tmp_path / "ok.png", "L", (4, 4))
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not an image\n")
    np.save(tmp_path / "a.npy", np.zeros((1, 4, 4, 1), np.uint8))
    np.save(tmp_path / "b.npy", np.zeros((1, 4, 4, 1), np.uint8))
    os.mkfifo(tmp_path / "pipe.png")
    cases = [
        ([str(tmp_path / "missing\nname.png")], "does not exist", r"missing\nname.png"),
        ([str(tmp_path / "pipe.png")], "a FIFO", "pipe.png"),
        ([str(tmp_path / "empty")], "no image file under", "empty"),
        ([str(tmp_path / "*.gif")], "no file matches the pattern", "*.gif"),
        ([str(tmp_path / "notes.txt")], "neither an image Pillow reads nor a .npy/.npz", "notes.txt"),
        ([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], "several array files", "a.npy"),
        ([str(tmp_path / "ok.png"), str(tmp_path / "a.npy")], "array files and image files", "a.npy"),
        ([], "no input", ""),
    ]
    for raw, fragment, name in cases:
        with pytest.raises(DataError) as err:
            inputs.expand_inputs(raw)
        message = _one_line(err)
        assert fragment in message and name in message, message
    sub = tmp_path / "withpipe"
    sub.mkdir()
    os.mkfifo(sub / "p")
    with pytest.raises(DataError, match="a FIFO"):
        inputs.expand_inputs(str(sub))
    assert inputs.expand_inputs(str(tmp_path / "a.npy")) == inputs.Inputs(array=tmp_path / "a.npy")


def test_npz_is_read_without_pickles_by_its_images_key_or_only_array(tmp_path):
    x = RNG.integers(0, 256, (3, 4, 4, 1), dtype=np.uint8)
    np.savez(tmp_path / "named.npz", labels=np.arange(3), images=x)
    np.savez(tmp_path / "train.npz", image=x, label=np.arange(3))
    np.savez(tmp_path / "only.npz", whatever=x)
    np.savez(tmp_path / "two.npz", a=x, b=x)
    np.savez(tmp_path / "obj.npz", images=np.array([{"a": 1}], dtype=object))
    for name in ("named", "train", "only"):
        np.testing.assert_array_equal(inputs.read_npz(tmp_path / f"{name}.npz"), x)
    for name, fragment in (("two", "none named images or image"), ("obj", "Python objects")):
        with pytest.raises(DataError) as err:
            inputs.read_npz(tmp_path / f"{name}.npz")
        assert fragment in _one_line(err)
    (tmp_path / "text.npz").write_text("no zip")
    with pytest.raises(DataError) as err:
        inputs.read_npz(tmp_path / "text.npz")
    assert "text.npz" in _one_line(err)


def _bad_folder(root):
    _save(root / "a.png", "L", (6, 6))
    (root / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)  # a cut-off PNG
    _save(root / "c.png", "L", (6, 6))
    (root / "d.txt").write_text("notes\n")
    return root


def test_bad_files_fail_in_one_line_naming_the_first_and_the_count(tmp_path):
    root = _bad_folder(tmp_path / "in")
    settings = inputs.DecodeSettings((6, 6), 1, "fail", (6, 6, 1))
    with pytest.raises(DataError) as err:
        inputs.decode_inputs(inputs.expand_inputs(str(root)).files, settings)
    message = _one_line(err)
    assert repr(str(root / "b.png")) in message and "cannot be decoded as an image" in message
    assert "(2 of 4 image files bad)" in message and "on_bad_image" in message


def test_bad_files_with_skip_are_listed_as_table_rows_with_their_error(tmp_path, caplog):
    root = _bad_folder(tmp_path / "in")
    settings = inputs.DecodeSettings((6, 6), 1, "skip", (6, 6, 1))
    decoded = inputs.decode_inputs(inputs.expand_inputs(str(root)).files, settings)
    assert decoded.ok.tolist() == [True, False, True, False] and len(decoded.images) == 2
    assert sorted(decoded.errors) == [1, 3]
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    assert len(skipped) == 2 and "b.png" in skipped[0] and "d.txt" in skipped[1]
    result = _result(2, 3, sets=False)
    rows = table.build_table(result, decoded.sources, decoded.ok, decoded.errors)
    table.write_table(rows, tmp_path / "p.csv")
    back = pd.read_csv(tmp_path / "p.csv")
    assert back["input"].tolist() == list(decoded.sources)
    assert back["error"].isna().tolist() == [True, False, True, False]
    assert back["predicted_name"].isna().tolist() == [False, True, False, True]
    assert "cannot be decoded" in back.loc[1, "error"]
    assert table.summarize(table.read_table(tmp_path / "p.csv"))["skipped"] == 2
    assert [line.split(":")[0] for line in table.skipped_lines(rows)] == [
        f"skipped {str(root / 'b.png')!r}",
        f"skipped {str(root / 'd.txt')!r}",
    ]
    with pytest.raises(DataError, match="no image decodes"):
        inputs.decode_inputs([root / "b.png"], settings)


def _result(n: int, c: int, sets: bool, k: int = 4) -> dict:
    probs = RNG.dirichlet(np.ones(c), size=(k, n)).astype(np.float32)
    ens = probs.mean(0)
    out = {
        "ensemble_probs": ens,
        "member_probs": probs,
        "class_names": np.asarray([f"class {i}" for i in range(c)]),
        "predictive_entropy": -(ens * np.log(ens)).sum(-1),
        "mutual_information": np.zeros(n, np.float32),
    }
    if sets:
        out["prediction_set"] = ens >= 0.2
        out["abstain"] = out["prediction_set"].sum(-1) != 1
    return out


@pytest.mark.parametrize("sets", [True, False])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_has_one_row_per_input_with_its_columns(tmp_path, sets, suffix):
    n, c = 7, 5
    result = _result(n, c, sets)
    sources = [f"images.npy[{i}]" for i in range(n)]
    rows = table.build_table(result, sources)
    table.write_table(rows, tmp_path / f"t{suffix}")
    back = pd.read_csv(tmp_path / "t.csv") if suffix == ".csv" else pd.read_parquet(tmp_path / "t.parquet")
    assert list(back.columns) == table.columns(c) and len(back) == n
    assert {"top3_name", "top3_probability"} <= set(back.columns) and "top4_name" not in back.columns
    ens = result["ensemble_probs"]
    names = result["class_names"]
    assert back["predicted_name"].tolist() == names[ens.argmax(-1)].tolist()
    np.testing.assert_allclose(back["probability"].astype(float), ens.max(-1), rtol=1e-6)
    np.testing.assert_allclose(back["top2_probability"].astype(float), np.sort(ens, -1)[:, -2], rtol=1e-6)
    from ensemble_core.metrics import member_disagreement

    np.testing.assert_allclose(back["disagreement"].astype(float), member_disagreement(result["member_probs"]))
    assert back["error"].isna().all()
    summary = table.summarize(table.read_table(tmp_path / f"t{suffix}"))
    assert summary["images"] == n and summary["predicted"] == n and summary["skipped"] == 0
    assert sum(summary["counts"].values()) == n
    if sets:
        want = ["|".join(names[s]) for s in result["prediction_set"]]
        assert back["prediction_set"].fillna("").tolist() == want
        assert back["set_size"].tolist() == result["prediction_set"].sum(-1).tolist()
        assert back["abstain"].astype(bool).tolist() == result["abstain"].tolist()
        assert summary["abstention_rate"] == pytest.approx(result["abstain"].mean())
        assert summary["mean_set_size"] == pytest.approx(result["prediction_set"].sum(-1).mean())
    else:
        assert back[["prediction_set", "set_size", "abstain"]].isna().all().all()
        assert summary["abstention_rate"] is None and summary["mean_set_size"] is None
    lines = table.render(table.read_table(tmp_path / f"t{suffix}"), rows=3)
    assert lines[0].split()[:2] == ["input", "predicted_name"] and "... 4 more rows" in lines
    assert any(line.startswith("predicted classes: ") for line in lines)
    records = table.head_records(rows)
    import json

    assert len(json.loads(json.dumps(records))) == n
