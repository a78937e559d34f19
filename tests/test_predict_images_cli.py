"""``python -m flows.predict`` on a folder of PNGs: one name per image printed, the table
written beside the .npz, its names equal to those predicted from the same images as an
array; the table and summary published as Prefect artifacts; a bad file refused in one
line before Prefect starts."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tests.ensembles import tiny_config

pytestmark = pytest.mark.slow  # a Prefect test server, a tiny run trained, two predictions: about 30 s


@pytest.fixture(scope="module")
def prefect_server():
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        # One flow run here, outside the tests' capsys: Prefect's console log handler then
        # holds the session's stream, not a test's (closed when that test ends).
        flow(lambda: None, name="warm-up")()
        yield


@pytest.fixture(scope="module")
def tiny_run(tfds_dir, tmp_path_factory):
    """A trained tiny run (mnist5k, 28x28 grey) and 12 of its test digits, uint8 [12, 28, 28, 1]."""
    from ensemble_core import runs
    from ensemble_core.data import load_split

    cfg = tiny_config(tfds_dir, "retention.enabled=false")
    result = runs.run(cfg, tmp_path_factory.mktemp("out"), "r")
    info = runs.prepare(cfg.data)
    images, _ = load_split(info.name, "test", info.tfds_data_dir)
    return result.run_dir.path, images[:12]


def _png_folder(root, images) -> None:
    """The digits as grey PNGs: 0..5 at the top, 6..11 in the subfolder ``more`` (walked
    after ``d05.png``: entries sort by name)."""
    for i, image in enumerate(images):
        path = root / (f"d{i:02d}.png" if i < 6 else f"more/d{i:02d}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0]).save(path)


def test_predict_cli_on_a_folder_of_pngs_prints_and_tables_the_same_names_as_arrays(
    prefect_server, tiny_run, tmp_path, capsys
):
    from ensemble_core.runs.prediction.predict import predict_images
    from flows.predict import main

    run_dir, images = tiny_run
    folder = tmp_path / "pngs"
    _png_folder(folder, images)
    order = [folder / f"d{i:02d}.png" for i in range(6)] + [folder / "more" / f"d{i:02d}.png" for i in range(6, 12)]
    out = tmp_path / "p.npz"
    rc = main(["--images", str(folder), "--run-dir", str(run_dir), "--output", str(out)])
    stdout = capsys.readouterr().out
    lines = stdout.strip().splitlines()
    assert rc == 0 and lines[-1] == str(out), stdout
    rows = pd.read_csv(tmp_path / "p.csv")
    assert rows["input"].tolist() == [str(p) for p in order]
    want = predict_images(run_dir, images)
    assert rows["predicted_name"].astype(str).tolist() == want["predicted_name"].tolist()
    np.testing.assert_allclose(rows["probability"], want["ensemble_probs"].max(-1), atol=1e-6)
    assert rows["error"].isna().all()
    for path, name in zip(order, want["predicted_name"], strict=True):  # one printed row per image, its name
        (row,) = [line for line in lines if line.lstrip().startswith(str(path) + " ")]
        assert row.split()[1] == name
    assert f"table: {tmp_path / 'p.csv'}" in lines
    assert any(line.startswith("12 images: 12 predicted, 0 skipped") for line in lines)
    with np.load(out) as f:
        assert f["input"].tolist() == [str(p) for p in order]
        assert f["predicted_name"].tolist() == want["predicted_name"].tolist()

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["predictions", "predictions-summary"]))
            )

    kinds = {a.key: a for a in asyncio.run(read())}
    assert set(kinds) == {"predictions", "predictions-summary"}
    import json

    table = json.loads(kinds["predictions"].data)
    assert [row["predicted_name"] for row in table] == want["predicted_name"].tolist()
    assert "12 images: 12 predicted" in kinds["predictions-summary"].data

    # A glob and a file at once, and the Parquet table.
    rc = main(
        [
            "--images",
            str(folder / "more" / "*.png"),
            str(order[0]),
            "--run-dir",
            str(run_dir),
            "--output",
            str(tmp_path / "g.npz"),
            "--table",
            str(tmp_path / "g.parquet"),
        ]
    )
    assert rc == 0
    rows = pd.read_parquet(tmp_path / "g.parquet")
    assert rows["input"].tolist() == [*map(str, order[6:]), str(order[0])]
    picked = [*range(6, 12), 0]
    assert rows["predicted_name"].tolist() == want["predicted_name"][picked].tolist()


def test_a_bad_file_in_the_folder_is_refused_in_one_line_before_prefect(tiny_run, tmp_path, capsys):
    """The run's data.on_bad_image is fail: a cut-off PNG among good ones is one line, exit 2,
    naming the file, and nothing is written."""
    from flows.predict import main

    run_dir, images = tiny_run
    folder = tmp_path / "pngs"
    _png_folder(folder, images[:3])
    (folder / "d01.png").write_bytes((folder / "d01.png").read_bytes()[:40])
    out = tmp_path / "p.npz"
    rc = main(["--images", str(folder), "--run-dir", str(run_dir), "--output", str(out)])
    _, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(errors) == 1, err
    assert repr(str(folder / "d01.png")) in errors[0] and "(1 image file bad)" in errors[0] and "fix:" in errors[0]
    assert "Traceback" not in err and not out.exists() and not (tmp_path / "p.csv").exists()
