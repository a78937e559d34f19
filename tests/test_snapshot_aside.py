"""A data snapshot's path taken by a file is set aside like other damaged state (issue 43,
class 6): preparing into it failed with "check that it is writable" on every run until
it was removed by hand."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from ensemble_core import data


@pytest.mark.slow  # the embedded dataset prepared twice: about 6 s
def test_a_file_where_the_snapshot_should_be_is_set_aside_and_the_snapshot_prepared(tmp_path, caplog):
    first = data.prepare(data.EMBEDDED, str(tmp_path))
    snapshot_dir = Path(first.tfds_data_dir)
    assert snapshot_dir.is_dir()
    shutil.rmtree(snapshot_dir)
    snapshot_dir.write_text("not a snapshot\n")  # something else took its place
    with caplog.at_level(logging.WARNING, logger="ensemble_core"):
        again = data.prepare(data.EMBEDDED, str(tmp_path))
    assert Path(again.tfds_data_dir) == snapshot_dir and snapshot_dir.is_dir()
    assert again.snapshot is not None and again.snapshot.fingerprint == first.snapshot.fingerprint
    aside = [p for p in snapshot_dir.parent.iterdir() if p.name.startswith(f".aside-{snapshot_dir.name}-")]
    assert len(aside) == 1 and aside[0].read_text() == "not a snapshot\n"  # kept, not deleted
    assert any("was not a directory" in r.getMessage() and str(aside[0]) in r.getMessage() for r in caplog.records)
    images, labels = data.load_split(again.name, "test", again.tfds_data_dir)
    assert len(images) == len(labels) == again.num_test
