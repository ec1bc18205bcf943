"""SIM/DIEN/DIN end to end through `python -m sim.main` (in process; Horovod in a subprocess):
planted signals, determinism, resume, data parallelism, metrics, bad inputs."""
import os
import sys

import numpy as np
import pytest

from conftest import HOROVODRUN, bounded_run, drop_cli_flags, horovodrun, require_or_skip

SMALL = ["--cpu", "--global_batch_size", "128", "--stage_one_mlp_dims", "32",
         "--stage_two_mlp_dims", "32,16", "--aux_mlp_dims", "16", "--print_freq", "1000",
         "--seed", "0"]


def synthetic(directory, signal, users, seed=0):
    from sim.synthetic import write
    write(str(directory), users=users, items=200, categories=8, history_length=100,
          signal=signal, seed=seed)
    return str(directory)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("sim_data")
    return {"short": synthetic(base / "short", "short", 2000),
            "long": synthetic(base / "long", "long", 2000, seed=1),
            "none": synthetic(base / "none", "none", 2000, seed=2),
            "tiny": synthetic(base / "tiny", "long", 300, seed=3)}


def run_main(args, status=0):
    """sim.main in process; its exit status must be `status` (2: one error line)."""
    drop_cli_flags("main")  # DLRM's main.py, if an earlier test imported it
    from sim import main as sim_main
    sim_main.F.unparse_flags()
    sim_main.F(["sim.main"] + list(args))
    assert sim_main.main([]) == status


def train(dataset, results, *extra):
    run_main(["--dataset_dir", dataset, "--results_dir", str(results)] + SMALL + list(extra))
    from core.dllog import read_log
    return read_log(os.path.join(str(results), "log.json"))


def final_auc(records):
    return [r["data"] for r in records if r["step"] == []][-1]["auc"]


def step_losses(records):
    return [r["data"]["loss"] for r in records
            if isinstance(r["step"], list) and len(r["step"]) == 2 and "loss" in r["data"]]


@pytest.mark.parametrize("model_type", ["dien", "sim"])
def test_short_signal_learned_by_the_short_part(data, tmp_path, model_type):
    """DIEN and SIM read the recent behaviours on their own (DIN attends over all ~90, where
    this signal is 5 of them; it learns the long signal, below)."""
    auc = final_auc(train(data["short"], tmp_path, "--model_type", model_type, "--epochs", "2"))
    assert auc > 0.7, f"{model_type}: test AUC {auc}"


def test_no_signal_is_not_learned(data, tmp_path):
    auc = final_auc(train(data["none"], tmp_path, "--epochs", "2"))
    assert abs(auc - 0.5) < 0.1


def test_long_signal_needs_the_long_history(data, tmp_path):
    """The signal lives only in the older behaviours: SIM (long part) and DIN (whole history,
    as the reference's) learn it; DIEN (short part only) cannot."""
    sim = train(data["long"], tmp_path / "sim", "--epochs", "2")
    din = train(data["long"], tmp_path / "din", "--epochs", "2", "--model_type", "din")
    dien = train(data["long"], tmp_path / "dien", "--epochs", "2", "--model_type", "dien")
    assert final_auc(din) > 0.8, final_auc(din)
    assert final_auc(sim) > final_auc(dien) + 0.15, (final_auc(sim), final_auc(dien))
    per_epoch = [r for r in sim if isinstance(r["step"], list) and "auc" in r["data"]
                 and len(r["step"]) == 2]
    assert len(per_epoch) == 2 and all("validation_loss" in r["data"] for r in per_epoch)
    assert os.path.getsize(tmp_path / "sim" / "curves.png") > 0


