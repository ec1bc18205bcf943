"""SIM data in NVIDIA's TFRecord layouts, both ways: files laid out as the reference's
preprocessing/parquet_to_tfrecord.py writes them (plain, and prebatched with a remainder
file; written here by a small independent writer) read row for row, and our files parsed
the way the reference's loader parses them. Plus the parquet -> TFRecord tool and its three
fixed reference defects, and bad records as one-line errors."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import yaml

from test_sim_errors import one_line_error

D, USERS, ITEMS, CATS = 6, 40, 30, 5


def reference_rows(n, seed=0):
    """n rows in the reference's convention: ids 1..cardinality, histories of D ids
    left-padded with 0 (0..D real behaviours), most recent last."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, D + 1, n)
    real = np.arange(D)[None, :] >= (D - lengths)[:, None]

    def history(card):
        return np.where(real, rng.integers(1, card + 1, (n, D)), 0)

    return {"label": rng.integers(0, 2, n), "user_feat_0": rng.integers(1, USERS + 1, n),
            "item_feat_0_trgt": rng.integers(1, ITEMS + 1, n),
            "item_feat_1_trgt": rng.integers(1, CATS + 1, n),
            "item_feat_0_pos": history(ITEMS), "item_feat_1_pos": history(CATS),
            "item_feat_0_neg": history(ITEMS), "item_feat_1_neg": history(CATS)}


def reference_spec_dict(files):
    """The feature_spec.yaml the reference's tool writes (no prebatch size, bool label)."""
    item = {"item_feat_0": ITEMS, "item_feat_1": CATS}
    features = {"user_feat_0": {"dtype": "int64", "cardinality": USERS},
                "label": {"dtype": "bool"}}
    for name, card in item.items():
        features[f"{name}_trgt"] = {"dtype": "int64", "cardinality": card}
        for suffix in ("pos", "neg"):
            features[f"{name}_{suffix}"] = {"dtype": "int64", "cardinality": card,
                                            "dimensions": [D]}
    names = ["label", "user_feat_0", "item_feat_0_trgt", "item_feat_1_trgt",
             "item_feat_0_pos", "item_feat_1_pos", "item_feat_0_neg", "item_feat_1_neg"]
    return {"channel_spec": {"label": ["label"], "user_features": ["user_feat_0"],
                             "target_item_features": names[2:4],
                             "positive_history": names[4:6], "negative_history": names[6:8]},
            "feature_spec": features,
            "source_spec": {m: [{"type": "tfrecord", "features": names, "files": f}]
                            for m, f in files.items()},
            "metadata": {}}


