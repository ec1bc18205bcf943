"""NVIDIA's Wide & Deep BYO path with our tools: a spec in its shape (no dtypes, `max_hotness`,
all five channels, empty `map`), CSVs as its gen_csv.py writes them (multi-hot as a quoted
list "[3, 1, 4]"), transcode.py without --output_format, gen_embedding_sizes.py; the parquet
and spec we write pass the rules of its FeatureSpec check, and hold the CSV's values."""
import json

import numpy as np
import pandas as pd
import pytest
import yaml

import gen_csv
import gen_embedding_sizes
import transcode
from core.columnar import open_reader
from core.feature_spec import FeatureSpec

ONEHOT = {"ad": 50, "doc": 7}
MULTIHOT = {"topics": (30, 3), "entities": (9, 2)}
NUMERICAL = ["ctr", "count"]
FEATURES = ["clicked", *ONEHOT, *MULTIHOT, *NUMERICAL]


def reference_spec():
    fs = {n: {"cardinality": c} for n, c in ONEHOT.items()}
    fs.update({n: {"cardinality": c, "max_hotness": h} for n, (c, h) in MULTIHOT.items()})
    fs.update({n: {} for n in NUMERICAL + ["clicked"]})
    return {"channel_spec": {"label": ["clicked"], "map": [],
                             "multihot_categorical": list(MULTIHOT), "numerical": NUMERICAL,
                             "onehot_categorical": list(ONEHOT)},
            "feature_spec": fs, "metadata": {},
            "source_spec": {"train": [{"features": FEATURES, "files": ["train.csv"],
                                       "type": "csv"}],
                            "test": [{"features": FEATURES, "files": ["valid.csv"],
                                      "type": "csv"}]}}


def reference_csv(path, rows, rng):
    """As NVIDIA's gen_csv.py writes it: a pandas frame whose multi-hot cells are Python lists
    of exactly max_hotness ids, written without header or index."""
    frame = {"clicked": rng.integers(0, 2, rows)}
    frame.update({n: rng.integers(0, c, rows) for n, c in ONEHOT.items()})
    frame.update({n: rng.integers(0, c, (rows, h)).tolist() for n, (c, h) in MULTIHOT.items()})
    frame.update({n: rng.random(rows) for n in NUMERICAL})
    pd.DataFrame(frame)[FEATURES].to_csv(path, header=False, index=False)


@pytest.fixture
def reference_csv_dir(tmp_path):
    root = tmp_path / "csv"
    root.mkdir()
    rng = np.random.default_rng(0)
    reference_csv(root / "train.csv", 70, rng)
    reference_csv(root / "valid.csv", 30, rng)
    (root / "feature_spec.yaml").write_text(yaml.safe_dump(reference_spec()))
    return root


def check_like_reference(spec: dict) -> None:
    """The rules of NVIDIA's Wide & Deep FeatureSpec.check_feature_spec (data/feature_spec.py),
    written from its description: exactly the mappings train and test, exactly its five
    channels, one label, categorical features with an int cardinality and dtype int32/int64
    when given, numerical float32/float64 when given, multi-hot with an int max_hotness, one
    parquet chunk per mapping holding every non-map feature."""
    assert sorted(spec["source_spec"]) == ["test", "train"]
    channels = spec["channel_spec"]
    assert sorted(channels) == sorted(["onehot_categorical", "multihot_categorical",
                                       "numerical", "label", "map"])
    assert len(channels["label"]) == 1 and len(channels["map"]) <= 1
    fs = spec["feature_spec"]
    for name in channels["onehot_categorical"] + channels["multihot_categorical"]:
        assert isinstance(fs[name]["cardinality"], int)
        assert fs[name].get("dtype", "int64") in ("int32", "int64"), name
    for name in channels["numerical"]:
        assert fs[name].get("dtype", "float32") in ("float32", "float64"), name
    for name in channels["multihot_categorical"]:
        assert isinstance(fs[name]["max_hotness"], int)
    for mapping in ("train", "test"):
        (chunk,) = spec["source_spec"][mapping]
        assert chunk["type"] == "parquet"
        for channel, names in channels.items():
            if channel != "map":
                assert set(names) <= set(chunk["features"])


