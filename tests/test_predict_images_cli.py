"""``python -m flows.predict`` on a folder of PNGs: one name per image printed, the table
written beside the .npz, its names equal to those predicted from the same images as an
array; the table and summary published as Prefect artifacts; a bad file refused in one
line before Prefect starts. ``python -m flows.monitor`` on the same run (its Prefect server
and trained run shared here): a clean drop quiet, a noisy one flagged, both in the history."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tests.ensembles import tiny_config

pytestmark = pytest.mark.slow  # the Prefect flows, a tiny run trained, two predictions: about 30 s


@pytest.fixture(scope="module")
def prefect_server(prefect_api):
    from prefect import flow

    from tests.prefect_api import this_process_on

    with this_process_on(prefect_api):
        # One flow run here, outside the tests' capsys: Prefect's console log handler then
        # holds the session's stream, not a test's (closed when that test ends).
        flow(lambda: None, name="warm-up")()
        yield


@pytest.fixture(scope="module")
def tiny_run(tfds_dir, tmp_path_factory):
    """A trained tiny run (mnist5k, 28x28 grey, 3 epochs of 800 digits; 200 held out as the calibration split, the
    monitor's reference) and 12 of its test digits, uint8 [12, 28, 28, 1]."""
    from ensemble_core import runs
    from ensemble_core.data import load_split

    cfg = tiny_config(
        tfds_dir,
        "retention.enabled=false",
        "data.max_train_examples=1000",
        "data.calibration_fraction=0.2",
        "model.hidden_sizes=[64]",
        "train.epochs=3",
    )
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
    from tests.prefect_api import own_flow_run_filter, own_runs

    run_dir, images = tiny_run
    folder = tmp_path / "pngs"
    _png_folder(folder, images)
    order = [folder / f"d{i:02d}.png" for i in range(6)] + [folder / "more" / f"d{i:02d}.png" for i in range(6, 12)]
    out = tmp_path / "p.npz"
    with own_runs() as tag:
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
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["predictions", "predictions-summary"])),
                flow_run_filter=own_flow_run_filter(tag),  # the session's server: this command's only
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


def test_monitor_cli_clean_drop_quiet_noisy_drop_flagged(prefect_server, tiny_run, tmp_path, capsys):
    """Two nights through ``python -m flows.monitor``: 200 test digits (an .npy), then the
    same digits under heavy Gaussian noise. The clean night does not reject at alpha 0.05,
    the noisy one does; each prints its summary and its record's path last; the headline
    estimate is the members' agreement computed here from the night's saved member
    probabilities; the history holds both nights and its plot is written."""
    from ensemble_core import data
    from flows.monitor import main

    run_dir, _ = tiny_run
    images, labels = data.read_mnist5k_csv()
    digits = images[data.mnist5k_split_indices(labels)[1][:200]]
    noisy = np.clip(digits + np.random.default_rng(0).normal(0, 110, digits.shape), 0, 255).astype(np.uint8)
    out = tmp_path / "out"
    records = {}
    for name, images in (("clean", digits), ("noisy", noisy)):
        np.save(tmp_path / f"{name}.npy", images)
        args = ["--images", str(tmp_path / f"{name}.npy"), "--run-dir", str(run_dir), "--output-dir", str(out)]
        rc = main([*args, "--night", name])
        lines = capsys.readouterr().out.strip().splitlines()
        record_path = out / "monitoring" / f"{name}.json"
        assert rc == 0 and lines[-1] == str(record_path), lines[-8:]
        records[name] = json.loads(record_path.read_text())
        verdict = "DRIFT" if name == "noisy" else "no drift"
        assert any(line.startswith(f"drift tests (Holm, alpha 0.05): {verdict};") for line in lines), lines[-8:]
        with np.load(records[name]["predictions"]) as f:
            votes = f["member_probs"].argmax(-1)
        assert records[name]["accuracy"]["estimator"] == "disagreement"
        assert records[name]["accuracy"]["estimate"] == pytest.approx(np.mean(votes[0] == votes[1]))
    assert records["clean"]["drifted"] is False and records["noisy"]["drifted"] is True
    history = [json.loads(line) for line in (out / "monitoring" / "history.jsonl").read_text().splitlines()]
    assert [(r["night"], r["drifted"]) for r in history] == [("clean", False), ("noisy", True)]
    assert (out / "monitoring" / "history.png").stat().st_size > 0


def test_monitor_cli_refuses_bad_input_in_one_line_before_prefect(tiny_run, tmp_path, capsys):
    from flows.monitor import main

    run_dir, images = tiny_run
    np.save(tmp_path / "d.npy", images)
    rc = main(["--images", str(tmp_path / "d.npy"), "--run-dir", str(run_dir), "--alpha", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().startswith("error: alpha 2.0 is not in (0, 1)") and "fix:" in err, err
    rc = main(["--images", str(tmp_path / "d.npy"), "--run-dir", str(run_dir), "--night", "../x"])
    assert rc == 2 and "letters, digits" in capsys.readouterr().err
