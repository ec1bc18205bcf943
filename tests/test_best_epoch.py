"""Best epoch in every family, end to end through its CLI: trained on data whose validation
labels are the training signal reversed (so validation peaks at the first evaluation and
falls while training learns), `--keep_best --early_stopping_patience` keeps the first
evaluation's state as the checkpoint and the export (the metric recomputed from them equals
the logged best), stops when patience is spent, and a run ended early (by its step limit)
and resumed ends exactly where the uninterrupted one does."""
import glob
import json
import os
import shutil
import sys

import numpy as np
import pytest

from conftest import bounded_run, horovodrun, require_or_skip, HOROVODRUN
from core.dllog import read_log
from training.metrics import mean_average_precision_at_k, roc_auc
from training.selection import best_state_path


def evaluations(log: str) -> list:
    """(epoch, step, figures) of every evaluation record of a run's log."""
    return [(r["step"][0], r["step"][1], r["data"]) for r in read_log(log)
            if r["type"] == "LOG" and len(r["step"]) == 2 and "auc" in r["data"]]


def final_record(log: str) -> dict:
    return [r["data"] for r in read_log(log) if r["type"] == "LOG" and r["step"] == []][-1]


def checkpoint_arrays(path: str) -> dict:
    """Every array of a checkpoint directory (.npy, and each member of an .npz)."""
    arrays = {}
    for file in sorted(glob.glob(os.path.join(path, "*.np[yz]"))):
        name = os.path.basename(file)
        if file.endswith(".npy"):
            arrays[name] = np.load(file)
        else:
            with np.load(file) as members:
                arrays.update({f"{name}/{k}": members[k] for k in members.files})
    return arrays


