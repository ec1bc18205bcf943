"""main.py end to end on CPU: learning on planted signal, resume equality, eval/inference/
deploy, checkpoints, logs and clear errors (run_main: where each run runs)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import drop_cli_flags
from core.dllog import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", "200,500,50,1000",
         "--synthetic_dataset_num_numerical_features", "5", "--embedding_dim", "8",
         "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "32,16,1", "--batch_size", "256",
         "--valid_batch_size", "1000", "--synthetic_dataset_valid_batches", "4", "--cpu",
         "--warmup_steps", "5", "--decay_start_step", "60", "--decay_steps", "40",
         "--learning_rate", "0.5", "--seed", "3"]


def run_main(*args, expect_ok=True):
    """main.py with these flags. A run expected to succeed that restores no checkpoint runs
    in this process (no interpreter and TensorFlow start-up: about half of such a run);
    one that restores starts a fresh interpreter, so that it resumes from nothing but what
    the checkpoint holds; one expected to fail runs as a command (its exit status and error
    line are what is checked)."""
    if expect_ok and "--restore_checkpoint_path" not in args:
        return main_in_process(args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"main.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def main_in_process(args):
    drop_cli_flags("sim.main")  # SIM's CLI defines flags of the same names
    import main
    if "--log_path" not in args:  # not main.py's default, in this process's directory
        args = [*args, "--log_path", os.path.join(tempfile.mkdtemp(), "log.json")]
    main.FLAGS.unparse_flags()
    try:
        main.FLAGS(["main.py", *args])
        assert main.main([]) == 0
    finally:
        main.FLAGS.unparse_flags()


def final_metrics(log):
    return [r for r in read_log(log) if r["type"] == "LOG" and r["step"] == []][-1]["data"]


def step_losses(log):
    return {r["step"][1]: r["data"]["loss"] for r in read_log(log)
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"]
            and "loss" in r["data"]}


def saved_position(ckpt) -> dict:
    """Where a checkpoint resumes, less model selection's counters (tests/test_selection)."""
    position = json.load(open(ckpt / "meta.json"))["position"]
    return {k: v for k, v in position.items() if k != "selection"}


def assert_resumed_losses_equal(tmp_path, steps: int):
    """The losses of full.json equal those of first.json then second.json, step by step."""
    full = step_losses(tmp_path / "full.json")
    resumed = {**step_losses(tmp_path / "first.json"), **step_losses(tmp_path / "second.json")}
    assert sorted(full) == sorted(resumed) == list(range(1, steps + 1))
    for step in full:
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


@pytest.mark.parametrize("signal,interaction,optimizer", [(3.0, "dot", "sgd"),
                                                           (3.0, "cross", "adam"),
                                                           (0.0, "dot", "sgd")])
def test_learns_planted_signal_only_when_there_is_one(tmp_path, signal, interaction, optimizer):
    log = tmp_path / "log.json"
    lr = "0.5" if optimizer == "sgd" else "0.01"
    run_main(*SMALL, "--synthetic_dataset_signal_strength", str(signal), "--interaction",
             interaction, "--optimizer", optimizer, "--learning_rate", lr,
             "--synthetic_dataset_train_batches", "100", "--log_path", str(log),
             "--evals_per_epoch", "2")
    metrics = final_metrics(log)
    assert metrics["eval_samples"] == 4000
    if signal:
        assert metrics["auc"] >= 0.75
    else:
        assert abs(metrics["auc"] - 0.5) < 0.05
    evals = [r for r in read_log(log) if r["type"] == "LOG" and r["step"] and "auc" in r["data"]]
    assert len(evals) == 2  # evals_per_epoch


def test_resume_gives_identical_losses(tmp_path):
    common = [*SMALL, "--synthetic_dataset_signal_strength", "2", "--print_freq", "1",
              "--synthetic_dataset_train_batches", "12", "--epochs", "2", "--optimizer", "adam",
              "--learning_rate", "0.01"]
    run_main(*common, "--log_path", str(tmp_path / "full.json"))
    ckpt = tmp_path / "ckpt"
    run_main(*common, "--max_steps", "17", "--save_checkpoint_path", str(ckpt),
             "--checkpoint_steps", "5", "--log_path", str(tmp_path / "first.json"))
    saved_at = [r["step"][1] for r in read_log(tmp_path / "first.json")
                if r["type"] == "LOG" and "checkpoint_saved" in r["data"]]
    assert saved_at == [5, 10, 15, 17]  # every --checkpoint_steps, and at the end
    # no staging directory left, and the run's lock on the path freed with its file
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "first.json", "full.json"]
    assert saved_position(ckpt) == {"step": 17, "epoch": 1, "batch_in_epoch": 5}
    assert sorted(f for f in os.listdir(ckpt) if f.startswith("table_")) == \
        sorted([f"table_{t}.npy" for t in range(4)] + [f"table_{t}.{s}.npy" for t in range(4)
                                                       for s in "mv"])
    run_main(*common, "--restore_checkpoint_path", str(ckpt),
             "--log_path", str(tmp_path / "second.json"))
    assert_resumed_losses_equal(tmp_path, 24)
    assert final_metrics(tmp_path / "full.json")["auc"] == pytest.approx(
        final_metrics(tmp_path / "second.json")["auc"], abs=1e-6)