@pytest.mark.parametrize("architecture", ["reference", "compact"])
def test_fixed_seed_gives_identical_runs_and_resume_equals_uninterrupted(data, tmp_path,
                                                                          architecture):
    """Three runs with one seed (dropout on): two epochs; one epoch saved; its resumption.
    The one-epoch run repeats the first epoch of the other exactly, and the resumed run
    continues it exactly: each architecture round-trips through its checkpoint."""
    args = ["--print_freq", "1", "--dropout_rate", "0.3", "--seed", "5",
            "--global_batch_size", "64", "--architecture", architecture]
    whole = train(data["tiny"], tmp_path / "whole", "--epochs", "2", *args)
    ckpt = str(tmp_path / "ckpt")
    first = train(data["tiny"], tmp_path / "first", "--epochs", "1",
                  "--save_checkpoint_path", ckpt, *args)
    second = train(data["tiny"], tmp_path / "second", "--epochs", "2",
                   "--load_checkpoint_path", ckpt, *args)
    assert len(step_losses(whole)) == 8
    assert step_losses(first) == step_losses(whole)[:4]
    assert step_losses(first) + step_losses(second) == step_losses(whole)
    assert final_auc(second) == final_auc(whole)


def test_two_horovod_processes_make_the_one_process_update(data, tmp_path):
    require_or_skip(os.path.exists(HOROVODRUN), "horovodrun is not installed")
    args = SMALL + ["--dataset_dir", data["tiny"], "--epochs", "1", "--print_freq", "1",
                    "--global_batch_size", "60", "--model_type", "sim"]
    one = train(data["tiny"], tmp_path / "one", *args[len(SMALL) + 2:])
    done = bounded_run(horovodrun(2, sys.executable, "-m", "sim.main", "--results_dir",
                                  str(tmp_path / "two"), *args), 300)
    assert done.returncode == 0, done.stderr[-3000:]
    from core.dllog import read_log
    two = read_log(str(tmp_path / "two" / "log.json"))
    assert len(step_losses(one)) == 4
    np.testing.assert_allclose(step_losses(two), step_losses(one), rtol=0, atol=1e-5)
    assert abs(final_auc(two) - final_auc(one)) < 1e-4


def test_evaluation_metrics_match_scikit_learn(data):
    from sklearn.metrics import log_loss, roc_auc_score

    from core.pipelines import DictPipeline
    from core.parallel.comm import make_communicator
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    from sim.data import model_shape, open_mapping
    from sim.model import SimConfig, SimModel
    from sim.trainer import SimTrainer, step_batch
    from training import loop
    spec = load_spec(data["tiny"], SIM_CONTRACT)
    comm = make_communicator()
    trainer = SimTrainer(SimModel(SimConfig(**model_shape(spec), stage_one_mlp_dims=(8,),
                                            stage_two_mlp_dims=(8,), aux_mlp_dims=(8,))), comm)
    test = [step_batch(spec, b) for b in
            DictPipeline(open_mapping(spec, "test", 25, comm), (spec.label_feature,)).epoch()]
    got = loop.evaluate(trainer, test)
    predictions = np.concatenate([trainer.predict(b).numpy() for b in test])
    labels = np.concatenate([b[1].numpy() for b in test])
    assert got["eval_samples"] == len(labels) == 60
    assert got["auc"] == pytest.approx(roc_auc_score(labels, predictions), abs=1e-12)
    assert got["validation_loss"] == pytest.approx(log_loss(labels, predictions), abs=1e-6)


def test_inference_benchmark_and_export(data, tmp_path):
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "saved_model")
    train(data["tiny"], tmp_path / "t", "--epochs", "1", "--save_checkpoint_path", ckpt,
          "--export_path", export)
    records = train(data["tiny"], tmp_path / "i", "--mode", "inference", "--load_checkpoint_path",
                    ckpt, "--benchmark_steps", "5", "--benchmark_warmup_steps", "1")
    final = [r["data"] for r in records if r["step"] == []][-1]
    assert final["mean_inference_throughput"] > 0
    assert final["p90_inference_latency"] <= final["p99_inference_latency"]
    import tensorflow as tf

    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    spec = load_spec(data["tiny"], SIM_CONTRACT)
    batch = open_reader(spec, "test", 10).get(0)
    serve = tf.saved_model.load(export).signatures["serving_default"]
    names = serve.structured_input_signature[1]
    out = serve(**{k: tf.constant(batch[k], names[k].dtype) for k in names})["probabilities"]
    assert out.shape == (10,) and np.all((out.numpy() > 0) & (out.numpy() < 1))