def assert_same_arrays(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def assert_peaked_first_and_stopped(log: str, patience: int, metric: str = "auc") -> dict:
    """The run evaluated after epochs 0..patience, its best was epoch 0, it stopped early
    and kept epoch 0; returns the final record."""
    evals = evaluations(log)
    values = [figures[metric] for _, _, figures in evals]
    assert [epoch for epoch, _, _ in evals] == list(range(patience + 1)), values
    assert values[0] > max(values[1:]), values  # the reversed signal: validation falls
    final = final_record(log)
    assert final["stopped_early"] == 1 and final["kept_epoch"] == 0
    assert final["kept_step"] == evals[0][1] and final[metric] == values[0]
    assert final["step"] == evals[-1][1]
    return final


# ---------------------------------------------------------------------------------- DLRM
def dlrm_data(root, validation: bool = False) -> str:
    """Training on the planted signal; test reversed, or (validation) a validation split
    reversed and test as training."""
    from core.feature_spec import FeatureSpec
    from datasets import SplitBinaryWriter, SyntheticSource
    mappings = ("train", "test", "validation") if validation else ("train", "test")
    spec = FeatureSpec.get_default(5, [200, 500, 50, 1000], mappings=mappings)
    with SplitBinaryWriter(str(root), spec) as writer:
        for batch in SyntheticSource(spec, 250, 16, seed=1, signal_strength=3):
            writer.write("train", *batch)
        for batch in SyntheticSource(spec, 500, 2, seed=2, signal_strength=-3):
            writer.write("validation" if validation else "test", *batch)
        if validation:
            for batch in SyntheticSource(spec, 500, 2, seed=3, signal_strength=3):
                writer.write("test", *batch)
    return str(root)


def dlrm_args(data, *extra):
    from test_training import SMALL
    args = list(SMALL)
    args[args.index("--dataset_type") + 1] = "tf_raw"
    return [*args, "--dataset_path", data, "--batch_size", "250", "--valid_batch_size", "500",
            "--print_freq", "100", "--epochs", "5", *extra]


def test_dlrm_keeps_the_best_epoch_stops_and_resumes_exactly(tmp_path):
    from test_training import run_main
    data, ckpt = dlrm_data(tmp_path / "data"), str(tmp_path / "ckpt")
    select = ["--keep_best", "--early_stopping_patience", "2"]
    log = str(tmp_path / "train.json")
    run_main(*dlrm_args(data, *select, "--save_checkpoint_path", ckpt, "--log_path", log))
    final = assert_peaked_first_and_stopped(log, patience=2)
    assert json.load(open(os.path.join(ckpt, "meta.json")))["position"]["step"] == 16
    # the kept checkpoint evaluates to the logged best
    eval_log = str(tmp_path / "eval.json")
    run_main(*dlrm_args(data, "--mode", "eval", "--restore_checkpoint_path", ckpt,
                        "--log_path", eval_log))
    assert final_record(eval_log)["auc"] == pytest.approx(final["auc"], abs=1e-9)
    # its export serves the same model: the AUC of the SavedModel's probabilities
    exported = str(tmp_path / "saved_model")
    run_main(*dlrm_args(data, "--mode", "deploy", "--restore_checkpoint_path", ckpt,
                        "--saved_model_output_path", exported, "--log_path",
                        str(tmp_path / "deploy.json")))
    labels, probabilities = dlrm_served(data, exported)
    assert roc_auc(labels, probabilities) == pytest.approx(final["auc"], abs=1e-6)
    # ended by --max_steps after epoch 1 (not the best one), then resumed: the same end
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    run_main(*dlrm_args(data, *select, "--max_steps", "32", "--save_checkpoint_path", first,
                        "--log_path", str(tmp_path / "first.json")))
    run_main(*dlrm_args(data, *select, "--restore_checkpoint_path", first,
                        "--save_checkpoint_path", second, "--log_path",
                        str(tmp_path / "second.json")))
    assert_same_arrays(checkpoint_arrays(second), checkpoint_arrays(ckpt))
    resumed = final_record(str(tmp_path / "second.json"))
    for key in ("auc", "kept_step", "stopped_early"):
        assert resumed[key] == final[key]
    retrained = {s: f["auc"] for _, s, f in evaluations(str(tmp_path / "second.json"))}
    assert retrained == pytest.approx({s: f["auc"] for _, s, f in evaluations(log) if s > 16},
                                      abs=1e-6)


def test_dlrm_selects_on_the_validation_split_and_reports_the_held_out_test(tmp_path):
    """Validation falls from the first evaluation while test (the training signal) rises:
    selection must read validation (kept epoch 0), and the final record reports the test
    data at that state, as --mode eval of the kept checkpoint computes it."""
    from test_training import run_main
    data, ckpt = dlrm_data(tmp_path / "data", validation=True), str(tmp_path / "ckpt")
    log = str(tmp_path / "train.json")
    run_main(*dlrm_args(data, "--keep_best", "--early_stopping_patience", "1",
                        "--save_checkpoint_path", ckpt, "--log_path", log))
    final = assert_peaked_first_and_stopped(log, patience=1)
    eval_log = str(tmp_path / "eval.json")
    run_main(*dlrm_args(data, "--mode", "eval", "--restore_checkpoint_path", ckpt,
                        "--log_path", eval_log))
    tested = final_record(eval_log)
    assert final["test_auc"] == pytest.approx(tested["auc"], abs=1e-9) and tested["auc"] > 0.7
    assert final["test_samples"] == tested["eval_samples"] == 1000


def dlrm_served(data: str, exported: str):
    """(labels, probabilities) of the test split through the SavedModel."""
    import tensorflow as tf
    from core.feature_spec import FeatureSpec
    from datasets import SplitBinaryReader
    spec = FeatureSpec.from_yaml(os.path.join(data, "feature_spec.yaml"))
    serving = tf.saved_model.load(exported).signatures["serving_default"]
    labels, probabilities = [], []
    for numerical, categorical, label in SplitBinaryReader(spec, "test", 500):
        served = serving(numerical=tf.constant(numerical, tf.float32),
                         categorical=tf.constant(np.stack(categorical, axis=1), tf.int64)
                         )["probabilities"]
        labels.append(np.asarray(label).reshape(-1))
        probabilities.append(served.numpy().reshape(-1))
    return np.concatenate(labels), np.concatenate(probabilities)


# ------------------------------------------------------------------------------ Wide & Deep
def wd_data(root) -> str:
    """Training clicks follow the planted score, the test displays' clicks its reverse."""
    from test_wd_training import make_dataset
    root = str(root)
    planted = make_dataset(root, "planted", 3.0)
    reversed_ = make_dataset(root, "reversed", -3.0, seed=1)
    shutil.rmtree(os.path.join(planted, "test"))
    shutil.copytree(os.path.join(reversed_, "test"), os.path.join(planted, "test"))
    return planted


def test_wide_and_deep_keeps_the_best_map12_epoch_stops_and_resumes_exactly(tmp_path):
    import pandas as pd
    from test_wd_training import FAST
    from wide_and_deep.main import main
    data = wd_data(tmp_path / "data")

    def train(out, *extra):
        assert main(["--dataset_path", data, "--model_dir", os.path.join(out, "model"),
                     "--results_dir", out, *FAST, "--keep_best",
                     "--early_stopping_patience", "1", *extra]) == 0
        return os.path.join(out, "log.json")

    out = str(tmp_path / "full")
    final = assert_peaked_first_and_stopped(train(out, "--num_epochs", "4"), 1, "map12")
    assert final["auc"] == evaluations(os.path.join(out, "log.json"))[0][2]["auc"]
    # the export is the kept state: MAP@12 and AUC of its probabilities
    test = pd.read_parquet(os.path.join(data, "test"))
    probabilities = wd_served(os.path.join(out, "model", "saved_model"), test)
    labels = test["clicked"].to_numpy()
    assert roc_auc(labels, probabilities) == pytest.approx(final["auc"], abs=1e-6)
    assert mean_average_precision_at_k(test["display_id"].to_numpy(), labels, probabilities,
                                       12) == pytest.approx(final["map12"], abs=1e-6)
    # ended after epoch 0, then resumed with --use_checkpoint: the same kept checkpoint
    part = str(tmp_path / "part")
    train(part, "--num_epochs", "1")
    resumed = final_record(train(part, "--num_epochs", "4", "--use_checkpoint"))
    assert_same_arrays(checkpoint_arrays(os.path.join(part, "model", "checkpoint")),
                       checkpoint_arrays(os.path.join(out, "model", "checkpoint")))
    assert resumed["map12"] == final["map12"] and resumed["stopped_early"] == 1


def wd_served(saved_model: str, test) -> np.ndarray:
    import tensorflow as tf
    served = tf.saved_model.load(saved_model).signatures["serving_default"]
    features = {c: tf.constant(test[c].to_numpy(), tf.float32 if c.startswith("num") else
                               tf.int64) for c in test if c.startswith(("num", "onehot"))}
    lists = test["multihot_0"].to_list()
    padded = np.zeros((len(lists), max(len(r) for r in lists)), np.int64)
    for i, row in enumerate(lists):
        padded[i, :len(row)] = row
    features["multihot_0"] = tf.constant(padded)
    features["multihot_0__length"] = tf.constant([len(r) for r in lists], tf.int32)
    return served(**features)["probabilities"].numpy()


# ------------------------------------------------------------------------------------- SIM
def sim_data(root) -> str:
    """SIM's synthetic rows with the test users' clicks reversed."""
    from core.columnar import write_columns
    from sim import contract
    from sim.synthetic import generate
    data = generate(users=1500, items=200, categories=8, history_length=100, signal="short",
                    seed=4)
    label = data["test"][contract.LABEL]
    data["test"][contract.LABEL] = np.logical_not(label).astype(label.dtype)
    spec = contract.sim_spec(1500, 200, 8, 100, {"generator": "test_best_epoch"})
    write_columns(str(root), spec, data, "tfrecord", ids_from_one=True)
    return str(root)


def sim_train(data, results, *extra):
    from test_sim_training import SMALL, train
    return train(data, results, "--model_type", "dien", "--keep_best",
                 "--early_stopping_patience", "1", *extra)


def test_sim_keeps_the_best_epoch_in_checkpoint_and_export_and_resumes_exactly(tmp_path):
    import tensorflow as tf
    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import LABEL, SIM_CONTRACT
    data = sim_data(tmp_path / "data")
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "saved_model")
    sim_train(data, tmp_path / "full", "--epochs", "4", "--save_checkpoint_path", ckpt,
              "--export_path", export)
    final = assert_peaked_first_and_stopped(str(tmp_path / "full" / "log.json"), 1)
    assert os.path.isdir(best_state_path(ckpt))
    spec = load_spec(data, SIM_CONTRACT)
    serve = tf.saved_model.load(export).signatures["serving_default"]
    names = serve.structured_input_signature[1]
    reader = open_reader(spec, "test", 100)
    labels, probabilities = [], []
    for i in range(len(reader)):
        batch = reader.get(i)
        labels.append(np.asarray(batch[LABEL]).reshape(-1))
        probabilities.append(serve(**{k: tf.constant(batch[k], names[k].dtype)
                                      for k in names})["probabilities"].numpy())
    assert roc_auc(np.concatenate(labels), np.concatenate(probabilities)) == \
        pytest.approx(final["auc"], abs=1e-6)
    part = str(tmp_path / "part_ckpt")
    sim_train(data, tmp_path / "first", "--epochs", "1", "--save_checkpoint_path", part)
    second = sim_train(data, tmp_path / "second", "--epochs", "4", "--load_checkpoint_path",
                       part, "--save_checkpoint_path", part)
    assert_same_arrays(checkpoint_arrays(part), checkpoint_arrays(ckpt))
    resumed = [r["data"] for r in second if r["step"] == []][-1]
    assert resumed["auc"] == final["auc"] and resumed["kept_step"] == final["kept_step"]


