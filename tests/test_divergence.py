"""Divergence ends a run the same way on every CPU: a loss that is not finite, or that grows
beyond --divergence_factor times the first step's loss (training/engine.py), is one `error:`
line with exit status 2 in every family, and nothing is written at the checkpoint or export
paths. Whether a runaway loss overflows to inf depends on the CPU; the bound does not."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from core.optimizers import SGD
from test_engine import BATCH, OneRank, ToyTask
from training import OptimizerGroup, Trainer, TrainingDivergedError
from training.engine import DEFAULT_DIVERGENCE_FACTOR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ScaledToyTask(ToyTask):
    """The toy task's loss times a factor the batch carries: a loss made to grow by any
    amount at a chosen step, whatever the CPU's rounding."""

    @staticmethod
    def dense_inputs(batch, step):
        return batch[1], batch[2]

    def loss(self, inputs, embedded, context, dtype):
        label, scale = inputs
        return super().loss(label, embedded, context, dtype) * scale


def scaled_run(scales, divergence_factor=DEFAULT_DIVERGENCE_FACTOR):
    """Steps whose losses are the toy's times `scales`; the trainer and the step losses."""
    task = ScaledToyTask()
    group = OptimizerGroup(SGD(), lambda step: 0.01, (task.w, task.table))
    trainer = Trainer(task, OneRank(), [group], divergence_factor=divergence_factor)
    losses = [float(trainer.train_step((*BATCH, tf.constant(s, tf.float32)), step))
              for step, s in enumerate(scales)]
    return trainer, losses


@pytest.mark.parametrize("scale", [2e3, 1e20, 1e39])  # 1e39 is inf in float32
def test_a_loss_grown_beyond_the_bound_diverges_at_that_step(scale):
    trainer, losses = scaled_run([1, 1, 1, scale, 1])
    assert losses[3] > DEFAULT_DIVERGENCE_FACTOR * losses[0]
    with pytest.raises(TrainingDivergedError, match=r"at step 3\b") as error:
        trainer.check_diverged()
    if np.isfinite(losses[3]):
        assert f"more than 1000 times the first step's loss {losses[0]:.6g}" in str(error.value)


def test_growth_within_the_bound_and_factor_0_do_not_diverge():
    trainer, losses = scaled_run([1, 1, 500, 1])
    assert losses[2] > 400 * losses[0]  # grown, yet within 1000 times
    trainer.check_diverged()
    scaled_run([1, 1e20, 1], divergence_factor=0)[0].check_diverged()
    trainer, _ = scaled_run([1, 1e39, 1], divergence_factor=0)  # inf still diverges
    with pytest.raises(TrainingDivergedError, match="loss became inf at step 1 "):
        trainer.check_diverged()


@pytest.mark.parametrize("factor", [0.5, -1.0, float("nan")])
def test_a_factor_below_1_is_refused(factor):
    with pytest.raises(ValueError, match="--divergence_factor must be 0 .off. or at least 1"):
        scaled_run([1], divergence_factor=factor)


# ---- every family's command line at a learning rate of 1e30 ---------------------------------
DLRM = ["main.py", "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities",
        "200,500,50", "--synthetic_dataset_num_numerical_features", "5", "--embedding_dim", "8",
        "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--batch_size", "256",
        "--valid_batch_size", "512", "--synthetic_dataset_train_batches", "6",
        "--synthetic_dataset_valid_batches", "2", "--cpu", "--warmup_steps", "0"]
WIDE_DEEP = ["-m", "wide_and_deep.main", "--cpu", "--global_batch_size", "256",
             "--eval_batch_size", "512", "--deep_hidden_units", "16", "16", "--num_epochs", "1",
             "--deep_warmup_epochs", "0"]
SIM = ["-m", "sim.main", "--cpu", "--epochs", "1", "--global_batch_size", "32",
       "--stage_one_mlp_dims", "16", "--stage_two_mlp_dims", "16,8", "--aux_mlp_dims", "8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from sim.synthetic import write
    from wide_and_deep import generate_feature_spec, synthetic
    root = tmp_path_factory.mktemp("diverge")
    spec = str(root / "wd_spec.yaml")
    assert generate_feature_spec.main(["--dst", spec, "--onehot", "40:8,30:4", "--multihot",
                                       "20:4", "--num_numerical", "3"]) == 0
    assert synthetic.main(["--feature_spec", spec, "--dst", str(root / "wd"), "--train_rows",
                           "2000", "--test_rows", "500"]) == 0
    write(str(root / "sim"), users=100, items=200, categories=8, history_length=100,
          signal="long", seed=0)
    return {"wd": str(root / "wd"), "sim": str(root / "sim")}


def run(args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def family_command(family, data, out):
    """The command line and the paths it would write a checkpoint or a SavedModel to."""
    if family == "dlrm":
        return (DLRM + ["--learning_rate", "1e30", "--log_path", f"{out}/log.json",
                        "--save_checkpoint_path", f"{out}/checkpoint"], [f"{out}/checkpoint"])
    if family.startswith("wide_deep"):
        rate = "--linear_learning_rate" if family == "wide_deep_linear" else "--deep_learning_rate"
        return (WIDE_DEEP + ["--dataset_path", data["wd"], rate, "1e30", "--model_dir",
                             f"{out}/model", "--results_dir", f"{out}/results"],
                [f"{out}/model"])
    return (SIM + ["--model_type", family.split("_")[1], "--dataset_dir", data["sim"],
                   "--lr", "1e30", "--results_dir", f"{out}/results",
                   "--save_checkpoint_path", f"{out}/checkpoint", "--export_path",
                   f"{out}/saved_model"], [f"{out}/checkpoint", f"{out}/saved_model"])


def error_line(proc):
    """The run's one `error:` line (TensorFlow's own start-up lines may precede it)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    return errors[0]


HINTS = {"dlrm": "--learning_rate", "wide_deep_linear": "--linear_learning_rate",
         "wide_deep_deep": "--deep_learning_rate", "sim_din": "--lr", "sim_sim": "--lr"}
# (family, --divergence_factor; None: the default, 1000): every family diverges, and every
# command line both with its default and with the factor it is given
RUNS = [("dlrm", None), ("dlrm", 5), ("wide_deep_linear", None), ("wide_deep_deep", 5),
        ("sim_din", 5), ("sim_sim", None)]


@pytest.mark.parametrize("family,factor", RUNS)
def test_learning_rate_1e30_is_one_error_line_and_nothing_is_written(family, factor, data,
                                                                      tmp_path):
    args, outputs = family_command(family, data, tmp_path)
    given = ["--divergence_factor", str(factor)] if factor else []
    line = error_line(run(args + given))
    assert line.startswith("error: loss became") and "at step " in line, line
    assert f"--divergence_factor {factor or 1000})" in line and HINTS[family] in line, line
    for path in outputs:  # a directory the run's output lock made may be left, empty
        assert not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path)), \
            f"{path} written after divergence: {os.listdir(path)}"


@pytest.mark.parametrize("family", ["dlrm", "wide_deep_linear", "sim_din"])
def test_every_family_refuses_a_divergence_factor_below_1(family, data, tmp_path):
    args, _ = family_command(family, data, tmp_path)
    line = error_line(run(args + ["--divergence_factor", "0.5"]))
    assert line == "error: --divergence_factor must be 0 (off) or at least 1, found 0.5", line