def parse_reference_csv(path) -> pd.DataFrame:
    """An independent reading of the CSV: the multi-hot cells evaluated as lists."""
    frame = pd.read_csv(path, header=None, names=FEATURES)
    for name in MULTIHOT:
        frame[name] = frame[name].map(json.loads)
    return frame


def test_reference_csvs_transcode_to_parquet_it_accepts(reference_csv_dir, tmp_path):
    out = tmp_path / "data"
    assert transcode.main(["--input", str(reference_csv_dir), "--output", str(out),
                           "--chunk_size", "16", "--quiet"]) == 0
    spec = yaml.safe_load((out / "feature_spec.yaml").read_text())
    check_like_reference(spec)
    assert spec["feature_spec"]["topics"]["dimensions"] == [3]
    loaded = FeatureSpec.from_yaml(str(out / "feature_spec.yaml"))
    for mapping, name in (("train", "train.csv"), ("test", "valid.csv")):
        expected = parse_reference_csv(reference_csv_dir / name)
        files = loaded.source_spec[mapping][0]["files"]
        assert len(files) == -(-len(expected) // 16)  # --chunk_size rows per file
        ours = pd.concat([pd.read_parquet(out / f) for f in files], ignore_index=True)
        for column in FEATURES:
            if column in MULTIHOT:
                assert [list(v) for v in ours[column]] == expected[column].tolist()
            else:  # the CSV's values exactly (numerical kept as float64)
                np.testing.assert_array_equal(ours[column].to_numpy(),
                                              expected[column].to_numpy())
        batch = open_reader(loaded, mapping, len(expected)).get(0)
        np.testing.assert_array_equal(batch["entities__length"], 2)


def test_both_multihot_spellings_give_the_same_ids(reference_csv_dir, tmp_path):
    """'a|b|c' (ours) and "[a, b, c]" (NVIDIA's) fields, mixed in one file, read alike."""
    expected = parse_reference_csv(reference_csv_dir / "train.csv")
    lines = (reference_csv_dir / "train.csv").read_text().splitlines()
    piped = []
    for line in lines[::2]:
        head, rest = line.split(',"[', 1)
        topics, rest = rest.split(']",', 1)
        piped.append(head + "," + topics.replace(", ", "|") + "," + rest)
    (reference_csv_dir / "train.csv").write_text("\n".join(
        piped[i // 2] if i % 2 == 0 else line for i, line in enumerate(lines)) + "\n")
    out = tmp_path / "data"
    assert transcode.main(["--input", str(reference_csv_dir), "--output", str(out),
                           "--quiet"]) == 0
    frame = pd.read_parquet(out / "train")
    assert piped[0].count("|") == 2
    for name in MULTIHOT:
        assert [list(v) for v in frame[name]] == expected[name].tolist()


def test_gen_csv_writes_max_hotness_ids(tmp_path):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(reference_spec()))
    assert gen_csv.main(["--feature_spec_in", str(tmp_path / "spec.yaml"), "--output",
                         str(tmp_path / "csv"), "--size", "200"]) == 0
    assert transcode.main(["--input", str(tmp_path / "csv"), "--output",
                           str(tmp_path / "data"), "--quiet"]) == 0
    frame = pd.read_parquet(tmp_path / "data" / "train")
    lengths = frame["topics"].map(len)
    assert lengths.max() == 3 and lengths.min() >= 0 and (lengths > 1).any()
    assert max(max(v, default=0) for v in frame["topics"]) < 30


def test_gen_embedding_sizes(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(reference_spec()))
    out = tmp_path / "sizes" / "embedding_sizes.json"
    assert gen_embedding_sizes.main(["--feature_spec_in", str(tmp_path / "spec.yaml"),
                                     "--output", str(out), "--max_size", "5"]) == 0
    sizes = json.loads(out.read_text())
    assert sorted(sizes) == sorted([*ONEHOT, *MULTIHOT])
    assert all(isinstance(v, int) and 1 <= v <= 5 for v in sizes.values())
    assert gen_embedding_sizes.main(["--feature_spec_in", str(tmp_path / "nope.yaml"),
                                     "--output", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