def write_reference_layout(directory, mappings, prebatch=0, parts=3):
    """Writes {mapping: rows} as the reference's tool does: every feature an int64 list;
    one row per record, or `prebatch` rows per record (values of the rows concatenated)
    spread over `parts` files plus remainder.tfrecord holding the last rows."""
    os.makedirs(directory)
    files = {}
    for mapping, rows in mappings.items():
        n = len(rows["label"])
        size = prebatch or 1
        groups = [(a, min(a + size, n)) for a in range(0, n, size)]
        remainder = groups.pop() if prebatch and n % prebatch else None
        records = [_record(rows, a, b) for a, b in groups]
        os.makedirs(os.path.join(directory, mapping))
        files[mapping] = []
        for k, part in enumerate(np.array_split(np.arange(len(records)), parts)):
            if len(part):
                files[mapping].append(_write(directory, f"{mapping}/part_{k}.tfrecord",
                                             [records[i] for i in part]))
        if remainder:
            files[mapping].append(_write(directory, f"{mapping}/remainder.tfrecord",
                                         [_record(rows, *remainder)]))
    with open(os.path.join(directory, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(reference_spec_dict(files), f)
    return str(directory)


def _record(rows, a, b):
    feature = {name: tf.train.Feature(int64_list=tf.train.Int64List(
        value=np.asarray(values[a:b]).reshape(-1).tolist())) for name, values in rows.items()}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(directory, name, records):
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as out:
        for record in records:
            out.write(record)
    return name


def read_all(directory, mapping, batch_size, **kwargs):
    """Every batch of a mapping through SimBatches, concatenated, and the batch sizes."""
    from core.parallel.comm import make_communicator
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    from sim.data import open_mapping
    spec = load_spec(directory, SIM_CONTRACT)
    reader = open_mapping(spec, mapping, batch_size, make_communicator(), **kwargs)
    batches = [reader.get(i) for i in range(len(reader))]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, \
        [len(b["label"]) for b in batches]


@pytest.mark.parametrize("prebatch", [0, 8])
@pytest.mark.parametrize("batch_size", [3, 8, 16, 37, 64])
def test_reference_layout_read_row_for_row(tmp_path, prebatch, batch_size):
    """Plain and prebatched (37 rows = 4 records of 8 + a remainder of 5) files: every row
    read once, in order, with the reference's values, whatever the batch size."""
    rows = reference_rows(37)
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, prebatch)
    got, sizes = read_all(data, "train", batch_size)
    assert sum(sizes) == 37 and all(s == batch_size for s in sizes[:-1])
    for name, values in rows.items():
        np.testing.assert_array_equal(got[name], values, err_msg=name)


@pytest.mark.parametrize("model_type", ["sim", "din", "dien", "hstu"])
def test_main_trains_on_prebatched_reference_files(tmp_path, model_type):
    """sim.main on the reference's prebatched layout (spec without a prebatch size): every
    training row read once per epoch, every test row evaluated."""
    from test_sim_training import SMALL, run_main
    from core.dllog import read_log
    rows = reference_rows(37)
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": reference_rows(21)},
                                  8)
    run_main(["--dataset_dir", data, "--results_dir", str(tmp_path / "r")] + SMALL +
             ["--model_type", model_type, "--long_seq_length", "2", "--epochs", "2",
              "--global_batch_size", "5"])
    epochs = [r["data"] for r in read_log(str(tmp_path / "r" / "log.json"))
              if r["step"] and "auc" in r["data"]]
    assert [(e["train_samples"], e["eval_samples"]) for e in epochs] == [(37, 21)] * 2


def test_prebatch_size_from_flag_must_match_the_data(tmp_path):
    from core.sources import DatasetError
    rows = reference_rows(20)
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, 8)
    got, _ = read_all(data, "train", 5, prebatch=8)
    np.testing.assert_array_equal(got["item_feat_0_pos"], rows["item_feat_0_pos"])
    with pytest.raises(DatasetError, match=r"part_0.tfrecord: record 0 holds 8 row\(s\), but "
                                           r"the prebatch size is 4"):
        read_all(data, "train", 5, prebatch=4)


def test_two_ranks_read_every_prebatched_row_once(tmp_path):
    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    rows = reference_rows(29)
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, 4)
    spec = load_spec(data, SIM_CONTRACT)
    seen = []
    for rank in range(2):
        reader = open_reader(spec, "train", 6, rank=rank, world_size=2)
        seen += [reader.get(i)["user_feat_0"] for i in range(len(reader))]
    assert sorted(np.concatenate(seen)) == sorted(rows["user_feat_0"])


