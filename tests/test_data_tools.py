"""The data CLIs: generate_feature_spec, transcribe, transcode, gen_csv,
gen_embedding_sizes."""
import os

import numpy as np
import pandas as pd
import pytest
import yaml

import gen_csv
import gen_embedding_sizes
import generate_feature_spec
import transcode
import transcribe
from core.sources import load_spec
from datasets import SplitBinaryReader, SyntheticSource, check_mapping_files
from dlrm_contract import CRITEO_CARDINALITIES, DLRM_CONTRACT
from core.feature_spec import FeatureSpec, FeatureSpecError

TOOLS = {
    generate_feature_spec: ["--variant", "--cardinalities", "--num_numerical", "--dst"],
    transcribe: ["--src_dataset_type", "--src_dataset_path", "--dst_dataset_path",
                 "--max_batches_train", "--max_batches_test", "--dst_dataset_type",
                 "--src_batch_size", "--seed", "--signal_strength", "--power_law_alpha",
                 "--overwrite"],
    transcode: ["--input", "--output", "--chunk_size", "--overwrite", "--output_format",
                "--feature_spec_in"],
    gen_csv: ["--feature_spec_in", "--output", "--size", "--seed"],
    gen_embedding_sizes: ["--feature_spec_in", "--output", "--max_size", "--seed"],
}


@pytest.mark.parametrize("tool", list(TOOLS), ids=lambda m: m.__name__)
def test_help_documents_every_option(tool, capsys):
    with pytest.raises(SystemExit) as info:
        tool.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in TOOLS[tool]:
        assert option in text


# ---- generate_feature_spec ---------------------------------------------------------------

@pytest.mark.parametrize("threshold", [15, 3, 0])
def test_generate_variant(tmp_path, threshold):
    dst = tmp_path / "fs.yaml"
    assert generate_feature_spec.main(["--variant", f"criteo_t{threshold}_synthetic",
                                       "--dst", str(dst)]) == 0
    spec = FeatureSpec.from_yaml(str(dst)).validate(DLRM_CONTRACT)
    assert spec.cardinalities == CRITEO_CARDINALITIES[threshold]
    assert len(spec.numerical_features) == 13
    assert spec.dtype("num_0") == np.float16 and spec.dtype("label") == bool


def test_generate_custom_shape(tmp_path, capsys):
    dst = tmp_path / "fs.yaml"
    assert generate_feature_spec.main(["--num_numerical", "2", "--cardinalities",
                                       "7,300,100000", "--dst", str(dst)]) == 0
    spec = FeatureSpec.from_yaml(str(dst)).validate(DLRM_CONTRACT)
    assert spec.cardinalities == [7, 300, 100000]
    assert [str(spec.dtype(f)) for f in spec.categorical_features] == ["int8", "int16",
                                                                       "int32"]
    assert generate_feature_spec.main(["--variant", "criteo_t15_synthetic",
                                       "--num_numerical", "4", "--dst", str(dst)]) == 2
    assert "contradicts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_feature_spec.main(["--cardinalities", "5,0", "--dst", str(dst)])


# ---- transcribe ----------------------------------------------------------------------------

def _spec_dir(tmp_path, cards="5,300,70000", num="3"):
    src = tmp_path / "src"
    generate_feature_spec.main(["--num_numerical", num, "--cardinalities", cards,
                                "--dst", str(src / "feature_spec.yaml")])
    return src


def _transcribe(src, dst, *extra):
    return transcribe.main(["--src_dataset_type", "synthetic", "--src_dataset_path", str(src),
                            "--dst_dataset_path", str(dst), "--max_batches_train", "3",
                            "--max_batches_test", "2", "--dst_dataset_type", "tf_raw",
                            "--src_batch_size", "128", "--quiet", *extra])


def _file_bytes(root):
    out = {}
    for mapping in ("train", "test"):
        for name in sorted(os.listdir(os.path.join(root, mapping))):
            with open(os.path.join(root, mapping, name), "rb") as f:
                out[f"{mapping}/{name}"] = f.read()
    return out


