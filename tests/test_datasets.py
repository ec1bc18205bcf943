"""Split-binary reader/writer and the synthetic source."""
import os

import numpy as np
import pytest
import yaml

from conftest import random_arrays
from core.files import FileError
from core.sources import DatasetError, load_spec, local_row_bounds
from dlrm_contract import DLRM_CONTRACT
from datasets import SplitBinaryReader, SplitBinaryWriter, SyntheticSource, check_mapping_files
from core.feature_spec import FeatureSpec

# One feature per categorical dtype, at the largest cardinality the dtype holds.
CAT_DTYPES = ["int8", "int16", "int32", "int64"]
CAT_CARDS = [128, 32768, 2 ** 31, 2 ** 40]


def small_spec(**kw):
    return FeatureSpec.get_default(3, [5, 300, 70000, 9], **kw)


def read_all(reader, order=None):
    batches = [reader.get(int(i)) for i in (range(len(reader)) if order is None else order)]
    numerical = np.concatenate([b[0] for b in batches])
    categorical = [np.concatenate([b[1][t] for b in batches]) for t in range(len(batches[0][1]))]
    label = np.concatenate([b[2] for b in batches])
    return numerical, categorical, label


@pytest.mark.parametrize("num_dtype", ["float16", "float32"])
@pytest.mark.parametrize("label_dtype", ["bool", "int8"])
def test_round_trip_every_dtype(write_dataset, num_dtype, label_dtype):
    spec = FeatureSpec.get_default(4, CAT_CARDS, numerical_dtype=num_dtype,
                                   label_dtype=label_dtype, categorical_dtypes=CAT_DTYPES)
    loaded, arrays = write_dataset(spec, {"train": 1000, "test": 77})
    assert loaded.to_dict()["feature_spec"] == spec.to_dict()["feature_spec"]
    for mapping, rows in (("train", 1000), ("test", 77)):
        reader = SplitBinaryReader(loaded, mapping, batch_size=128)
        numerical, categorical, label = read_all(reader)
        a = arrays[mapping]
        assert numerical.dtype == np.dtype(num_dtype) and numerical.shape == (rows, 4)
        assert np.array_equal(numerical, a["numerical"])
        assert label.dtype == np.dtype(label_dtype) and np.array_equal(label, a["label"])
        for got, want, dtype, card in zip(categorical, a["categorical"], CAT_DTYPES, CAT_CARDS):
            assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)
            assert got.min() == 0 and got.max() == card - 1
        reader.close()


def test_file_bytes_are_plain_little_endian_arrays(write_dataset):
    loaded, arrays = write_dataset(small_spec(), {"train": 50, "test": 5})
    files = loaded.feature_files("train")
    raw = np.fromfile(files["numerical"], dtype="<f2").reshape(50, 3)
    assert np.array_equal(raw, arrays["train"]["numerical"])
    assert np.array_equal(np.fromfile(files["categorical"][2], dtype="<i4"),
                          arrays["train"]["categorical"][2])
    assert os.path.getsize(files["label"]) == 50


@pytest.mark.parametrize("rows,batch,drop_last,expected", [
    (1000, 128, False, 8), (1000, 128, True, 7), (1024, 128, True, 8), (1024, 128, False, 8),
    (5, 128, False, 1), (5, 128, True, 0), (1, 1, True, 1)])
def test_batch_counts_and_eval_covers_every_row(write_dataset, rows, batch, drop_last,
                                                expected):
    loaded, arrays = write_dataset(small_spec(), {"train": rows, "test": 3})
    reader = SplitBinaryReader(loaded, "train", batch, drop_last=drop_last)
    assert len(reader) == expected
    if not drop_last:
        numerical, categorical, label = read_all(reader)
        assert np.array_equal(label, arrays["train"]["label"])
        assert np.array_equal(categorical[1], arrays["train"]["categorical"][1])
        last = reader.get(len(reader) - 1)
        assert last[2].shape[0] == rows - (expected - 1) * batch
    with pytest.raises(IndexError):
        reader.get(expected)