def reference_loader_parse(directory, mapping, prebatch):
    """Our files parsed the way the reference's loader parses them: FixedLenFeature int64 of
    the spec's dimensions (times the prebatch size), RaggedFeature for remainder.tfrecord."""
    with open(os.path.join(directory, "feature_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    out = {}
    for path in spec["source_spec"][mapping][0]["files"]:
        remainder = os.path.basename(path) == "remainder.tfrecord"
        parse = {}
        for name, props in spec["feature_spec"].items():
            dims = list(props.get("dimensions", [1] if prebatch else []))
            if prebatch:
                dims[0] *= prebatch
            parse[name] = tf.io.RaggedFeature(tf.int64) if remainder else \
                tf.io.FixedLenFeature(dims, tf.int64)
        for record in tf.data.TFRecordDataset(os.path.join(directory, path)):
            example = tf.io.parse_example(record[None], parse)
            for name, value in example.items():
                value = value.flat_values if remainder else value
                width = spec["feature_spec"][name].get("dimensions", [1])[0]
                out.setdefault(name, []).append(np.reshape(value.numpy(), [-1, width]))
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("prebatch", [0, 16])
def test_our_files_parse_as_the_reference_loader_parses(tmp_path, prebatch):
    from sim.synthetic import write
    write(str(tmp_path / "d"), users=130, items=50, categories=5, history_length=95,
          prebatch={"train": prebatch, "test": prebatch})
    got = reference_loader_parse(str(tmp_path / "d"), "train", prebatch)
    ours, _ = read_all(str(tmp_path / "d"), "train", 1000)
    assert len(got["label"]) == 104
    for name in ours:
        np.testing.assert_array_equal(got[name].reshape(ours[name].shape), ours[name])
    history = got["hist_item_id"]
    real = history > 0  # left-padded: once a row's behaviours start, they run to the end
    assert real.any() and np.all(np.diff(real.astype(int), axis=1) >= 0)
    assert got["user_id"].min() == 1 and got["user_id"].max() == 104  # ids from 1


# ---- the parquet -> TFRecord tool ------------------------------------------------------

def byo_parquet(directory, train_rows, test_rows=10):
    """NVIDIA's documented BYO layout: metadata.json + train/, test/ parquet parts with the
    label, user, target, positive and negative columns in that order (names free)."""
    os.makedirs(directory)
    with open(os.path.join(directory, "metadata.json"), "w") as f:
        json.dump({"cardinalities": [{"name": "uid", "value": USERS},
                                     {"name": "item", "value": ITEMS},
                                     {"name": "cat", "value": CATS}]}, f)
    out = {}
    for mapping, n in (("train", train_rows), ("test", test_rows)):
        rows = reference_rows(n, seed=n)
        # the writer serializes features in key order, user_feat_0 last: user-0 rows are
        # serializations ending in NUL
        rows["user_feat_0"][::2] = 0
        os.makedirs(os.path.join(directory, mapping))
        table = {"lbl": rows["label"], "uid": rows["user_feat_0"],
                 "item": rows["item_feat_0_trgt"], "cat": rows["item_feat_1_trgt"]}
        for name in ("item_feat_0_pos", "item_feat_1_pos", "item_feat_0_neg",
                     "item_feat_1_neg"):
            table[name] = list(rows[name])
        half = n // 2
        for k, (a, b) in enumerate(((0, half), (half, n))):
            pq.write_table(pa.table({c: v[a:b] for c, v in table.items()}),
                           os.path.join(directory, mapping, f"part.{k}.parquet"))
        out[mapping] = rows
    return out


def convert(src, dst, *extra):
    from sim.preproc.parquet_to_tfrecord import main
    return main(["--amazon_dataset_path", str(src), "--tfrecord_output_dir", str(dst),
                 "--number_of_user_features", "1", "--max_seq_len", str(D)] + list(extra))


@pytest.mark.parametrize("train_rows,prebatch", [(37, 0), (37, 8), (32, 8)])
def test_parquet_to_tfrecord_round_trip(tmp_path, train_rows, prebatch):
    """Every row comes back (no record truncated at a trailing NUL byte, unlike the
    reference's array_split), a row count divisible by the prebatch size needs no remainder
    (the reference crashes), and the spec records the prebatch size (the reference's does
    not)."""
    rows = byo_parquet(tmp_path / "byo", train_rows)
    assert convert(tmp_path / "byo", tmp_path / "out", "--prebatch_train_size",
                   str(prebatch), "--train_parts", "3") == 0
    with open(tmp_path / "out" / "feature_spec.yaml") as f:
        spec = yaml.safe_load(f)
    files = spec["source_spec"]["train"][0]["files"]
    assert ("train/remainder.tfrecord" in files) == bool(prebatch and train_rows % prebatch)
    assert spec["metadata"].get("prebatch_size") == ({"train": prebatch} if prebatch else None)
    assert spec["feature_spec"]["label"]["dtype"] == "bool"
    raw = [bytes(r.numpy()) for f in files
           for r in tf.data.TFRecordDataset(str(tmp_path / "out" / f))]
    if not prebatch:
        assert any(r.endswith(b"\x00") for r in raw)  # the records the reference truncates
    got = reference_loader_parse(str(tmp_path / "out"), "train", prebatch)
    for name, values in rows["train"].items():
        np.testing.assert_array_equal(got[name].reshape(np.shape(values)), values, name)
    ours, _ = read_all(str(tmp_path / "out"), "train", 5)
    np.testing.assert_array_equal(ours["item_feat_1_neg"], rows["train"]["item_feat_1_neg"])


def test_parquet_to_tfrecord_pads_short_histories_and_rejects_bad_ids(tmp_path, capsys):
    rows = byo_parquet(tmp_path / "byo", 6)
    path = tmp_path / "byo" / "train" / "part.1.parquet"
    table = pq.read_table(path).to_pydict()
    table["item_feat_0_pos"][1] = [7, 8]  # a short history: left-padded on the way
    table["item_feat_1_pos"][1] = [1, 2]
    pq.write_table(pa.table(table), path)
    assert convert(tmp_path / "byo", tmp_path / "out") == 0
    ours, _ = read_all(str(tmp_path / "out"), "train", 10)
    assert list(ours["item_feat_0_pos"][4]) == [0] * (D - 2) + [7, 8]
    np.testing.assert_array_equal(ours["item_feat_0_pos"][:4], rows["train"]["item_feat_0_pos"][:4])
    table["cat"][2] = CATS + 1
    pq.write_table(pa.table(table), path)
    capsys.readouterr()
    assert convert(tmp_path / "byo", tmp_path / "out2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part.1.parquet" in err[0] and "'cat'" in err[0] \
        and "row 2" in err[0] and f"id {CATS + 1}" in err[0], err
    assert not os.path.exists(tmp_path / "out2")


def test_reference_command_line_entry_point(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    byo_parquet(tmp_path / "byo", 9)
    done = subprocess.run([sys.executable, "preprocessing/parquet_to_tfrecord.py",
                           "--amazon_dataset_path", str(tmp_path / "byo"),
                           "--tfrecord_output_dir", str(tmp_path / "out"), "--n_proc", "2",
                           "--max_seq_len", str(D), "--prebatch_train_size", "4",
                           "--prebatch_test_size", "4"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got, _ = read_all(str(tmp_path / "out"), "test", 3)
    assert len(got["label"]) == 10


# ---- bad records: one line naming file, record and feature ------------------------------

@pytest.fixture()
def reference_data(tmp_path):
    rows = reference_rows(40)
    return rows, write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, 8)


def test_id_out_of_range(tmp_path, capsys):
    rows = reference_rows(40)
    rows["item_feat_1_pos"][21, -1] = CATS + 1  # row 21: record 2 (of 8 rows), its row 5
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, 8)
    line = one_line_error(capsys, ["--dataset_dir", data, "--results_dir", str(tmp_path / "r"),
                                   "--long_seq_length", "2"])
    assert "part_0.tfrecord record 2 row 5" in line or "part_1.tfrecord record" in line, line
    assert "'item_feat_1_pos'" in line and f"id {CATS + 1}" in line, line


def test_corrupt_record(reference_data, tmp_path, capsys):
    _, data = reference_data
    path = os.path.join(data, "train", "part_1.tfrecord")
    blob = bytearray(open(path, "rb").read())
    blob[12:40] = b"\xec" * 28  # the first record's payload
    open(path, "wb").write(bytes(blob))
    line = one_line_error(capsys, ["--dataset_dir", data, "--results_dir", str(tmp_path / "r"),
                                   "--long_seq_length", "2"])
    assert "part_1.tfrecord" in line and "record 0" in line, line


def test_wrong_shape(tmp_path, capsys):
    rows = reference_rows(16)
    data = write_reference_layout(tmp_path / "d", {"train": rows, "test": rows}, 8)
    bad = {k: v for k, v in rows.items()}
    bad["item_feat_0_neg"] = bad["item_feat_0_neg"][:, :D - 1]  # D-1 values a row
    _write(data, "train/part_1.tfrecord", [_record(bad, 8, 16)])
    line = one_line_error(capsys, ["--dataset_dir", data, "--results_dir", str(tmp_path / "r"),
                                   "--long_seq_length", "2"])
    assert "part_1.tfrecord: record 0: feature 'item_feat_0_neg'" in line, line
    assert f"expected {8 * D}" in line, line
