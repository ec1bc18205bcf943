"""FeatureSpec: validation (one-line errors naming the culprit), yaml round trip, generators."""
import copy
import os

import numpy as np
import pytest
import yaml

from dlrm_contract import CRITEO_CARDINALITIES, CRITEO_VARIANTS, DLRM_CONTRACT, criteo_variant
from core.feature_spec import FeatureSpec, FeatureSpecError, narrowest_int_dtype
from core.files import atomic_write_text


def base_dict():
    """A small valid spec: 2 numerical, 2 categorical, label; train and test."""
    return FeatureSpec.get_default(2, [100, 40000], label_dtype="bool").to_dict()


def chunk_of(d, mapping, feature):
    return next(c for c in d["source_spec"][mapping] if feature in c["features"])


def _set(path, value):
    def mutate(d):
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


def _del(path):
    def mutate(d):
        node = d
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return mutate


def _merge_categoricals(d):
    train = d["source_spec"]["train"]
    c0, c1 = chunk_of(d, "train", "cat_0"), chunk_of(d, "train", "cat_1")
    c0["features"] = ["cat_0", "cat_1"]
    train.remove(c1)


def _split_numerical(d):
    train = d["source_spec"]["train"]
    num = chunk_of(d, "train", "num_0")
    num["features"] = ["num_0"]
    train.append({"type": "split_binary", "features": ["num_1"], "files": ["train/num1.bin"]})


def _swap_numerical(d):
    chunk_of(d, "test", "num_0")["features"] = ["num_1", "num_0"]


def _label_with_cat(d):
    train = d["source_spec"]["train"]
    chunk_of(d, "train", "label")["features"] = ["label", "cat_0"]
    train.remove([c for c in train if c["features"] == ["cat_0"]][0])


def _two_labels(d):
    d["feature_spec"]["label2"] = {"dtype": "bool"}
    d["channel_spec"]["label"] = ["label", "label2"]


def _ghost_in_channel(d):
    d["channel_spec"]["categorical"].append("ghost")


def _feature_in_two_channels(d):
    d["channel_spec"]["numerical"].append("cat_1")


def _mapping_lacks(d):
    d["source_spec"]["test"] = [c for c in d["source_spec"]["test"] if c["features"] != ["cat_1"]]


def _feature_twice_in_mapping(d):
    d["source_spec"]["train"].append({"type": "split_binary", "features": ["cat_0"],
                                      "files": ["train/cat_0_again.bin"]})


def _stray_feature(d):
    d["feature_spec"]["stray"] = {"dtype": "int32", "cardinality": 5}
    d["source_spec"]["train"].append({"type": "split_binary", "features": ["stray"],
                                      "files": ["train/stray.bin"]})


def _shared_file(d):
    chunk_of(d, "train", "cat_1")["files"] = list(chunk_of(d, "train", "cat_0")["files"])


def _mixed_numerical(d):
    d["feature_spec"]["num_1"]["dtype"] = "float32"


