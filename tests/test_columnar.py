"""The FeatureSpec core for every family: multi-hot and sequence features, parquet and
TFRecord round trips, sharded reads, transcode to columnar formats, channel contracts."""
import copy
import os

import numpy as np
import pandas as pd
import pytest
import yaml

import gen_csv
import transcode
from dlrm_contract import DLRM_CONTRACT
from core.files import FileError
from core.columnar import ColumnarWriter, open_reader, write_columns
from core.sources import DatasetError, length_key
from core.feature_spec import FeatureSpec, FeatureSpecError
from sim.contract import SIM_CONTRACT
from wide_and_deep.contract import WIDE_DEEP_CONTRACT

FORMATS = ("parquet", "tfrecord")


def wd_spec():
    fs = {"ad": {"dtype": "int32", "cardinality": 50},
          "topics": {"dtype": "int64", "cardinality": 30, "dimensions": [3]},
          "views": {"dtype": "float32"}, "clicked": {"dtype": "int8"},
          "display": {"dtype": "int64"}}
    cs = {"onehot_categorical": ["ad"], "multihot_categorical": ["topics"],
          "numerical": ["views"], "label": ["clicked"], "map": ["display"]}
    return FeatureSpec(fs, {"train": [], "test": []}, cs)


def sim_spec(length=100):
    fs = {"uid": {"dtype": "int32", "cardinality": 20},
          "item": {"dtype": "int32", "cardinality": 500},
          "cat": {"dtype": "int16", "cardinality": 40},
          "pos_item": {"dtype": "int32", "cardinality": 500, "dimensions": [length]},
          "pos_cat": {"dtype": "int16", "cardinality": 40, "dimensions": [length]},
          "neg_item": {"dtype": "int32", "cardinality": 500, "dimensions": [length]},
          "neg_cat": {"dtype": "int16", "cardinality": 40, "dimensions": [length]},
          "label": {"dtype": "int8"}}
    cs = {"user_features": ["uid"], "target_item_features": ["item", "cat"],
          "positive_history": ["pos_item", "pos_cat"],
          "negative_history": ["neg_item", "neg_cat"], "label": ["label"]}
    return FeatureSpec(fs, {"train": [], "test": []}, cs)


def random_columns(spec, rows, seed):
    """Random values for every feature: ragged lists for features with dimensions."""
    rng = np.random.default_rng(seed)
    columns = {}
    for name, props in spec.feature_spec.items():
        width = spec.dimension(name)
        if width is not None:
            lengths = rng.integers(0, width + 1, rows)
            columns[name] = [rng.integers(0, props["cardinality"], n) for n in lengths]
        elif "cardinality" in props:
            columns[name] = rng.integers(0, props["cardinality"], rows)
        elif np.dtype(props["dtype"]).kind == "f":
            columns[name] = rng.normal(size=rows).astype(np.float32)
        elif name in spec.channel("label"):
            columns[name] = rng.integers(0, 2, rows)
        else:
            columns[name] = rng.permutation(rows) * 7
    return columns


def assert_batch_equals_rows(spec, batch, columns, rows):
    """batch (reader output) holds exactly rows `rows` of the written columns."""
    for name in spec.feature_spec:
        width = spec.dimension(name)
        if width is None:
            np.testing.assert_array_equal(batch[name], np.asarray(columns[name])[rows])
            assert batch[name].dtype == spec.dtype(name)
            continue
        expected = [columns[name][r] for r in rows]
        np.testing.assert_array_equal(batch[length_key(name)], [len(e) for e in expected])
        padded = np.zeros((len(rows), width), dtype=np.int64)
        for i, e in enumerate(expected):
            padded[i, :len(e)] = e
        np.testing.assert_array_equal(batch[name], padded)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make_spec", [wd_spec, sim_spec], ids=["multihot", "sequence"])
