"""Wide & Deep end to end through `python -m wide_and_deep.main`: the planted signal is
learned and the null one is not, resume equals an uninterrupted run, 2 Horovod processes
equal 1, and bad inputs give one-line errors."""
import glob
import os
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip
from core.dllog import read_log
from wide_and_deep import generate_feature_spec, synthetic
from wide_and_deep.main import main

SHAPE = ["--onehot", "40:8,30:4,25:4", "--multihot", "20:4", "--num_numerical", "3"]
FAST = ["--cpu", "--global_batch_size", "256", "--eval_batch_size", "512",
        "--deep_hidden_units", "16", "16", "--deep_learning_rate", "0.003",
        "--deep_warmup_epochs", "0.5", "--linear_learning_rate", "0.05", "--print_freq", "5"]


def make_dataset(root, name, strength, train_rows=3000, test_rows=1000, seed=0):
    spec = os.path.join(root, "spec.yaml")
    if not os.path.exists(spec):
        assert generate_feature_spec.main(["--dst", spec] + SHAPE) == 0
    dst = os.path.join(root, name)
    assert synthetic.main(["--feature_spec", spec, "--dst", dst, "--train_rows", str(train_rows),
                           "--test_rows", str(test_rows), "--signal_strength", str(strength),
                           "--seed", str(seed)]) == 0
    return dst


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("wd"))
    return {"root": root, "planted": make_dataset(root, "planted", 3.0),
            "null": make_dataset(root, "null", 0.0)}


def train(dataset, out, *extra):
    args = ["--dataset_path", dataset, "--model_dir", os.path.join(out, "model"),
            "--results_dir", out] + FAST + list(extra)
    assert main(args) == 0
    return read_log(os.path.join(out, "log.json"))


def epoch_records(log):
    return [r["data"] for r in log if r["type"] == "LOG" and len(r["step"]) == 2
            and "map12" in r["data"]]


def random_ranking_map(dataset):
    """Expected MAP@12 of a random order: a one-click display of m rows gets H_m / m."""
    display = pd.read_parquet(os.path.join(dataset, "test"))["display_id"]
    sizes = display.value_counts().to_numpy()
    return float(np.mean([sum(1 / r for r in range(1, m + 1)) / m for m in sizes]))


def test_synthetic_displays_have_2_to_12_rows_and_one_click(data):
    test = pd.read_parquet(os.path.join(data["planted"], "test"))
    per_display = test.groupby("display_id")["clicked"].agg(["size", "sum"])
    assert per_display["size"].between(2, 12).all() and (per_display["sum"] == 1).all()
    assert len(test) == 1000


def test_planted_signal_is_learned_and_null_signal_is_not(data, tmp_path):
    planted = train(data["planted"], str(tmp_path / "p"), "--num_epochs", "2")
    null = train(data["null"], str(tmp_path / "n"), "--num_epochs", "2")
    final = [r for r in planted if r["type"] == "LOG" and r["step"] == []][-1]["data"]
    assert {"map12", "auc", "validation_loss"} <= set(final)
    assert len(epoch_records(planted)) == 2
    assert final["map12"] > random_ranking_map(data["planted"]) + 0.1
    null_map = epoch_records(null)[-1]["map12"]
    assert abs(null_map - random_ranking_map(data["null"])) < 0.05
    assert os.path.getsize(tmp_path / "p" / "curves.png") > 0