# (id, mutation, substrings the message must contain)
BAD_SPECS = [
    ("no-test-mapping", _del(["source_spec", "test"]), ["'test'", "required"]),
    ("no-train-mapping", _del(["source_spec", "train"]), ["'train'", "required"]),
    ("unknown-mapping", _set(["source_spec", "dev"], []), ["'dev'"]),
    ("empty-mapping", _set(["source_spec", "test"], []), ["'test'", "non-empty"]),
    ("csv-chunk", lambda d: chunk_of(d, "train", "cat_1").update(type="csv"),
     ["'train'", "chunk", "split_binary", "'csv'"]),
    ("two-files", lambda d: chunk_of(d, "test", "label").update(files=["a.bin", "b.bin"]),
     ["'test'", "one file", "a.bin"]),
    ("no-files", lambda d: chunk_of(d, "train", "cat_0").pop("files"), ["'train'", "one file"]),
    ("shared-file", _shared_file, ["train/cat_0.bin", "already used"]),
    ("cat-float-dtype", _set(["feature_spec", "cat_0", "dtype"], "float32"),
     ["'cat_0'", "float32", "int8"]),
    ("cat-unsigned-dtype", _set(["feature_spec", "cat_1", "dtype"], "uint16"),
     ["'cat_1'", "uint16"]),
    ("cat-no-cardinality", _del(["feature_spec", "cat_0", "cardinality"]),
     ["'cat_0'", "cardinality", "None"]),
    ("cat-auto-cardinality", _set(["feature_spec", "cat_1", "cardinality"], "auto"),
     ["'cat_1'", "'auto'"]),
    ("cat-float-cardinality", _set(["feature_spec", "cat_0", "cardinality"], 10.5),
     ["'cat_0'", "10.5"]),
    ("cat-zero-cardinality", _set(["feature_spec", "cat_0", "cardinality"], 0),
     ["'cat_0'", "positive"]),
    ("cat-cardinality-overflows-dtype", _set(["feature_spec", "cat_0", "cardinality"], 1000),
     ["'cat_0'", "1000", "int8"]),
    ("two-cats-one-chunk", _merge_categoricals, ["'train'", "alone", "cat_1"]),
    ("numerical-split", _split_numerical, ["'train'", "num_1", "one chunk"]),
    ("numerical-order", _swap_numerical, ["'test'", "channel order", "['num_1', 'num_0']"]),
    ("numerical-float64", _set(["feature_spec", "num_0", "dtype"], "float64"),
     ["'num_0'", "float64", "float16"]),
    ("numerical-mixed-dtypes", _mixed_numerical, ["float32", "share one dtype", "num_1"]),
    ("label-float", _set(["feature_spec", "label", "dtype"], "float32"),
     ["'label'", "float32", "bool"]),
    ("label-not-alone", _label_with_cat, ["'train'", "label", "cat_0"]),
    ("two-labels", _two_labels, ["exactly one", "label2"]),
    ("extra-channel", _set(["channel_spec", "dense"], []), ["dense", "categorical"]),
    ("missing-channel", _del(["channel_spec", "numerical"]), ["channels", "numerical"]),
    ("ghost-feature", _ghost_in_channel, ["'ghost'", "not described"]),
    ("feature-in-two-channels", _feature_in_two_channels, ["'cat_1'", "twice", "numerical"]),
    ("mapping-lacks-feature", _mapping_lacks, ["'test'", "'cat_1'", "lacks"]),
    ("feature-twice-in-mapping", _feature_twice_in_mapping, ["'cat_0'", "twice", "'train'"]),
    ("feature-in-no-channel", _stray_feature, ["stray", "no channel"]),
    ("unknown-dtype", _set(["feature_spec", "num_1", "dtype"], "floaty"), ["'num_1'", "floaty"]),
    ("missing-dtype", _del(["feature_spec", "num_0", "dtype"]), ["'num_0'", "dtype"]),
    ("channel-not-list", _set(["channel_spec", "label"], "label"), ["'label'", "list"]),
    ("empty-file-name", lambda d: chunk_of(d, "train", "label").update(files=[""]),
     ["'train'", "file name"]),
    ("metadata-not-mapping", _set(["metadata"], ["x"]), ["metadata", "list"]),
]


def test_base_spec_is_valid():
    FeatureSpec(**base_dict()).validate(DLRM_CONTRACT)


def test_bad_spec_cases_are_distinct():
    assert len(BAD_SPECS) >= 20
    assert len({case[0] for case in BAD_SPECS}) == len(BAD_SPECS)
    mutated = []
    for _, mutate, _ in BAD_SPECS:
        d = base_dict()
        mutate(d)
        mutated.append(yaml.safe_dump(d, sort_keys=True))
    assert len(set(mutated)) == len(mutated)


