"""An id outside a feature's table, edited into one value of a family's data files, ends the
family's training CLI with one `error:` line naming file, feature and row (no traceback):
DLRM split-binary (ids 0..cardinality-1), Wide & Deep parquet (same) and SIM TFRecord (ids
1..cardinality, 0 = padding)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def run_cli(*args):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_dlrm_split_binary_id_out_of_range(tmp_path):
    from datasets import SplitBinaryWriter, SyntheticSource
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default(2, [50, 30])
    data = tmp_path / "data"
    with SplitBinaryWriter(str(data), spec) as writer:
        for mapping, seed in (("train", 1), ("test", 2)):
            for batch in SyntheticSource(spec, 100, 4, seed=seed):
                writer.write(mapping, *batch)
    path = data / "train" / "cat_0.bin"
    ids = np.fromfile(path, dtype=spec.dtype("cat_0"))
    assert ids.max() < 50
    ids[345] = 127  # what a user's editor puts in the int8 file of a 50-row table
    ids.tofile(path)
    line = run_cli("main.py", "--dataset_path", str(data), "--cpu", "--embedding_dim", "4",
                   "--bottom_mlp_dims", "8,4", "--top_mlp_dims", "8,1", "--batch_size", "100",
                   "--valid_batch_size", "100", "--log_path", str(tmp_path / "log.json"))
    assert f"{path} row 345" in line and "'cat_0'" in line and "id 127" in line
    assert "[0, 49]" in line


def test_wide_deep_parquet_id_out_of_range(tmp_path):
    import pandas as pd
    from wide_and_deep import generate_feature_spec, synthetic
    spec = str(tmp_path / "spec.yaml")
    assert generate_feature_spec.main(["--dst", spec, "--onehot", "40:8,30:4", "--multihot",
                                       "20:4", "--num_numerical", "2"]) == 0
    data = tmp_path / "data"
    assert synthetic.main(["--feature_spec", spec, "--dst", str(data), "--train_rows", "600",
                           "--test_rows", "200"]) == 0
    path = sorted((data / "train").glob("*.parquet"))[-1]
    frame = pd.read_parquet(path)
    frame.at[frame.index[7], "onehot_1"] = 30  # the table has rows 0..29
    frame.to_parquet(path)
    line = run_cli("-m", "wide_and_deep.main", "--dataset_path", str(data), "--cpu",
                   "--global_batch_size", "100", "--eval_batch_size", "100",
                   "--deep_hidden_units", "8", "--num_epochs", "1",
                   "--model_dir", str(tmp_path / "m"), "--results_dir", str(tmp_path / "r"))
    assert f"{path} row 7" in line and "'onehot_1'" in line and "id 30" in line


def tfrecord_with_one_value_changed(src, dst, feature, value):
    """Copy of a TFRecord file whose first record has feature[0] = value."""
    import tensorflow as tf
    with tf.io.TFRecordWriter(dst) as writer:
        for i, record in enumerate(tf.data.TFRecordDataset(src)):
            example = tf.train.Example.FromString(record.numpy())
            if i == 0:
                example.features.feature[feature].int64_list.value[0] = value
            writer.write(example.SerializeToString())


@pytest.mark.parametrize("value", [201, -1])
def test_sim_tfrecord_id_out_of_range(tmp_path, value):
    import shutil
    from sim.synthetic import write
    data = tmp_path / "data"
    write(str(data), users=60, items=200, categories=8, history_length=100, signal="long",
          seed=0)
    path = sorted((data / "train").glob("*.tfrecord"))[0]
    shutil.move(path, tmp_path / "orig.tfrecord")
    tfrecord_with_one_value_changed(str(tmp_path / "orig.tfrecord"), str(path),
                                    "item_id", value)
    line = run_cli("-m", "sim.main", "--dataset_dir", str(data), "--cpu", "--epochs", "1",
                   "--global_batch_size", "16", "--results_dir", str(tmp_path / "r"))
    assert f"{path} record 0" in line and "'item_id'" in line and f"id {value}" in line
    assert "[0, 200]" in line and "0 = padding" in line