def test_transcribe_synthetic(tmp_path, capsys):
    src = _spec_dir(tmp_path)
    dst = tmp_path / "out"
    assert _transcribe(src, dst, "--seed", "5", "--signal_strength", "1.5",
                       "--power_law_alpha", "2") == 0
    assert "train 384 rows" in capsys.readouterr().out
    spec = load_spec(str(dst), DLRM_CONTRACT)
    assert spec.cardinalities == [5, 300, 70000]
    assert check_mapping_files(spec, "train") == 384 and check_mapping_files(spec, "test") == 256
    source = SyntheticSource(spec, 128, 5, seed=5, signal_strength=1.5, power_law_alpha=2)
    train = SplitBinaryReader(spec, "train", 128)
    test = SplitBinaryReader(spec, "test", 128)
    for i in range(3):  # train = batches 0..2
        assert np.array_equal(train.get(i)[0], source.get(i)[0])
    for i in range(2):  # test = batches 3..4: never the train rows
        n, cat, label = test.get(i)
        assert np.array_equal(n, source.get(3 + i)[0])
        assert np.array_equal(cat[2], source.get(3 + i)[1][2])
        assert np.array_equal(label, source.get(3 + i)[2])
    assert not np.array_equal(train.get(0)[0], test.get(0)[0])


def test_transcribe_adds_a_validation_split_after_the_test_batches(tmp_path):
    """--max_batches_validation 2: batches 5..6 of the source; train and test unchanged."""
    src = _spec_dir(tmp_path)
    assert _transcribe(src, tmp_path / "plain", "--seed", "5") == 0
    assert _transcribe(src, tmp_path / "val", "--seed", "5", "--max_batches_validation", "2") == 0
    assert _file_bytes(tmp_path / "plain") == _file_bytes(tmp_path / "val")  # train and test
    spec = load_spec(str(tmp_path / "val"), DLRM_CONTRACT)
    assert spec.mappings == ["train", "test", "validation"]
    source = SyntheticSource(spec, 128, 7, seed=5)
    validation = SplitBinaryReader(spec, "validation", 128)
    assert len(validation) == 2
    for i in range(2):
        n, cat, label = validation.get(i)
        assert np.array_equal(n, source.get(5 + i)[0]) and np.array_equal(label, source.get(5 + i)[2])


def test_transcribe_is_deterministic_and_refuses_non_empty(tmp_path, capsys):
    src = _spec_dir(tmp_path)
    assert _transcribe(src, tmp_path / "a", "--seed", "1") == 0
    assert _transcribe(src, tmp_path / "b", "--seed", "1") == 0
    assert _transcribe(src, tmp_path / "c", "--seed", "2") == 0
    assert _file_bytes(tmp_path / "a") == _file_bytes(tmp_path / "b")
    assert _file_bytes(tmp_path / "a") != _file_bytes(tmp_path / "c")
    capsys.readouterr()
    assert _transcribe(src, tmp_path / "a", "--seed", "2") == 2
    assert "not empty" in capsys.readouterr().err
    assert _transcribe(src, tmp_path / "a", "--seed", "2", "--overwrite") == 0
    assert _file_bytes(tmp_path / "a") == _file_bytes(tmp_path / "c")


def test_transcribe_imitates_foreign_spec(tmp_path):
    """A spec without source_spec (as other generators write) still gives the shape."""
    src = tmp_path / "src"
    src.mkdir()
    spec = {"feature_spec": {"cat_0": {"cardinality": 40000, "dtype": "int32"},
                             "cat_1": {"cardinality": 3, "dtype": "int32"},
                             "num_0": {"dtype": "float16"}, "label": {"dtype": "int8"}},
            "channel_spec": {"categorical": ["cat_0", "cat_1"], "numerical": ["num_0"],
                             "label": ["label"]},
            "source_spec": None}
    (src / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    assert _transcribe(src, tmp_path / "out") == 0
    out = load_spec(str(tmp_path / "out"), DLRM_CONTRACT)
    assert out.cardinalities == [40000, 3]
    assert [str(out.dtype(f)) for f in out.categorical_features] == ["int32", "int32"]
    assert str(out.dtype("label")) == "int8"


def test_transcribe_copies_split_binary(tmp_path):
    src = _spec_dir(tmp_path)
    assert _transcribe(src, tmp_path / "big") == 0
    assert transcribe.main(["--src_dataset_type", "tf_raw", "--src_dataset_path",
                            str(tmp_path / "big"), "--dst_dataset_path", str(tmp_path / "small"),
                            "--max_batches_train", "2", "--src_batch_size", "100",
                            "--quiet"]) == 0
    big = load_spec(str(tmp_path / "big"), DLRM_CONTRACT)
    small = load_spec(str(tmp_path / "small"), DLRM_CONTRACT)
    assert small.metadata["rows"] == {"train": 200, "test": 256}
    a = SplitBinaryReader(big, "train", 200).get(0)
    b = SplitBinaryReader(small, "train", 200).get(0)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1][1], b[1][1])


