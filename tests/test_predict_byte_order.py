"""Valid images in another byte order are predicted, not refused as a damaged checkpoint
(issue 43, class 6): big-endian float32 images were reported as "the latest checkpoint
cannot be read", with advice to retrain, because every error while predicting was mapped
to a damaged checkpoint. Now only reading the run is."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ensembles import tiny_config


@pytest.mark.slow  # a tiny run trained (1 epoch), then two predictions: about 10 s
def test_big_endian_images_predict_as_the_same_native_images(tfds_dir, tmp_path):
    from ensemble_core import runs
    from ensemble_core.data import load_split
    from ensemble_core.runs.prediction.files import predict_file

    cfg = tiny_config(tfds_dir, "retention.enabled=false")
    result = runs.run(cfg, tmp_path / "out", "r")
    info = runs.prepare(cfg.data)
    images, _ = load_split(info.name, "test", info.tfds_data_dir)
    native = (images[:32].astype(np.float32) / 255.0).astype("<f4")
    big = native.astype(">f4")
    assert big.dtype.byteorder == ">" and np.array_equal(big, native)  # the same values, other bytes
    np.save(tmp_path / "native.npy", native)
    np.save(tmp_path / "big.npy", big)
    want = predict_file(result.run_dir.path, tmp_path / "native.npy", tmp_path / "native.npz")
    got = predict_file(result.run_dir.path, tmp_path / "big.npy", tmp_path / "big.npz")
    for key in ("ensemble_probs", "member_probs", "predicted_class"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