def test_shuffled_batch_order(write_dataset):
    loaded, arrays = write_dataset(small_spec(), {"train": 1000, "test": 3})
    plain = SplitBinaryReader(loaded, "train", 50)
    a = SplitBinaryReader(loaded, "train", 50, shuffle=True, seed=7)
    b = SplitBinaryReader(loaded, "train", 50, shuffle=True, seed=7, rank=1, world_size=2)
    c = SplitBinaryReader(loaded, "train", 50, shuffle=True, seed=8)
    assert np.array_equal(plain.batch_order(3), np.arange(20))
    order0, order1 = a.batch_order(0), a.batch_order(1)
    assert sorted(order0) == list(range(20)) and not np.array_equal(order0, np.arange(20))
    assert not np.array_equal(order0, order1)
    assert np.array_equal(order0, b.batch_order(0))  # every rank agrees
    assert not np.array_equal(order0, c.batch_order(0))
    for i in (0, 5, 19):  # get(i) is still batch i of the file
        assert np.array_equal(a.get(i)[2], plain.get(i)[2])
    epoch = list(a.epoch(1))
    assert np.array_equal(np.concatenate([e[2] for e in epoch]),
                          np.concatenate([plain.get(int(i))[2] for i in order1]))
    numerical, _, label = read_all(a, a.batch_order(0))
    assert sorted(label.tolist()) == sorted(arrays["train"]["label"].tolist())


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("tables", [[0], [1, 3], [2, 0], [0, 1, 2, 3], []])
def test_sharded_reads_reassemble(write_dataset, world_size, tables):
    loaded, _ = write_dataset(small_spec(), {"train": 1000, "test": 3})
    full = SplitBinaryReader(loaded, "train", 96)  # 10 full batches and one of 40 rows
    ranks = [SplitBinaryReader(loaded, "train", 96, rank=r, world_size=world_size,
                               categorical_indices=tables) for r in range(world_size)]
    assert all(len(r) == len(full) for r in ranks)
    for i in range(len(full)):
        numerical, categorical, label = full.get(i)
        parts = [r.get(i) for r in ranks]
        assert np.array_equal(np.concatenate([p[0] for p in parts]), numerical)
        assert np.array_equal(np.concatenate([p[2] for p in parts]), label)
        sizes = [p[2].shape[0] for p in parts]
        assert max(sizes) - min(sizes) <= 1
        for p in parts:
            assert len(p[1]) == len(tables)
            for got, t in zip(p[1], tables):
                assert np.array_equal(got, categorical[t])