def test_transcribe_needs_batch_counts(tmp_path, capsys):
    src = _spec_dir(tmp_path)
    assert transcribe.main(["--src_dataset_path", str(src), "--dst_dataset_path",
                            str(tmp_path / "o")]) == 2
    assert "--max_batches_train" in capsys.readouterr().err


# ---- gen_csv + transcode -------------------------------------------------------------------

CSV_SPEC = """
channel_spec:
  categorical: [c_a, c_b, c_c, c_d]
  numerical: &num [n_0, n_1, n_2]
  label: [click]
feature_spec:
  c_a: {cardinality: 10}
  c_b: {cardinality: 40000}
  c_c: {cardinality: auto}
  c_d: {}
  click: {}
  n_0: {}
  n_1: {}
  n_2: {}
metadata: {}
source_spec:
  train:
  - {type: csv, features: *num, files: [train/numerical.csv]}
  - {type: csv, features: [click, c_d], files: [train/l0.csv, train/l1.csv, train/l2.csv]}
  - {type: csv, features: [c_a, c_b, c_c], files: [train/c0.csv, train/c1.csv]}
  test:
  - {type: csv, features: [c_c, n_0, n_1, n_2, click, c_a, c_b, c_d], files: [test/all.csv]}
  validation:
  - {type: csv, features: [n_0, n_1, n_2, click, c_a, c_b, c_c, c_d], files: [v/a.csv, v/b.csv]}
"""


def _read_csv_mapping(root, spec_dict, mapping):
    """The CSV values of one mapping, read independently of transcode.py."""
    columns = {}
    for chunk in spec_dict["source_spec"][mapping]:
        frames = [pd.read_csv(os.path.join(root, f), header=None) for f in chunk["files"]]
        frame = pd.concat(frames, ignore_index=True)
        for j, name in enumerate(chunk["features"]):
            columns[name] = frame[j].to_numpy()
    return columns


@pytest.fixture
def csv_dataset(tmp_path):
    spec_in = tmp_path / "small_csv.yaml"
    spec_in.write_text(CSV_SPEC)
    out = tmp_path / "csv"
    assert gen_csv.main(["--feature_spec_in", str(spec_in), "--output", str(out),
                         "--size", "2500", "--seed", "3", "--auto_cardinality", "77"]) == 0
    return out


def test_gen_csv_writes_described_files(csv_dataset):
    spec = yaml.safe_load((csv_dataset / "feature_spec.yaml").read_text())
    assert spec["feature_spec"]["c_c"]["cardinality"] == "auto"
    assert all(c["type"] == "csv" for cs in spec["source_spec"].values() for c in cs)
    values = _read_csv_mapping(csv_dataset, spec, "train")
    assert set(np.unique(values["click"])) == {0, 1}  # real 0/1 labels, both present
    assert values["c_a"].max() < 10 and values["c_c"].max() < 77
    assert all(len(v) == 2500 for v in values.values())
    rows = [len(pd.read_csv(csv_dataset / f"train/l{i}.csv", header=None)) for i in range(3)]
    assert sum(rows) == 2500 and max(rows) - min(rows) <= 1


@pytest.mark.parametrize("chunk_size", [700, 100000])
def test_transcode_round_trip(csv_dataset, tmp_path, chunk_size):
    out = tmp_path / "bin"
    assert transcode.main(["--input", str(csv_dataset), "--output", str(out),
                           "--chunk_size", str(chunk_size), "--quiet"]) == 0
    spec_in = yaml.safe_load((csv_dataset / "feature_spec.yaml").read_text())
    spec = load_spec(str(out), DLRM_CONTRACT)
    assert spec.mappings == ["train", "test", "validation"]
    assert spec.categorical_features == ["c_a", "c_b", "c_c", "c_d"]
    assert spec.numerical_features == ["n_0", "n_1", "n_2"] and spec.label_feature == "click"
    expected = {m: _read_csv_mapping(csv_dataset, spec_in, m) for m in spec.mappings}
    inferred = {name: max(int(expected[m][name].max()) for m in spec.mappings) + 1
                for name in ("c_c", "c_d")}
    assert spec.cardinalities == [10, 40000, inferred["c_c"], inferred["c_d"]]
    assert [str(spec.dtype(f)) for f in spec.categorical_features] == \
        ["int8", "int32", "int8", "int16" if inferred["c_d"] > 128 else "int8"]
    for mapping in spec.mappings:
        reader = SplitBinaryReader(spec, mapping, 1000)
        batches = [reader.get(i) for i in range(len(reader))]
        numerical = np.concatenate([b[0] for b in batches])
        label = np.concatenate([b[2] for b in batches])
        want = expected[mapping]
        assert numerical.dtype == np.float16
        assert np.array_equal(numerical, np.column_stack(
            [want[f].astype(np.float64) for f in spec.numerical_features]).astype(np.float16))
        assert np.array_equal(label, want["click"].astype(bool))
        for t, name in enumerate(spec.categorical_features):
            assert np.array_equal(np.concatenate([b[1][t] for b in batches]), want[name])