def test_round_trip_scalar_multihot_sequence(tmp_path, fmt, make_spec):
    spec = make_spec()
    train, test = random_columns(spec, 230, 1), random_columns(spec, 17, 2)
    out = write_columns(str(tmp_path / "data"), spec, {"train": train, "test": test}, fmt,
                        rows_per_file=100)
    assert [len(out.source_spec[m][0]["files"]) for m in ("train", "test")] == [3, 1]
    loaded = FeatureSpec.from_yaml(str(tmp_path / "data" / "feature_spec.yaml"))
    loaded.validate(WIDE_DEEP_CONTRACT if make_spec is wd_spec else SIM_CONTRACT) \
        if (fmt == "parquet") == (make_spec is wd_spec) else None
    assert loaded.metadata["rows"] == {"train": 230, "test": 17}
    reader = open_reader(loaded, "train", 64)
    assert len(reader) == 4
    for i in range(len(reader)):
        assert_batch_equals_rows(spec, reader.get(i), train, list(range(i * 64,
                                                                          min(230, i * 64 + 64))))
    assert_batch_equals_rows(spec, open_reader(loaded, "test", 100).get(0), test, list(range(17)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_sharded_reads_reassemble_one_rank(tmp_path, fmt):
    spec = wd_spec()
    columns = random_columns(spec, 301, 3)
    out = write_columns(str(tmp_path / "d"), spec, {"train": columns, "test": columns}, fmt,
                        rows_per_file=77)
    whole = open_reader(out, "train", 40, shuffle=True, seed=5)
    for world in (1, 2, 3):
        readers = [open_reader(out, "train", 40, rank=r, world_size=world, shuffle=True,
                               seed=5) for r in range(world)]
        for epoch in (0, 1):
            order = whole.batch_order(epoch)
            assert all((r.batch_order(epoch) == order).all() for r in readers)
            for i in order:
                parts = [r.get(int(i)) for r in readers]
                expected = whole.get(int(i))
                for key, value in expected.items():
                    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)
    seen = np.concatenate([whole.get(int(i))["display"] for i in whole.batch_order(0)])
    assert sorted(seen) == sorted(columns["display"])  # every row exactly once per epoch


def test_chunks_split_features_and_files(tmp_path):
    """A mapping of two parquet chunks (different features, different file splits) reads
    as one table; a chunk with fewer rows is named."""
    spec = wd_spec()
    columns = random_columns(spec, 90, 4)
    out = write_columns(str(tmp_path / "a"), spec, {"train": columns, "test": columns},
                        "parquet", rows_per_file=40)
    other = write_columns(str(tmp_path / "b"), spec, {"train": columns, "test": columns},
                          "parquet", rows_per_file=25)
    joined = out.copy()
    joined.source_spec["train"] = [
        {"type": "parquet", "features": ["ad", "topics"], "files": out.source_spec["train"][0]["files"]},
        {"type": "parquet", "features": ["views", "clicked", "display"],
         "files": [os.path.join("..", "b", f) for f in other.source_spec["train"][0]["files"]]}]
    joined.validate(WIDE_DEEP_CONTRACT)
    assert_batch_equals_rows(spec, open_reader(joined, "train", 90).get(0), columns,
                             list(range(90)))
    joined.source_spec["train"][1]["files"].pop()
    joined.metadata = {}
    with pytest.raises(DatasetError, match=r"b/train/part_00002.parquet.*\(75 rows\)"):
        open_reader(joined, "train", 10)


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_rejects_rows_longer_than_dimensions(tmp_path, fmt):
    columns = random_columns(wd_spec(), 20, 5)  # up to 3 values per row
    columns["topics"][7] = np.array([1, 2, 3, 4, 5])
    wide = wd_spec()
    wide.feature_spec["topics"]["dimensions"] = [5]
    write_columns(str(tmp_path / "d"), wide, {"train": columns, "test": columns}, fmt)
    narrow = FeatureSpec.from_yaml(str(tmp_path / "d" / "feature_spec.yaml"))
    narrow.feature_spec["topics"]["dimensions"] = [3]
    with pytest.raises(DatasetError, match=r"'topics' row 7 has 5 values.*\[3\]"):
        open_reader(narrow, "train", 20).get(0)


def test_writer_checks_and_stages(tmp_path):
    spec = wd_spec()
    columns = random_columns(spec, 10, 6)
    columns["topics"][2] = [1, 2, 3, 4]
    writer = ColumnarWriter(str(tmp_path / "out"), spec, "parquet")
    with pytest.raises(DatasetError, match="'topics': row 2 has 4 values"):
        writer.write("train", columns)
    columns = random_columns(spec, 10, 6)
    columns["ad"][3] = 50
    with pytest.raises(DatasetError, match=r"'ad': ids must lie in \[0, 50\)"):
        writer.write("train", columns)
    writer.abort()
    assert not os.path.exists(tmp_path / "out") and os.listdir(tmp_path) == []
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(FileError, match="not empty"):
        ColumnarWriter(str(tmp_path / "out"), spec, "tfrecord")
    with pytest.raises(DatasetError, match="output format"):
        ColumnarWriter(str(tmp_path / "new"), spec, "orc")


def test_generated_spec_round_trips(tmp_path):
    spec = sim_spec()
    out = write_columns(str(tmp_path / "d"), spec, {"train": random_columns(spec, 5, 0),
                                                    "test": random_columns(spec, 5, 1)},
                        "tfrecord")
    out.validate(SIM_CONTRACT)
    loaded = FeatureSpec.from_yaml(str(tmp_path / "d" / "feature_spec.yaml"))
    assert loaded.to_dict() == out.to_dict()
    assert loaded.dimension("pos_item") == 100 and loaded.dimension("uid") is None


# ---- transcode: CSV with '|'-separated multi-hot / sequence fields -------------------------
CSV_SPEC = {
    "feature_spec": {"ad": {"cardinality": "auto"}, "topics": {"cardinality": 30,
                                                               "dimensions": [3]},
                     "views": {}, "clicked": {}, "display": {}},
    "channel_spec": {"onehot_categorical": ["ad"], "multihot_categorical": ["topics"],
                     "numerical": ["views"], "label": ["clicked"], "map": ["display"]},
    "source_spec": {m: [{"type": "csv", "features": ["ad", "topics", "views"],
                         "files": [f"{m}/a.csv"]},
                        {"type": "csv", "features": ["clicked", "display"],
                         "files": [f"{m}/b0.csv", f"{m}/b1.csv"]}] for m in ("train", "test")},
}
CSV_ROWS = {"a": ["4,1|2|3,0.5", "0,,1.25", "9,7,2.0"], "b0": ["1,10", "0,11"], "b1": ["0,12"]}


@pytest.fixture
def multihot_csv(tmp_path):
    root = tmp_path / "csv"
    for mapping in ("train", "test"):
        (root / mapping).mkdir(parents=True)
        for name, lines in CSV_ROWS.items():
            (root / mapping / f"{name}.csv").write_text("\n".join(lines) + "\n")
    (root / "feature_spec.yaml").write_text(yaml.safe_dump(CSV_SPEC))
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_transcode_multihot_round_trip(multihot_csv, tmp_path, fmt):
    out = tmp_path / fmt
    assert transcode.main(["--input", str(multihot_csv), "--output", str(out),
                           "--output_format", fmt, "--quiet", "--chunk_size", "2"]) == 0
    spec = FeatureSpec.from_yaml(str(out / "feature_spec.yaml"))
    assert spec.cardinality("ad") == 10 and spec.cardinality("topics") == 30
    assert len(spec.source_spec["train"][0]["files"]) == 2  # --chunk_size rows per file
    batch = open_reader(spec, "train", 3).get(0)
    np.testing.assert_array_equal(batch["ad"], [4, 0, 9])
    np.testing.assert_array_equal(batch["topics"], [[1, 2, 3], [0, 0, 0], [7, 0, 0]])
    np.testing.assert_array_equal(batch["topics__length"], [3, 0, 1])
    np.testing.assert_allclose(batch["views"], [0.5, 1.25, 2.0])
    np.testing.assert_array_equal(batch["clicked"], [1, 0, 0])
    np.testing.assert_array_equal(batch["display"], [10, 11, 12])
    if fmt == "parquet":
        spec.validate(WIDE_DEEP_CONTRACT)
        frame = pd.read_parquet(out / spec.source_spec["test"][0]["files"][0])
        assert [list(v) for v in frame["topics"]] == [[1, 2, 3], []]


def test_transcode_rejects_too_many_values(multihot_csv, tmp_path, capsys):
    path = multihot_csv / "test" / "a.csv"
    path.write_text("4,1|2|3,0.5\n0,5|6|7|8,1.25\n9,7,2.0\n")
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--output_format", "parquet", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'topics'" in err and "row 1" in err and "[3]" in err and "test/a.csv" in err
    assert not (tmp_path / "o").exists()


def test_transcode_output_follows_the_channels_and_keeps_every_feature(multihot_csv,
                                                                       tmp_path):
    """No --output_format: Wide & Deep channels give parquet holding every feature (split
    binary used to be written, silently without the one-hot and multi-hot features)."""
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--quiet"]) == 0
    spec = FeatureSpec.from_yaml(str(tmp_path / "o" / "feature_spec.yaml"))
    chunk = spec.source_spec["train"][0]
    assert chunk["type"] == "parquet"
    assert sorted(chunk["features"]) == sorted(CSV_SPEC["feature_spec"])
    frame = pd.read_parquet(tmp_path / "o" / chunk["files"][0])
    assert frame.shape == (3, 5) and frame["ad"].tolist() == [4, 0, 9]


def test_transcode_split_binary_refuses_what_it_cannot_hold(multihot_csv, tmp_path, capsys):
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--output_format", "split_binary", "--quiet"]) == 2
    err = capsys.readouterr().err
    for lost in ("'ad' (onehot_categorical)", "'topics' (multihot_categorical)",
                 "'display' (map)"):
        assert lost in err and "split_binary" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    dlrm = dict(CSV_SPEC, channel_spec={"categorical": ["ad", "topics", "display"],
                                        "numerical": ["views"], "label": ["clicked"]})
    (multihot_csv / "feature_spec.yaml").write_text(yaml.safe_dump(dlrm))
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "feature 'topics' of channel 'categorical'" in err and "dimensions [3]" in err


def test_transcode_needs_a_format_for_channels_of_no_family(multihot_csv, tmp_path, capsys):
    mixed = dict(CSV_SPEC, channel_spec={"categorical": ["ad", "display"], "numerical": ["views"],
                                         "multihot_categorical": ["topics"],
                                         "label": ["clicked"]})
    (multihot_csv / "feature_spec.yaml").write_text(yaml.safe_dump(mixed))
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no model family" in err and "--output_format" in err
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--output_format", "parquet", "--quiet"]) == 0


def test_transcode_refuses_to_narrow_float64(multihot_csv, tmp_path, capsys):
    spec = yaml.safe_load((multihot_csv / "feature_spec.yaml").read_text())
    spec["feature_spec"]["views"]["dtype"] = "float64"
    (multihot_csv / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "o"),
                           "--output_format", "tfrecord", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "feature 'views'" in err and "float64" in err and "tfrecord" in err
    assert transcode.main(["--input", str(multihot_csv), "--output", str(tmp_path / "p"),
                           "--quiet"]) == 0
    frame = pd.read_parquet(tmp_path / "p" / "train" / "part_00000.parquet")
    assert frame["views"].dtype == np.float64


def test_gen_csv_writes_sequences_for_transcode(tmp_path):
    spec = sim_spec(length=6)
    spec.source_spec = {m: [{"type": "tfrecord", "features": list(spec.feature_spec),
                             "files": [f"{m}/x.tfrecord"]}] for m in ("train", "test")}
    spec.to_yaml(str(tmp_path / "in.yaml"))
    assert gen_csv.main(["--feature_spec_in", str(tmp_path / "in.yaml"), "--output",
                         str(tmp_path / "csv"), "--size", "40", "--seed", "3"]) == 0
    frame = pd.read_csv(tmp_path / "csv" / "train" / "x.csv", header=None, dtype=str,
                        keep_default_na=False)
    lengths = frame[3].map(lambda s: len(s.split("|")) if s else 0)
    assert lengths.max() <= 6 and lengths.min() >= 0 and lengths.nunique() > 1
    # no --output_format: SIM's channels give TFRecord
    assert transcode.main(["--input", str(tmp_path / "csv"), "--output", str(tmp_path / "tf"),
                           "--quiet"]) == 0
    out = FeatureSpec.from_yaml(str(tmp_path / "tf" / "feature_spec.yaml")).validate(SIM_CONTRACT)
    assert {c["type"] for c in out.source_spec["train"]} == {"tfrecord"}
    batch = open_reader(out, "train", 40).get(0)
    np.testing.assert_array_equal(batch["pos_item__length"], lengths.to_numpy())
    first = [int(v) for v in frame[3][0].split("|")] if frame[3][0] else []
    np.testing.assert_array_equal(batch["pos_item"][0][:len(first)], first)


# ---- contracts: one-line errors naming the culprit --------------------------------------
def _wd_dict():
    spec = wd_spec()
    spec.source_spec = {m: [{"type": "parquet", "features": list(spec.feature_spec),
                             "files": [f"{m}/p.parquet"]}] for m in ("train", "test")}
    return spec.to_dict()


def _sim_dict():
    spec = sim_spec()
    spec.source_spec = {m: [{"type": "tfrecord", "features": list(spec.feature_spec),
                             "files": [f"{m}/p.tfrecord"]}] for m in ("train", "test")}
    return spec.to_dict()


def _edit(path, value=None, delete=False):
    def mutate(d):
        node = d
        for key in path[:-1]:
            node = node[key]
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


def _drop_from_train(feature):
    def mutate(d):
        d["source_spec"]["train"][0]["features"].remove(feature)
    return mutate


WD, SIM = WIDE_DEEP_CONTRACT, SIM_CONTRACT
BAD_CONTRACT_SPECS = [
    ("dims-not-list", WD, _edit(["feature_spec", "topics", "dimensions"], 3), ["'topics'", "3"]),
    ("dims-zero", WD, _edit(["feature_spec", "topics", "dimensions"], [0]), ["'topics'", "[0]"]),
    ("dims-two", WD, _edit(["feature_spec", "topics", "dimensions"], [2, 3]),
     ["'topics'", "[2, 3]"]),
    ("dims-text", WD, _edit(["feature_spec", "topics", "dimensions"], ["x"]), ["'topics'", "'x'"]),
    ("wd-tfrecord-chunk", WD, _edit(["source_spec", "train", 0, "type"], "tfrecord"),
     ["'train'", "Wide & Deep", "'tfrecord'", "parquet"]),
    ("wd-unknown-chunk", WD, _edit(["source_spec", "test", 0, "type"], "orc"),
     ["'test'", "'orc'"]),
    ("sim-parquet-chunk", SIM, _edit(["source_spec", "test", 0, "type"], "parquet"),
     ["'test'", "SIM", "'parquet'", "tfrecord"]),
    ("wd-no-label", WD, _edit(["channel_spec", "label"], delete=True), ["label", "missing"]),
    ("wd-two-map", WD, lambda d: (d["feature_spec"].update(page={"dtype": "int64"}),
                                  d["channel_spec"].update(map=["display", "page"])),
     ["'map'", "at most 1", "page"]),
    ("wd-multihot-no-dims", WD, _edit(["feature_spec", "topics", "dimensions"], delete=True),
     ["'topics'", "multihot_categorical", "dimensions"]),
    ("wd-onehot-with-dims", WD, _edit(["feature_spec", "ad", "dimensions"], [2]),
     ["'ad'", "onehot_categorical", "[2]"]),
    ("wd-float-onehot", WD, _edit(["feature_spec", "ad", "dtype"], "float32"),
     ["'ad'", "float32"]),
    ("wd-map-float", WD, _edit(["feature_spec", "display", "dtype"], "float32"),
     ["'display'", "float32"]),
    ("wd-unknown-channel", WD, _edit(["channel_spec", "dense"], ["views"]), ["dense"]),
    ("wd-nothing-to-learn", WD, lambda d: d["channel_spec"].update(
        onehot_categorical=[], multihot_categorical=[], numerical=[]), ["no features"]),
    ("wd-map-missing-in-test", WD, lambda d: d["source_spec"]["test"][0]["features"].remove(
        "display"), ["'test'", "'display'", "lacks"]),
    ("wd-label-missing-in-train", WD, _drop_from_train("clicked"), ["'train'", "'clicked'"]),
    ("sim-counts-differ", SIM, _edit(["channel_spec", "negative_history"], ["neg_item"]),
     ["'negative_history'", "1", "'target_item_features'", "2"]),
    ("sim-cardinality-differs", SIM, _edit(["feature_spec", "pos_cat", "cardinality"], 41),
     ["'pos_cat'", "41", "'cat'", "40"]),
    ("sim-lengths-differ", SIM, _edit(["feature_spec", "neg_cat", "dimensions"], [90]),
     ["neg_cat", "90", "100"]),
    ("sim-history-no-dims", SIM, _edit(["feature_spec", "pos_item", "dimensions"], delete=True),
     ["'pos_item'", "positive_history", "dimensions"]),
    ("sim-no-negative-channel", SIM, _edit(["channel_spec", "negative_history"], delete=True),
     ["negative_history", "missing"]),
    ("sim-user-with-dims", SIM, _edit(["feature_spec", "uid", "dimensions"], [4]),
     ["'uid'", "user_features"]),
    ("sim-no-target", SIM, _edit(["channel_spec", "target_item_features"], []),
     ["'target_item_features'", "at least 1"]),
]


@pytest.mark.parametrize("name,contract,mutate,expected", BAD_CONTRACT_SPECS,
                         ids=[c[0] for c in BAD_CONTRACT_SPECS])
def test_bad_contract_spec_names_culprit(name, contract, mutate, expected):
    d = _sim_dict() if contract is SIM else _wd_dict()
    mutate(d)
    with pytest.raises(FeatureSpecError) as info:
        FeatureSpec(**d).validate(contract)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{name}: {part!r} not in {message!r}"


def test_contract_base_specs_are_valid_and_map_is_test_only():
    FeatureSpec(**_wd_dict()).validate(WD)
    FeatureSpec(**_sim_dict()).validate(SIM)
    d = _wd_dict()
    d["source_spec"]["train"][0]["features"].remove("display")
    FeatureSpec(**d).validate(WD)  # the display id is needed for MAP@12 on test data only
    with pytest.raises(FeatureSpecError, match="unknown channel.*for DLRM"):
        FeatureSpec(**copy.deepcopy(d)).validate(DLRM_CONTRACT)