def test_resume_after_max_steps_on_an_epoch_boundary(tmp_path):
    """--max_steps = one epoch of three: the checkpoint points at epoch 1, batch 0, and the
    resumed run trains epochs 1 and 2 exactly like an uninterrupted run."""
    common = [*SMALL, "--synthetic_dataset_signal_strength", "2", "--print_freq", "1",
              "--synthetic_dataset_train_batches", "4", "--epochs", "3"]
    run_main(*common, "--log_path", str(tmp_path / "full.json"))
    ckpt = tmp_path / "ckpt"
    run_main(*common, "--max_steps", "4", "--save_checkpoint_path", str(ckpt),
             "--log_path", str(tmp_path / "first.json"))
    assert saved_position(ckpt) == {"step": 4, "epoch": 1, "batch_in_epoch": 0}
    run_main(*common, "--restore_checkpoint_path", str(ckpt),
             "--log_path", str(tmp_path / "second.json"))
    full = step_losses(tmp_path / "full.json")
    resumed = {**step_losses(tmp_path / "first.json"), **step_losses(tmp_path / "second.json")}
    assert sorted(full) == sorted(resumed) == list(range(1, 13))
    for step in full:
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, log) of SMALL's model trained on a planted signal: the evaluation,
    inference and deploy modes restore it, and so do the mismatched flags (read only)."""
    out = tmp_path_factory.mktemp("trained")
    run_main(*SMALL, "--synthetic_dataset_signal_strength", "2",
             "--synthetic_dataset_train_batches", "30", "--save_checkpoint_path",
             str(out / "ckpt"), "--log_path", str(out / "train.json"))
    return out / "ckpt", out / "train.json"


def test_eval_inference_and_deploy_round_trip(trained, tmp_path):
    import tensorflow as tf
    ckpt, train_log = trained
    data = [*SMALL, "--synthetic_dataset_signal_strength", "2"]
    eval_log = tmp_path / "eval.json"
    run_main(*data, "--mode", "eval", "--restore_checkpoint_path", str(ckpt),
             "--log_path", str(eval_log))
    assert final_metrics(eval_log)["auc"] == pytest.approx(final_metrics(train_log)["auc"],
                                                           abs=1e-9)
    inf_log = tmp_path / "inference.json"
    run_main(*SMALL, "--mode", "inference", "--max_steps", "20",
             "--restore_checkpoint_path", str(ckpt), "--log_path", str(inf_log))
    inference = final_metrics(inf_log)
    for key in ("mean_inference_throughput", "mean_inference_latency", "p90_inference_latency",
                "p95_inference_latency", "p99_inference_latency"):
        assert inference[key] > 0
    assert inference["p99_inference_latency"] >= inference["p90_inference_latency"]

    exported = tmp_path / "saved_model"
    run_main(*SMALL, "--mode", "deploy", "--restore_checkpoint_path", str(ckpt),
             "--saved_model_output_path", str(exported), "--log_path", str(tmp_path / "d.json"))
    serving = tf.saved_model.load(str(exported)).signatures["serving_default"]
    rng = np.random.default_rng(0)
    numerical = rng.standard_normal((64, 5)).astype(np.float32)
    categorical = np.stack([rng.integers(0, c, 64) for c in (200, 500, 50, 1000)], axis=1)
    served = serving(numerical=tf.constant(numerical),
                     categorical=tf.constant(categorical, tf.int64))["probabilities"].numpy()
    # the same weights through an independent numpy forward pass
    tables = [np.load(ckpt / f"table_{t}.npy") for t in range(4)]
    dense = np.load(ckpt / "dense.npz")
    x = np.pad(numerical, [(0, 0), (0, 3)])
    for i in range(2):
        x = np.maximum(x @ dense[f"bottom_mlp/{i}/kernel"] + dense[f"bottom_mlp/{i}/bias"], 0)
    rows = np.concatenate([x[:, None]] + [t[categorical[:, k]][:, None]
                                          for k, t in enumerate(tables)], axis=1)
    gram = np.einsum("brc,bsc->brs", rows, rows)
    i, j = np.tril_indices(5, -1)
    y = np.concatenate([x, gram[:, i, j], np.zeros((64, 6))], axis=1)  # 8 + 10 -> 24
    for k in range(3):
        y = y @ dense[f"top_mlp/{k}/kernel"] + dense[f"top_mlp/{k}/bias"]
        y = np.maximum(y, 0) if k < 2 else y
    np.testing.assert_allclose(served, 1 / (1 + np.exp(-y[:, 0])), rtol=1e-4, atol=1e-5)


def test_mismatched_checkpoint_is_rejected_with_reason(trained, tmp_path):
    ckpt, _ = trained
    proc = run_main(*SMALL, "--top_mlp_dims", "64,1", "--restore_checkpoint_path", str(ckpt),
                    "--log_path", str(tmp_path / "b.json"), expect_ok=False)
    assert proc.returncode == 2
    assert "top_mlp_dims: checkpoint has [32, 16, 1], flags give [64, 1]" in proc.stderr
    proc = run_main(*SMALL, "--restore_checkpoint_path", str(tmp_path / "nope"),
                    "--log_path", str(tmp_path / "c.json"), expect_ok=False)
    assert proc.returncode == 2 and "no checkpoint at" in proc.stderr


@pytest.mark.parametrize("extra,message", [
    (["--bottom_mlp_dims", "16,4"], "must equal --embedding_dim"),
    (["--dot_interaction", "custom_cuda"], "cannot be combined with --cpu"),
    (["--dataset_type", "tf_raw"], "--dataset_path is required"),
    (["--mode", "deploy"], "needs --saved_model_output_path"),
    (["--synthetic_dataset_cardinalities", "10,x"], "comma-separated integers"),
])  # --learning_rate 1e30 (a diverged run): test_divergence.py, every family
def test_bad_flags_give_clear_errors(tmp_path, extra, message):
    proc = run_main(*SMALL, "--synthetic_dataset_train_batches", "5", *extra,
                    "--save_checkpoint_path", str(tmp_path / "ckpt"),
                    "--log_path", str(tmp_path / "log.json"), expect_ok=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not os.path.exists(tmp_path / "ckpt")  # nothing half-written, no NaN checkpoint


def test_amp_and_xla_train(tmp_path, monkeypatch):
    monkeypatch.setenv("DLRM_CPU_AMP", "bfloat16")  # the bfloat16 path on any CPU
    base = [*SMALL, "--synthetic_dataset_signal_strength", "3", "--print_freq", "1",
            "--synthetic_dataset_train_batches", "60"]
    run_main(*base, "--log_path", str(tmp_path / "fp32.json"))
    run_main(*base, "--xla", "--log_path", str(tmp_path / "xla.json"))
    run_main(*base, "--amp", "--log_path", str(tmp_path / "amp.json"))
    fp32, xla = step_losses(tmp_path / "fp32.json"), step_losses(tmp_path / "xla.json")
    for step in (1, 10, 60):
        assert xla[step] == pytest.approx(fp32[step], rel=1e-3)
    assert final_metrics(tmp_path / "amp.json")["auc"] > 0.75


def test_training_on_split_binary_files_and_plot(tmp_path):
    from datasets import SplitBinaryWriter, SyntheticSource
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default(5, [200, 500, 50, 1000])
    data = tmp_path / "data"
    with SplitBinaryWriter(str(data), spec) as writer:
        train = SyntheticSource(spec, 300, 40, seed=1, signal_strength=3)
        test = SyntheticSource(spec, 777, 3, seed=2, signal_strength=3)
        for batch in train:
            writer.write("train", *batch)
        for batch in test:
            writer.write("test", *batch)
    log = tmp_path / "log.json"
    args = [a for a in SMALL]
    i = args.index("--dataset_type")
    args[i + 1] = "tf_raw"
    run_main(*args, "--dataset_path", str(data), "--batch_size", "250", "--log_path", str(log),
             "--valid_batch_size", "500", "--print_freq", "5")
    metrics = final_metrics(log)
    assert metrics["eval_samples"] == 3 * 777  # every test row, also the partial last batch
    assert metrics["auc"] > 0.75
    assert max(step_losses(log)) == 12000 // 250
    png = tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, "-m", "core.plot_log", str(log), "--out",
                           str(png)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