def test_saved_model_serves_the_trained_model(data, tmp_path):
    import tensorflow as tf
    out = str(tmp_path / "s")
    train(data["planted"], out, "--num_epochs", "1")
    served = tf.saved_model.load(os.path.join(out, "model", "saved_model"))
    test = pd.read_parquet(os.path.join(data["planted"], "test")).iloc[:50]
    features = {c: tf.constant(test[c].to_numpy(), tf.float32 if c.startswith("num") else
                               tf.int64) for c in test if c.startswith(("num", "onehot"))}
    lists = test["multihot_0"].to_list()
    padded = np.zeros((50, 3), np.int64)
    for i, row in enumerate(lists):
        padded[i, :len(row)] = row
    features["multihot_0"] = tf.constant(padded)
    features["multihot_0__length"] = tf.constant([len(r) for r in lists], tf.int32)
    probabilities = served.signatures["serving_default"](**features)["probabilities"].numpy()
    assert probabilities.shape == (50,) and np.all((probabilities > 0) & (probabilities < 1))
    # the model ranks the clicks: mean probability of clicked rows above unclicked rows
    clicked = test["clicked"].to_numpy() == 1
    assert probabilities[clicked].mean() > probabilities[~clicked].mean()


def checkpoint_arrays(out):
    with np.load(os.path.join(out, "model", "checkpoint", "arrays.npz")) as f:
        return {k: f[k] for k in f.files}


def test_resume_equals_uninterrupted(data, tmp_path):
    full = str(tmp_path / "full")
    train(data["planted"], full, "--num_epochs", "2")
    part = str(tmp_path / "part")
    train(data["planted"], part, "--num_epochs", "1")
    resumed = train(data["planted"], part, "--num_epochs", "2", "--use_checkpoint")
    a, b = checkpoint_arrays(full), checkpoint_arrays(part)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)
    assert epoch_records(resumed)[-1]["map12"] == pytest.approx(
        epoch_records(read_log(os.path.join(full, "log.json")))[-1]["map12"], abs=1e-9)


def step_losses(log):
    return [r["data"]["loss"] for r in log if r["type"] == "LOG" and "loss" in r["data"]]


def test_two_horovod_processes_equal_one(data, tmp_path):
    require_or_skip(os.path.exists(HOROVODRUN), "horovodrun not installed")
    common = ["--dataset_path", data["planted"], "--num_epochs", "1", "--deep_dropout", "0",
              "--log_filename", "log.json"] + FAST + ["--print_freq", "1"]
    one = str(tmp_path / "one")
    assert main(common + ["--model_dir", one + "/model", "--results_dir", one]) == 0
    two = str(tmp_path / "two")
    result = bounded_run(horovodrun(2, sys.executable, "-m", "wide_and_deep.main", *common,
                                    "--model_dir", two + "/model", "--results_dir", two), 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log1, log2 = read_log(one + "/log.json"), read_log(two + "/log.json")
    l1, l2 = step_losses(log1), step_losses(log2)
    assert len(l1) == len(l2) == 12
    np.testing.assert_allclose(l1, l2, rtol=0, atol=1e-5)
    a, b = checkpoint_arrays(one), checkpoint_arrays(two)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-5, err_msg=k)
    assert epoch_records(log1)[-1]["map12"] == pytest.approx(epoch_records(log2)[-1]["map12"],
                                                             abs=1e-6)


def run_error(capsys, args):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def edited_copy(src, dst, edit):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "feature_spec.yaml")
    with open(path) as f:
        spec = yaml.safe_load(f)
    edit(spec)
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return dst


def long_row_in_last_train_file(src, dst):
    """A copy whose last training row has 4 multi-hot ids for dimension 3: the first batch
    (checked when the reader opens) is fine, a batch read during training is not."""
    shutil.copytree(src, dst)
    path = sorted(glob.glob(os.path.join(dst, "train", "*.parquet")))[-1]
    frame = pd.read_parquet(path)
    frame.at[frame.index[-1], "multihot_0"] = np.array([1, 1, 1, 1])
    frame.to_parquet(path)
    return {"dir": dst, "file": os.path.basename(path), "row": len(frame) - 1}