@pytest.mark.parametrize("name,mutate,expected", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_names_culprit(name, mutate, expected):
    d = base_dict()
    mutate(d)
    with pytest.raises(FeatureSpecError) as info:
        FeatureSpec(**d).validate(DLRM_CONTRACT)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{name}: {part!r} not in {message!r}"


def test_float32_numerical_and_int8_label_accepted():
    d = base_dict()
    for n in ("num_0", "num_1"):
        d["feature_spec"][n]["dtype"] = "float32"
    d["feature_spec"]["label"]["dtype"] = "int8"
    d["source_spec"]["validation"] = copy.deepcopy(d["source_spec"]["test"])
    for c in d["source_spec"]["validation"]:
        c["files"] = [f.replace("test/", "validation/") for f in c["files"]]
    FeatureSpec(**d).validate(DLRM_CONTRACT)


def test_yaml_round_trip(tmp_path):
    spec = FeatureSpec.get_default(3, [5, 300, 70000], mappings=("train", "test", "validation"))
    spec.metadata = {"rows": {"train": np.int64(7), "test": 3, "validation": 0}, "note": "x"}
    path = tmp_path / "sub" / "feature_spec.yaml"
    spec.to_yaml(str(path))
    loaded = FeatureSpec.from_yaml(str(path)).validate(DLRM_CONTRACT)
    expected = spec.to_dict()
    expected["metadata"]["rows"]["train"] = 7
    assert loaded.to_dict() == expected
    assert loaded.base_directory == str(tmp_path / "sub")
    raw = yaml.safe_load(path.read_text())
    files = [c["files"][0] for cs in raw["source_spec"].values() for c in cs]
    assert all(not os.path.isabs(f) for f in files)
    chunk = loaded.source_spec["train"][0]
    assert loaded.chunk_path(chunk) == str(tmp_path / "sub" / chunk["files"][0])
    assert [p.name for p in path.parent.iterdir()] == ["feature_spec.yaml"]  # no temp left


@pytest.mark.parametrize("text,expected", [
    (None, "not found"),
    ("feature_spec: [unclosed", "not valid yaml"),
    ("- a list", "expected a mapping"),
    ("feature_spec: {}\nchannel_spec: {}\n", "source_spec"),
])
def test_from_yaml_errors(tmp_path, text, expected):
    path = tmp_path / "feature_spec.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(FeatureSpecError, match=expected):
        FeatureSpec.from_yaml(str(path))


def test_accessors_and_feature_files():
    spec = FeatureSpec.get_default(2, [10, 20], categorical_names=["a/b", "c"])
    spec.base_directory = "/data"
    assert spec.categorical_features == ["a/b", "c"]
    assert spec.cardinalities == [10, 20]
    files = spec.feature_files("test")
    assert files == {"numerical": "/data/test/numerical.bin", "label": "/data/test/label.bin",
                     "categorical": ["/data/test/cat_0.bin", "/data/test/cat_1.bin"]}


@pytest.mark.parametrize("card,dtype", [(1, "int8"), (128, "int8"), (129, "int16"),
                                        (32768, "int16"), (32769, "int32"),
                                        (2 ** 31, "int32"), (2 ** 31 + 1, "int64")])
def test_narrowest_int_dtype(card, dtype):
    assert narrowest_int_dtype(card) == dtype


def test_criteo_variants_match_published_tables():
    # NVIDIA DLRM_and_DCNv2 (TF2) dataloading/generate_feature_spec.py, `variants`.
    assert set(CRITEO_VARIANTS) == {"criteo_t15_synthetic", "criteo_t3_synthetic",
                                    "criteo_t0_synthetic"}
    t15, t3, t0 = (CRITEO_CARDINALITIES[t] for t in (15, 3, 0))
    assert t15[:3] == [7912889, 33823, 17139] and t15[-1] == 35
    assert t3[:3] == [45833188, 36747, 1572176] and t3[-1] == 29275261
    assert t0[:3] == [227605432, 39061, 3067956] and t0[-1] == 130229467
    assert (sum(t15), sum(t3), sum(t0)) == (32709138, 177944291, 882774575)
    for variant in CRITEO_VARIANTS:
        spec = criteo_variant(variant).validate(DLRM_CONTRACT)
        assert len(spec.numerical_features) == 13 and len(spec.categorical_features) == 26
    with pytest.raises(FeatureSpecError, match="criteo_t15_synthetic"):
        criteo_variant("criteo_t7_synthetic")


def test_atomic_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write_text(str(path), "one")
    atomic_write_text(str(path), "two")
    assert path.read_text() == "two"
    assert os.listdir(tmp_path) == ["f.txt"]


# ---- NVIDIA's Wide & Deep spelling: max_hotness, no dtypes, float64 -------------------------

def wide_deep_dict():
    """A spec as NVIDIA's Wide & Deep writes one: no dtypes, hotness as max_hotness."""
    features = ["ad", "topics", "ctr", "clicked"]
    return {"feature_spec": {"ad": {"cardinality": 9}, "topics": {"cardinality": 5,
                                                                  "max_hotness": 3},
                             "ctr": {}, "clicked": {}},
            "channel_spec": {"onehot_categorical": ["ad"], "multihot_categorical": ["topics"],
                             "numerical": ["ctr"], "label": ["clicked"], "map": []},
            "source_spec": {m: [{"type": "parquet", "features": features,
                                 "files": [f"{m}_0.parquet"]}] for m in ("train", "test")}}


def test_max_hotness_is_read_as_dimensions():
    from core.feature_spec import with_dtypes
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    spec = with_dtypes(FeatureSpec(**wide_deep_dict()), WIDE_DEEP_CONTRACT, {})
    assert spec.dimension("topics") == 3 and spec.dimension("ad") is None
    spec.validate(WIDE_DEEP_CONTRACT)
    spec.feature_spec["topics"]["dimensions"] = [3]  # both spellings, agreeing
    spec.validate(WIDE_DEEP_CONTRACT)
    spec.feature_spec["topics"]["dimensions"] = [4]
    with pytest.raises(FeatureSpecError, match=r"feature 'topics'.*\[4\].*max_hotness 3"):
        spec.validate(WIDE_DEEP_CONTRACT)
    spec.feature_spec["topics"] = {"dtype": "int32", "cardinality": 5, "max_hotness": 0}
    with pytest.raises(FeatureSpecError, match="feature 'topics'.*max_hotness must be a pos"):
        spec.validate(WIDE_DEEP_CONTRACT)


def test_missing_dtypes_come_from_the_data_else_defaults():
    """The data's own type when the channel allows it (float64 numericals, int64 ids); ids
    stored as floats (list<double>) and anything a channel refuses get the kind's default."""
    from core.feature_spec import with_dtypes
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    raw = FeatureSpec(**wide_deep_dict())
    with pytest.raises(FeatureSpecError, match="feature 'ad' needs a dtype"):
        raw.copy().validate(WIDE_DEEP_CONTRACT)
    found = {"ad": "int64", "topics": "float64", "ctr": "float64", "clicked": "int64"}
    spec = with_dtypes(raw, WIDE_DEEP_CONTRACT, found).validate(WIDE_DEEP_CONTRACT)
    assert {n: spec.feature_spec[n]["dtype"] for n in found} == \
        {"ad": "int64", "topics": "int64", "ctr": "float64", "clicked": "int64"}
    spec = with_dtypes(raw, WIDE_DEEP_CONTRACT, {}).validate(WIDE_DEEP_CONTRACT)
    assert {n: spec.feature_spec[n]["dtype"] for n in found} == \
        {"ad": "int64", "topics": "int64", "ctr": "float32", "clicked": "int8"}
    assert "dtype" not in raw.feature_spec["ad"]  # a copy: the loaded spec is untouched
    given = wide_deep_dict()
    given["feature_spec"]["ad"]["dtype"] = "int32"
    assert with_dtypes(FeatureSpec(**given), WIDE_DEEP_CONTRACT,
                       found).feature_spec["ad"]["dtype"] == "int32"