def test_under_two_processes_every_rank_stops_at_the_one_process_step(tmp_path):
    """Horovod, data parallel: both ranks stop after the same evaluation and keep the same
    epoch as one process (the job ends; neither rank waits in a collective)."""
    require_or_skip(os.path.exists(HOROVODRUN), "horovod is not installed")
    from test_sim_training import SMALL
    data = sim_data(tmp_path / "data")
    command = ["-m", "sim.main", "--dataset_dir", data, *SMALL, "--model_type", "dien",
               "--keep_best", "--early_stopping_patience", "1", "--epochs", "4"]
    one = bounded_run([sys.executable, *command, "--results_dir", str(tmp_path / "one"),
                       "--save_checkpoint_path", str(tmp_path / "c1")], timeout=300)
    two = bounded_run(horovodrun(2, sys.executable, *command, "--results_dir",
                                 str(tmp_path / "two"), "--save_checkpoint_path",
                                 str(tmp_path / "c2")), timeout=300)
    assert one.returncode == 0 and two.returncode == 0, two.stdout + two.stderr
    one_final, two_final = (final_record(str(tmp_path / d / "log.json")) for d in ("one", "two"))
    assert two_final["stopped_early"] == 1
    for key in ("step", "kept_step", "kept_epoch"):
        assert two_final[key] == one_final[key]