def test_local_row_bounds_partition():
    for rows in (0, 1, 7, 96):
        for world in (1, 2, 3, 8):
            bounds = [local_row_bounds(rows, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_bad_reader_arguments(write_dataset):
    loaded, _ = write_dataset(small_spec(), {"train": 10, "test": 3})
    with pytest.raises(ValueError, match="4"):
        SplitBinaryReader(loaded, "train", 4, categorical_indices=[0, 4])
    with pytest.raises(ValueError, match="rank"):
        SplitBinaryReader(loaded, "train", 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        SplitBinaryReader(loaded, "train", 0)
    with pytest.raises(DatasetError, match="validation"):
        SplitBinaryReader(loaded, "validation", 4)


def _truncate(path, nbytes):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - nbytes)


def _files_by_kind(spec):
    files = spec.feature_files("train")
    return {"numerical": (files["numerical"], 6), "label": (files["label"], 1),
            "categorical_int8": (files["categorical"][0], 1),
            "categorical_int32": (files["categorical"][2], 4)}


@pytest.mark.parametrize("kind", ["numerical", "label", "categorical_int8",
                                  "categorical_int32"])
@pytest.mark.parametrize("how", ["partial_row", "whole_rows", "whole_rows_no_metadata",
                                 "missing"])
def test_truncated_file_named(write_dataset, kind, how):
    loaded, _ = write_dataset(small_spec(), {"train": 100, "test": 3})
    path, row_bytes = _files_by_kind(loaded)[kind]
    if how == "partial_row":
        _truncate(path, 1)
    elif how == "missing":
        os.unlink(path)
    else:
        _truncate(path, 2 * row_bytes)
    if how == "whole_rows_no_metadata":
        spec_path = os.path.join(loaded.base_directory, "feature_spec.yaml")
        raw = yaml.safe_load(open(spec_path))
        del raw["metadata"]["rows"]
        with open(spec_path, "w") as f:
            yaml.safe_dump(raw, f)
        loaded = load_spec(loaded.base_directory, DLRM_CONTRACT)
    with pytest.raises(DatasetError) as info:
        SplitBinaryReader(loaded, "train", 16)
    message = str(info.value)
    assert path in message and "\n" not in message
    others = [p for k, (p, _) in _files_by_kind(loaded).items() if k != kind]
    assert not any(p in message for p in others)
    check_mapping_files(loaded, "test")  # the other mapping is fine


def test_file_truncated_after_open_named(write_dataset):
    loaded, _ = write_dataset(small_spec(), {"train": 100, "test": 3})
    reader = SplitBinaryReader(loaded, "train", 16)
    path = loaded.feature_files("train")["categorical"][2]
    _truncate(path, 40)
    reader.get(0)
    with pytest.raises(DatasetError, match=path):
        reader.get(len(reader) - 1)


def test_writer_refuses_non_empty_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    spec = small_spec()
    with pytest.raises(FileError, match="not empty"):
        SplitBinaryWriter(str(out), spec)
    assert (out / "keep.txt").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileError, match="not a directory"):
        SplitBinaryWriter(str(tmp_path / "file"), spec)
    a = random_arrays(spec, 10)
    with SplitBinaryWriter(str(out), spec, overwrite=True) as w:
        w.write("train", a["numerical"], a["categorical"], a["label"])
    assert sorted(os.listdir(out)) == ["feature_spec.yaml", "test", "train"]
    assert load_spec(str(out), DLRM_CONTRACT).metadata["rows"] == {"train": 10, "test": 0}
    assert sorted(os.listdir(tmp_path)) == ["file", "out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    SplitBinaryWriter(str(empty), spec).close()  # an empty directory is fine
    assert check_mapping_files(load_spec(str(empty), DLRM_CONTRACT), "test") == 0


def test_writer_exception_leaves_nothing(tmp_path):
    spec = small_spec()
    a = random_arrays(spec, 10)
    with pytest.raises(RuntimeError):
        with SplitBinaryWriter(str(tmp_path / "out"), spec) as w:
            w.write("train", a["numerical"], a["categorical"], a["label"])
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_writer_exception_keeps_old_output(write_dataset, tmp_path):
    loaded, arrays = write_dataset(small_spec(), {"train": 20, "test": 3})
    before = {f: open(os.path.join(loaded.base_directory, "train", f), "rb").read()
              for f in os.listdir(os.path.join(loaded.base_directory, "train"))}
    with pytest.raises(RuntimeError):
        with SplitBinaryWriter(loaded.base_directory, small_spec(), overwrite=True) as w:
            a = random_arrays(small_spec(), 5, seed=9)
            w.write("train", a["numerical"], a["categorical"], a["label"])
            raise RuntimeError("boom")
    after = {f: open(os.path.join(loaded.base_directory, "train", f), "rb").read()
             for f in os.listdir(os.path.join(loaded.base_directory, "train"))}
    assert before == after
    assert os.listdir(tmp_path) == ["data"]


@pytest.mark.parametrize("bad,match", [
    ("id_too_big", "'cat_0'.*\\[0, 5\\)"), ("negative_id", "'cat_2'"),
    ("float_ids", "'cat_1'.*integers"), ("short_categorical", "'cat_3'.*shape"),
    ("numerical_shape", "numerical block"), ("missing_table", "4 categorical arrays"),
    ("unknown_mapping", "'dev'")])
def test_rejected_write_writes_nothing(tmp_path, bad, match):
    spec = small_spec()
    a = random_arrays(spec, 10)
    cat = list(a["categorical"])
    num, mapping = a["numerical"], "train"
    if bad == "id_too_big":
        cat[0] = np.full(10, 5)
    elif bad == "negative_id":
        cat[2] = np.full(10, -1)
    elif bad == "float_ids":
        cat[1] = np.ones(10)
    elif bad == "short_categorical":
        cat[3] = cat[3][:9]
    elif bad == "numerical_shape":
        num = num[:, :2]
    elif bad == "missing_table":
        cat = cat[:3]
    else:
        mapping = "dev"
    w = SplitBinaryWriter(str(tmp_path / "out"), spec)
    w.write("train", a["numerical"], a["categorical"], a["label"])
    with pytest.raises(DatasetError, match=match):
        w.write(mapping, num, cat, a["label"])
    out = w.close()  # the rejected write left the files consistent
    assert out.metadata["rows"]["train"] == 10
    assert len(SplitBinaryReader(out, "train", 4)) == 3


def test_writer_abort_and_drop_clean_up(tmp_path):
    spec = small_spec()
    w = SplitBinaryWriter(str(tmp_path / "a"), spec)
    a = random_arrays(spec, 4)
    w.write("train", a["numerical"], a["categorical"], a["label"])
    w.abort()
    w2 = SplitBinaryWriter(str(tmp_path / "b"), spec)
    w2.write("test", a["numerical"], a["categorical"], a["label"])
    del w2
    assert os.listdir(tmp_path) == []


def test_writer_refuses_paths_outside_output(tmp_path):
    spec = small_spec()
    spec.source_spec["train"][0]["files"] = ["../escape.bin"]
    with pytest.raises(DatasetError, match="escape.bin"):
        SplitBinaryWriter(str(tmp_path / "out"), spec)


# ---- synthetic source -------------------------------------------------------------------

def test_synthetic_is_deterministic_under_seed():
    spec = small_spec()
    a = SyntheticSource(spec, 256, 4, seed=3, signal_strength=1.0)
    b = SyntheticSource(spec, 256, 4, seed=3, signal_strength=1.0)
    c = SyntheticSource(spec, 256, 4, seed=4, signal_strength=1.0)
    for i in range(4):
        for x, y in zip(a.get(i)[1], b.get(i)[1]):
            assert np.array_equal(x, y)
        assert np.array_equal(a.get(i)[0], b.get(i)[0])
        assert np.array_equal(a.get(i)[2], b.get(i)[2])
    assert not np.array_equal(a.get(0)[0], c.get(0)[0])
    assert not np.array_equal(a.get(0)[0], a.get(1)[0])  # no two steps share a batch
    n, cat, label = a.get(2)
    assert n.dtype == np.float16 and label.dtype == bool
    assert [x.dtype for x in cat] == [spec.dtype(f) for f in spec.categorical_features]
    assert all(0 <= x.min() and x.max() < card for x, card in zip(cat, spec.cardinalities))


def test_synthetic_sharding_matches_full_batch():
    spec = small_spec()
    full = SyntheticSource(spec, 100, 2, seed=1)
    parts = [SyntheticSource(spec, 100, 2, seed=1, rank=r, world_size=3,
                             categorical_indices=[3, 1]) for r in range(3)]
    n, cat, label = full.get(1)
    got = [p.get(1) for p in parts]
    assert np.array_equal(np.concatenate([g[0] for g in got]), n)
    assert np.array_equal(np.concatenate([g[2] for g in got]), label)
    assert all(np.array_equal(g[1][0], cat[3]) and np.array_equal(g[1][1], cat[1]) for g in got)


def test_synthetic_power_law():
    spec = FeatureSpec.get_default(1, [1000])
    means = {}
    for alpha in (1.0, 1.5, 3.0):
        ids = SyntheticSource(spec, 50000, 1, power_law_alpha=alpha).get(0)[1][0]
        means[alpha] = ids.mean()
        assert ids.min() >= 0 and ids.max() <= 999
    assert abs(means[1.0] - 499.5) < 10  # alpha 1: uniform
    assert means[1.0] > means[1.5] > means[3.0]
    with pytest.raises(ValueError, match="power_law_alpha"):
        SyntheticSource(spec, 10, 1, power_law_alpha=0.5)


def _planted_auc(signal_strength):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    spec = FeatureSpec.get_default(4, [1000, 50, 7])
    source = SyntheticSource(spec, 10000, 2, seed=0, signal_strength=signal_strength)

    def planted(i):
        n, cat, label = source.get(i)
        x = np.column_stack([n[:, 0], n[:, 1], SyntheticSource.hash_sign(cat[0]),
                             SyntheticSource.hash_sign(cat[1])]).astype(np.float64)
        return x, label.astype(int)

    x_train, y_train = planted(0)
    x_test, y_test = planted(1)
    model = LogisticRegression().fit(x_train, y_train)
    return roc_auc_score(y_test, model.predict_proba(x_test)[:, 1])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # scipy/sklearn solver options
def test_synthetic_signal_is_learnable():
    assert _planted_auc(2.0) > 0.75
    assert _planted_auc(0.5) > 0.6
    assert abs(_planted_auc(0.0) - 0.5) < 0.03
