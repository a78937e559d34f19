"""A damaged prepared dataset fails with a one-line DataError naming the file and the fix,
and the fix (delete the directory, run again) really works.

Every test damages a copy of the session's prepared ``mnist5k`` (``tfds_dir``), never the
shared fixture itself.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from array_record.python import array_record_module

from ensemble_core import data
from ensemble_core.errors import DataError

VERSION_DIR = Path(data.EMBEDDED) / "1.0.0"


def _snap(variant: Path) -> str:
    """The snapshot's TFDS data dir holding ``variant`` (what ``load_split`` takes)."""
    return str(variant.parents[1])


def _shard(variant: Path, split: str) -> Path:
    (path,) = variant.glob(f"{data.EMBEDDED}-{split}.array_record-*")
    return path


def _truncate_half(variant: Path) -> Path:
    path = _shard(variant, "train")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def _zero_bytes(variant: Path) -> Path:
    path = _shard(variant, "train")
    path.write_bytes(b"")
    return path


def _delete_shard(variant: Path) -> Path:
    path = _shard(variant, "train")
    path.unlink()
    return path


def _garbage_same_length(variant: Path) -> Path:
    path = _shard(variant, "train")
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))
    return path


def _garble_dataset_info(variant: Path) -> Path:
    path = variant / "dataset_info.json"
    path.write_text(path.read_text()[:100])
    return path


def _non_utf8_dataset_info(variant: Path) -> Path:
    path = variant / "dataset_info.json"
    path.write_bytes(b"\xa8\xff" + np.random.default_rng(1).bytes(300))
    return path


def _delete_dataset_info(variant: Path) -> Path:
    path = variant / "dataset_info.json"
    path.unlink()
    return path


def _garble_features(variant: Path) -> Path:
    path = variant / "features.json"
    path.write_text(path.read_text()[:100])
    return path


def _wrong_shard_length(variant: Path) -> Path:
    path = variant / "dataset_info.json"
    info = json.loads(path.read_text())
    for split in info["splits"]:
        if split["name"] == "train":
            split["shardLengths"] = ["3999"]
    path.write_text(json.dumps(info))
    return _shard(variant, "train")


# Damage the footer check before reading cannot see: only reading the records finds it.


def _corrupt_middle(variant: Path) -> Path:
    path = _shard(variant, "train")
    raw = bytearray(path.read_bytes())
    quarter = len(raw) // 4
    raw[quarter : 2 * quarter] = np.random.default_rng(2).bytes(quarter)
    path.write_bytes(bytes(raw))
    return path


def _undecodable_records(variant: Path) -> Path:
    path = _shard(variant, "test")
    writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for _ in range(1000):  # as many as the metadata lists, but not tf.Examples
        writer.write(b"not a serialized example " * 3)
    writer.close()
    return path


UP_FRONT = [
    _truncate_half,
    _zero_bytes,
    _delete_shard,
    _garbage_same_length,
    _garble_dataset_info,
    _non_utf8_dataset_info,
    _delete_dataset_info,
    _garble_features,
    _wrong_shard_length,
]
AT_READ = [_corrupt_middle, _undecodable_records]


@pytest.fixture
def copied(tfds_dir, tmp_path):
    """A private copy of the prepared data dir: (data_dir, the version dir of its snapshot of the dataset)."""
    data_dir = tmp_path / "tfds"
    shutil.copytree(tfds_dir, data_dir)
    return str(data_dir), Path(data.prepare(data.EMBEDDED, str(data_dir)).tfds_data_dir) / VERSION_DIR


def _assert_actionable(err: DataError, damaged: Path, variant: Path) -> str:
    msg = str(err)
    assert "\n" not in msg, msg
    assert str(damaged) in msg, msg
    assert str(variant) in msg, msg
    assert "fix:" in msg, msg
    return msg


def _apply_fix(msg: str, variant: Path) -> None:
    match = re.search(r"fix: delete (\S+) and run again", msg)
    assert match, msg
    assert Path(match.group(1)) == variant, msg  # the dataset's own directory, nothing more
    shutil.rmtree(match.group(1))


def _assert_loads_like(data_dir: str, mnist_train, mnist_test) -> None:
    snapshot = data.prepare(data.EMBEDDED, data_dir).tfds_data_dir
    for split, (want_x, want_y) in (("train", mnist_train), ("test", mnist_test)):
        got_x, got_y = data.load_split(data.EMBEDDED, split, snapshot)
        np.testing.assert_array_equal(got_x, want_x)
        np.testing.assert_array_equal(got_y, want_y)