def test_bad_inputs_give_one_line_errors(data, tmp_path, capsys):
    base = ["--cpu", "--model_dir", str(tmp_path / "m"), "--results_dir", str(tmp_path / "r")]
    no_label = edited_copy(data["planted"], str(tmp_path / "nolabel"),
                           lambda s: s["channel_spec"].pop("label"))
    assert "label" in run_error(capsys, ["--dataset_path", no_label] + base)

    def shorter(s):
        s["feature_spec"]["multihot_0"]["dimensions"] = [2]
    long_rows = edited_copy(data["planted"], str(tmp_path / "long"), shorter)
    err = run_error(capsys, ["--dataset_path", long_rows] + base)
    assert "multihot_0" in err and "dimensions [2]" in err

    late = long_row_in_last_train_file(data["planted"], str(tmp_path / "late"))
    err = run_error(capsys, ["--dataset_path", late["dir"], "--num_epochs", "1"] + base)
    assert late["file"] in err and "multihot_0" in err and f"row {late['row']}" in err

    err = run_error(capsys, ["--dataset_path", data["planted"], "--combiner", "max"] + base)
    assert "--combiner" in err and "'max'" in err

    def empty_test(s):
        s["source_spec"]["test"][0]["files"] = []
        s["metadata"]["rows"]["test"] = 0
    empty = edited_copy(data["planted"], str(tmp_path / "empty"), empty_test)
    assert "test" in run_error(capsys, ["--dataset_path", empty] + base)


def test_xla_and_amp_train_like_float32(data, tmp_path, monkeypatch):
    """--xla compiles the same computation (same dropout masks): the same losses to float
    rounding; --amp (bfloat16 MLP on CPU) follows them to bfloat16 precision and still learns."""
    monkeypatch.setenv("DLRM_CPU_AMP", "bfloat16")  # the bfloat16 path on any CPU
    plain = step_losses(train(data["planted"], str(tmp_path / "f32"), "--num_epochs", "1"))
    xla = step_losses(train(data["planted"], str(tmp_path / "xla"), "--num_epochs", "1",
                            "--xla"))
    np.testing.assert_allclose(xla, plain, rtol=1e-4)
    amp_log = train(data["planted"], str(tmp_path / "amp"), "--num_epochs", "1", "--amp")
    np.testing.assert_allclose(step_losses(amp_log), plain, rtol=0.05)
    assert epoch_records(amp_log)[-1]["map12"] > random_ranking_map(data["planted"]) + 0.1


def test_benchmark_reports_train_and_eval_throughput(data, tmp_path):
    """3 warm-up + 20 timed steps cycle through the epochs: 12 training batches of 256 rows
    (the last 184), 2 evaluation batches of 512 and 488 in a fixed order."""
    out = str(tmp_path / "b")
    train(data["planted"], out, "--num_epochs", "1")
    samples = {}
    for extra, key in (([], "throughput"),
                       (["--evaluate", "--use_checkpoint"], "mean_inference_throughput")):
        log_name = f"{key}.json"
        assert main(["--dataset_path", data["planted"], "--model_dir", out + "/model",
                     "--results_dir", out, "--log_filename", log_name] + FAST +
                    ["--benchmark", "--benchmark_warmup_steps", "3", "--benchmark_steps", "20",
                     *extra]) == 0
        log = read_log(os.path.join(out, log_name))
        result = [r["data"] for r in log if r["type"] == "LOG" and key in r["data"]]
        assert len(result) == 1 and result[0]["timed_steps"] == 20
        assert result[0][key] == pytest.approx(result[0]["timed_samples"]
                                               / result[0]["timed_seconds"])
        samples[key] = result[0]["timed_samples"]
    assert samples["mean_inference_throughput"] == 10 * 512 + 10 * 488
    # the 20 timed training steps hold one or two of the short batches
    assert samples["throughput"] in (19 * 256 + 184, 18 * 256 + 2 * 184)


def test_nan_loss_is_one_line_error(data, tmp_path, capsys):
    err = run_error(capsys, ["--dataset_path", data["planted"], "--cpu",
                             "--model_dir", str(tmp_path / "m"), "--results_dir", str(tmp_path),
                             "--deep_learning_rate", "1e30", "--linear_learning_rate", "1e30",
                             "--deep_warmup_epochs", "0", "--global_batch_size", "256",
                             "--num_epochs", "1"])
    assert err.startswith("error: loss became") and "--deep_learning_rate" in err