def test_transcode_refuses_non_empty_output(csv_dataset, tmp_path, capsys):
    out = tmp_path / "bin"
    out.mkdir()
    (out / "x").write_text("keep")
    assert transcode.main(["--input", str(csv_dataset), "--output", str(out), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "x").read_text() == "keep"
    assert transcode.main(["--input", str(csv_dataset), "--output", str(out), "--quiet",
                           "--overwrite"]) == 0
    assert not (out / "x").exists()
    assert check_mapping_files(load_spec(str(out), DLRM_CONTRACT), "test") == 2500


def _edit_csv(path, edit):
    lines = path.read_text().splitlines()
    edit(lines)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("damage,culprit", [
    ("label_two", "l1.csv"), ("id_over_cardinality", "c0.csv"), ("extra_column", "c0.csv"),
    ("missing_value", "numerical.csv"), ("row_count", "mapping 'train'"),
    ("text_in_int", "c1.csv")])
def test_transcode_errors_name_the_culprit(csv_dataset, tmp_path, capsys, damage, culprit):
    train = csv_dataset / "train"
    if damage == "label_two":
        _edit_csv(train / "l1.csv", lambda ls: ls.__setitem__(3, "2," + ls[3].split(",")[1]))
    elif damage == "id_over_cardinality":
        _edit_csv(train / "c0.csv", lambda ls: ls.__setitem__(5, "10," + ls[5].split(",", 1)[1]))
    elif damage == "extra_column":
        _edit_csv(train / "c0.csv", lambda ls: ls.__setitem__(0, ls[0] + ",1"))
    elif damage == "missing_value":
        _edit_csv(train / "numerical.csv", lambda ls: ls.__setitem__(7, ",1.0,2.0"))
    elif damage == "row_count":
        _edit_csv(train / "l2.csv", lambda ls: ls.pop())
    else:
        _edit_csv(train / "c1.csv", lambda ls: ls.__setitem__(2, "1,abc,3"))
    assert transcode.main(["--input", str(csv_dataset), "--output", str(tmp_path / "bin"),
                           "--quiet"]) == 2
    err = capsys.readouterr().err
    assert culprit in err and err.count("\n") == 1
    assert not (tmp_path / "bin").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".bin")]


def test_csv_spec_errors(tmp_path):
    bad = yaml.safe_load(CSV_SPEC)
    bad["source_spec"]["test"][0]["features"].remove("c_b")
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(FeatureSpecError, match="'test'.*c_b"):
        transcode.load_csv_spec(str(path))
    bad = yaml.safe_load(CSV_SPEC)
    bad["feature_spec"]["c_a"]["cardinality"] = "many"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(FeatureSpecError, match="c_a.*'many'"):
        transcode.load_csv_spec(str(path))


def test_gen_csv_from_split_binary_spec(tmp_path):
    generate_feature_spec.main(["--num_numerical", "2", "--cardinalities", "4,9",
                                "--dst", str(tmp_path / "fs.yaml")])
    assert gen_csv.main(["--feature_spec_in", str(tmp_path / "fs.yaml"), "--output",
                         str(tmp_path / "csv"), "--size", "50"]) == 0
    assert (tmp_path / "csv" / "train" / "cat_1.csv").exists()
    assert transcode.main(["--input", str(tmp_path / "csv"), "--output",
                           str(tmp_path / "bin"), "--quiet"]) == 0
    assert load_spec(str(tmp_path / "bin"), DLRM_CONTRACT).cardinalities == [4, 9]