@pytest.mark.slow
@pytest.mark.parametrize("damage", UP_FRONT + AT_READ, ids=lambda f: f.__name__.strip("_"))
def test_damage_is_a_data_error_and_its_fix_works(damage, copied, mnist_train, mnist_test):
    data_dir, variant = copied
    damaged = damage(variant)
    split = "test" if damage is _undecodable_records else "train"
    with pytest.raises(DataError) as err:
        data.load_split(data.EMBEDDED, split, _snap(variant))
    msg = _assert_actionable(err.value, damaged, variant)
    if damage in UP_FRONT:  # found by prepare, i.e. in the preflight, before any compute
        with pytest.raises(DataError) as err:
            data.prepare(data.EMBEDDED, data_dir)
        assert str(err.value) == msg
    _apply_fix(msg, variant)
    _assert_loads_like(data_dir, mnist_train, mnist_test)


def test_prepare_checks_every_split_and_load_split_its_own(copied):
    """prepare checks every split; load_split checks the split it reads."""
    data_dir, variant = copied
    damaged = _zero_bytes(variant)  # the train shard
    data.load_split(data.EMBEDDED, "test", _snap(variant), limit=10)
    with pytest.raises(DataError) as err:
        data.prepare(data.EMBEDDED, data_dir)
    _assert_actionable(err.value, damaged, variant)


def test_the_copy_loads_like_the_shared_fixture(copied, mnist_train, mnist_test):
    data_dir, _ = copied
    _assert_loads_like(data_dir, mnist_train, mnist_test)


def test_unknown_split_and_unknown_dataset_stay_what_they_are(copied):
    _, variant = copied
    with pytest.raises(DataError, match=r"no split 'validation'.*fix:"):
        data.load_split(data.EMBEDDED, "validation", _snap(variant))
    with pytest.raises(DataError, match="unknown dataset 'no_such_dataset'"):
        data.load_split("no_such_dataset", "train", _snap(variant))


def test_a_sliced_split_spec_still_names_the_damaged_file(copied):
    _, variant = copied
    damaged = _corrupt_middle(variant)
    with pytest.raises(DataError) as err:
        data.load_split(data.EMBEDDED, "test[:10]+train", _snap(variant))
    _assert_actionable(err.value, damaged, variant)


@pytest.mark.parametrize("error", [RuntimeError("cannot schedule new futures after shutdown"), KeyError("x")])
def test_an_unrelated_read_error_is_not_turned_into_damage(error, copied, monkeypatch):
    """A read that fails while every file reads on its own is passed on unchanged."""
    from tensorflow_datasets.core.data_sources import array_record as tfds_array_record

    _, variant = copied

    def explode(self, keys):
        raise error

    monkeypatch.setattr(tfds_array_record.ArrayRecordDataSource, "__getitems__", explode)
    with pytest.raises(type(error)) as err:
        data.load_split(data.EMBEDDED, "train", _snap(variant))
    assert err.value is error


def test_a_split_read_again_is_not_decoded_again_until_its_files_change(copied, mnist_train, monkeypatch):
    """load_split remembers what it read: the same split again is not decoded again (one
    run reads a split up to seven times), callers get copies, and a shard damaged since
    (same path and size) is read, and refused, rather than served from memory."""
    import tensorflow_datasets as tfds

    _, variant = copied
    reads = []
    original = tfds.core.DatasetBuilder.as_data_source

    def counted(self, *args, **kwargs):
        reads.append(kwargs.get("split"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tfds.core.DatasetBuilder, "as_data_source", counted)
    first, _ = data.load_split(data.EMBEDDED, "train", _snap(variant))
    first[:] = 0  # a caller's own change reaches no other caller
    again, labels = data.load_split(data.EMBEDDED, "train", _snap(variant))
    assert reads == ["train"]
    np.testing.assert_array_equal(again, mnist_train[0])
    np.testing.assert_array_equal(labels, mnist_train[1])
    data.load_split(data.EMBEDDED, "train", _snap(variant), 200)  # another limit is another read
    assert reads == ["train", "train"]

    damaged = _corrupt_middle(variant)
    with pytest.raises(DataError) as err:
        data.load_split(data.EMBEDDED, "train", _snap(variant))
    _assert_actionable(err.value, damaged, variant)
    assert reads == ["train", "train", "train"]
