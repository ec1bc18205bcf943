"""Wide & Deep on data laid out as NVIDIA's Wide & Deep tools lay it out (its transcode.py:
flat <mapping>_<k>.parquet files, int64 ids, float64 numericals, multi-hot ids as
list<double>; its specs: no dtypes, `max_hotness`, all five channels listed, some empty):
every shape the contract accepts trains and learns a planted signal, and the flags NVIDIA's
scripts pass are accepted."""
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from core.dllog import read_log
from wide_and_deep.main import main, parse_args

CARD, HOT = 12, 3
FAST = ["--cpu", "--global_batch_size", "256", "--eval_batch_size", "512",
        "--deep_hidden_units", "8", "--deep_learning_rate", "0.003", "--deep_warmup_epochs", "0",
        "--linear_learning_rate", "0.2", "--disable_map_calculation", "--num_epochs", "3"]


def reference_layout(root, onehot, multihot, numerical, rows=(2400, 800), seed=0):
    """Write the dataset; the label is planted in feature 0 of every kind present (id parity,
    first multi-hot id parity, sign of the numerical value), so AUC well above 0.5 means the
    model reads those features."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = {}
    for mapping, n in zip(("train", "test"), rows):
        frame, score = {}, np.zeros(n)
        for i, name in enumerate(onehot):
            frame[name] = rng.integers(0, CARD, n)  # int64, as pandas keeps the CSV's ints
            score += (frame[name] % 2) * 2.0 if i == 0 else 0
        for i, name in enumerate(multihot):
            ids = rng.integers(0, CARD, (n, HOT)).astype(np.float64)
            frame[name] = list(ids)
            score += (ids[:, 0] % 2) * 2.0 if i == 0 else 0
        for i, name in enumerate(numerical):
            frame[name] = rng.standard_normal(n)  # float64
            score += 2.0 * frame[name] if i == 0 else 0
        frame["clicked"] = (score + rng.standard_normal(n) * 0.3 > np.median(score)).astype(
            np.int64)
        table = pa.Table.from_pandas(pd.DataFrame(frame), preserve_index=False)
        files[mapping] = []
        for k, start in enumerate(range(0, n, 600)):  # several partitions, as its chunk_size
            name = f"{mapping}_{k}.parquet"
            pq.write_table(table.slice(start, 600), os.path.join(root, name))
            files[mapping].append(name)
    features = list(onehot) + list(multihot) + list(numerical) + ["clicked"]
    spec = {"channel_spec": {"label": ["clicked"], "map": [],
                             "multihot_categorical": list(multihot),
                             "numerical": list(numerical),
                             "onehot_categorical": list(onehot)},
            "feature_spec": {**{n: {"cardinality": CARD} for n in onehot},
                             **{n: {"cardinality": CARD, "max_hotness": HOT} for n in multihot},
                             **{n: {} for n in numerical}, "clicked": {}},
            "metadata": {},
            "source_spec": {m: [{"features": features, "files": f, "type": "parquet"}]
                            for m, f in files.items()}}
    with open(os.path.join(root, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(spec, f)
    return str(root)


def final_metrics(out):
    log = read_log(os.path.join(out, "log.json"))
    return [r for r in log if r["type"] == "LOG" and r["step"] == []][-1]["data"]


SHAPES = {"full": (["ad", "doc"], ["topics"], ["ctr", "count"]),
          "numerical_only": ([], [], ["ctr", "count"]),
          "categorical_only": (["ad", "doc"], ["topics"], []),
          "no_multihot": (["ad", "doc"], [], ["ctr"]),
          "no_onehot": ([], ["topics", "entities"], ["ctr"])}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_accepted_shape_trains_on_the_reference_layout(shape, tmp_path):
    data = reference_layout(tmp_path / "data", *SHAPES[shape])
    out = str(tmp_path / "out")
    assert main(["--dataset_path", data, "--model_dir", os.path.join(out, "m"),
                 "--results_dir", out, "--num_auc_thresholds", "8000",
                 "--affinity", "unique_interleaved"] + FAST) == 0
    assert final_metrics(out)["auc"] > 0.75


def test_wide_part_alone_learns_numerical_features(tmp_path):
    """NVIDIA's wide part is linear in the numerical features too: with the deep part's rate
    at 0 a numerical-only spec still learns its planted signal."""
    data = reference_layout(tmp_path / "data", [], [], ["ctr"])
    out = str(tmp_path / "out")
    args = [a if a != "0.003" else "0" for a in FAST]
    assert main(["--dataset_path", data, "--model_dir", os.path.join(out, "m"),
                 "--results_dir", out] + args) == 0
    assert final_metrics(out)["auc"] > 0.8


def test_map_enabled_without_a_map_feature_warns(tmp_path, capsys):
    data = reference_layout(tmp_path / "data", ["ad"], [], ["ctr"], rows=(300, 200))
    out = str(tmp_path / "out")
    args = [a for a in FAST if a != "--disable_map_calculation"]
    assert main(["--dataset_path", data, "--model_dir", os.path.join(out, "m"),
                 "--results_dir", out] + args[:-1] + ["1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "map" in line.lower()]
    assert any(line.startswith("warning:") and "--disable_map_calculation" in line
               for line in lines)
    assert "map12" not in final_metrics(out)


def test_float_ids_must_be_whole(tmp_path, capsys):
    data = reference_layout(tmp_path / "data", [], ["topics"], ["ctr"], rows=(300, 200))
    frame = pd.read_parquet(os.path.join(data, "test_0.parquet"))
    frame.at[3, "topics"] = np.array([1.0, 2.5, 3.0])
    frame.to_parquet(os.path.join(data, "test_0.parquet"), index=False)
    out = str(tmp_path / "out")
    assert main(["--dataset_path", data, "--model_dir", os.path.join(out, "m"),
                 "--results_dir", out] + FAST[:-1] + ["1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "'topics'" in err and "2.5" in err
    assert "test_0.parquet" in err and len(err.splitlines()) == 1


def test_help_shows_defaults_and_reference_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--num_auc_thresholds", "8000"), ("--affinity", "unique_interleaved"),
                          ("--deep_learning_rate", "0.00012"), ("--num_epochs", "20")):
        assert flag in text and f"(default: {default})" in text