# ------------------------------------------------------- the generators' validation splits
def test_wide_and_deep_synthetic_validation_rows_follow_the_test_displays(tmp_path):
    import pandas as pd
    from test_wd_training import make_dataset
    from wide_and_deep import synthetic
    plain = make_dataset(str(tmp_path), "plain", 2.0)
    spec = os.path.join(str(tmp_path), "spec.yaml")
    with_val = str(tmp_path / "val")
    assert synthetic.main(["--feature_spec", spec, "--dst", with_val, "--train_rows", "3000",
                           "--test_rows", "1000", "--validation_rows", "500"]) == 0
    for mapping in ("train", "test"):  # unchanged by the validation split
        pd.testing.assert_frame_equal(pd.read_parquet(os.path.join(plain, mapping)),
                                      pd.read_parquet(os.path.join(with_val, mapping)))
    test = pd.read_parquet(os.path.join(with_val, "test"))
    validation = pd.read_parquet(os.path.join(with_val, "validation"))
    assert len(validation) == 500
    assert validation["display_id"].min() > test["display_id"].max()
    assert (validation.groupby("display_id")["clicked"].sum() == 1).all()


def test_sim_synthetic_validation_users_come_from_the_training_users():
    from sim import contract
    from sim.synthetic import generate
    plain = generate(500, 200, 8, 100, "long", seed=5)
    split = generate(500, 200, 8, 100, "long", seed=5, validation_users=100)
    users = {m: set(np.asarray(cols[contract.USER]).tolist()) for m, cols in split.items()}
    assert users["test"] == set(np.asarray(plain["test"][contract.USER]).tolist())
    assert users["train"] | users["validation"] == \
        set(np.asarray(plain["train"][contract.USER]).tolist())
    assert len(users["validation"]) == 100 and not users["validation"] & users["train"]
    with pytest.raises(ValueError, match="--validation_users must be in 0..399"):
        generate(500, 200, 8, 100, "long", seed=5, validation_users=400)
