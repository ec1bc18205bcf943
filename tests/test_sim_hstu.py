"""The HSTU ranker of the SIM family (`--model_type hstu`): its equations against numpy loops
over one concatenated sequence (history, then candidates) and its mask; C candidates scored
in one pass equal C passes of one; end to end through `python -m sim.main`: it learns a
planted signal, resumes exactly, keeps its best state, exports, reads open-vocabulary ids and
makes one process's update under two Horovod processes."""
import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip
from sim.model import SimConfig, SimConfigError, SimModel
from test_sim_training import SMALL, final_auc, step_losses, synthetic, train

D, C = 6, 4


def np_layer_norm(x, scale=1.0, offset=0.0):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6) * scale \
        + offset


def silu(x):
    return x / (1 + np.exp(-x))


def np_logits(model, inputs):
    """sim/hstu.py's equations, one history at a time: the D history tokens then the C
    candidates as one sequence, positions 0..D-1 then D for every candidate; query i reads
    key j when (history i) j <= i and j holds a behaviour or j == i, (candidate i) j is a
    history behaviour or j == i. Then the final norm, [y, user] and the PReLU classifier."""
    c = model.config
    w = {k: v.numpy() for k, v in model.dense_variables().items()}
    tables = {k: v.numpy() for k, v in model.tables().items()}
    width, heads = c.item_width, c.hstu_heads
    e = width // heads

    def item(ids):  # one id per item feature -> the features' rows side by side
        return np.concatenate([tables[f"item_table_{f}"][i] for f, i in enumerate(ids)])

    out = []
    for r in range(len(inputs["user"][0])):
        history = np.stack([item([p[r, j] for p in inputs["positive"]]) for j in range(D)])
        real = np.asarray(inputs["positive"][0][r]) != 0
        candidates = np.stack([item([t[r, k] for t in inputs["target"]]) for k in range(C)])
        x = np.concatenate([history, candidates]) * math.sqrt(width)
        position = list(range(D)) + [D] * C
        x += w["hstu/positions"][position]
        x[:D] *= real[:, None]
        n = D + C
        for b in range(c.hstu_blocks):
            p = f"hstu/block_{b}/"
            u, v, q, k = np.split(silu(np_layer_norm(x) @ w[p + "uvqk"] + w[p + "uvqk_bias"]),
                                  4, axis=-1)
            attended = np.zeros_like(v)
            for i in range(n):
                for j in range(n):
                    if i < D:
                        seen = j <= i and (real[j] or j == i)
                    else:
                        seen = (j < D and real[j]) or j == i
                    if not seen:
                        continue
                    bias = w[p + "position_bias"][position[j] - position[i] + D]
                    for h in range(heads):
                        s = slice(h * e, (h + 1) * e)
                        attended[i, s] += silu(q[i, s] @ k[j, s] + bias) / D * v[j, s]
            x = x + (u * np_layer_norm(attended)) @ w[p + "o"] + w[p + "o_bias"]
            x[:D] *= real[:, None]
        y = np_layer_norm(x[D:], w["hstu/final_norm/scale"], w["hstu/final_norm/offset"])
        user = np.concatenate([tables[f"user_table_{f}"][u[r]]
                               for f, u in enumerate(inputs["user"])])
        h = np.concatenate([y, np.repeat(user[None], C, 0)], 1)
        layers = len(c.stage_two_mlp_dims)
        for i in range(layers + 1):
            h = h @ w[f"stage_two_mlp/{i}/kernel"] + w[f"stage_two_mlp/{i}/bias"]
            if i < layers:
                h = np.maximum(h, 0) + w[f"stage_two_mlp/{i}/alpha"] * np.minimum(h, 0)
        out.append(h[:, 0])
    return np.stack(out)


def small_model(heads=1):
    # no --long_seq_length: the ranker reads the whole history (the default 90 > D is fine)
    config = SimConfig(user_cardinalities=(5,), item_cardinalities=(20, 4), history_length=D,
                       model_type="hstu", embedding_dim=4,
                       stage_two_mlp_dims=(8,), hstu_blocks=2, hstu_heads=heads, seed=2)
    model = SimModel(config)
    rng = np.random.default_rng(7)
    for v in model.dense_variables().values():  # the zero-started biases too
        v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32) + (
            1.0 if "scale" in v.name else 0.0))
    return model


def candidate_inputs(batch=3):
    """Histories with 2, 0 and 5 padded positions (the second full, the third one
    behaviour), C candidates each (one repeated, so equal candidates get equal logits)."""
    rng = np.random.default_rng(1)
    padded = np.arange(D)[None] < np.array([[2], [0], [5]])
    positive = [np.where(padded, 0, rng.integers(1, n + 1, (batch, D))) for n in (20, 4)]
    target = [rng.integers(1, n + 1, (batch, C)) for n in (20, 4)]
    for t in target:
        t[:, 3] = t[:, 1]
    return {"user": [tf.constant(rng.integers(1, 6, batch))],
            "target": [tf.constant(t) for t in target],
            "positive": [tf.constant(p) for p in positive],
            "negative": [tf.constant(p) for p in positive]}


@pytest.mark.parametrize("heads", [1, 2])
def test_ranker_matches_numpy_equations(heads):
    model = small_model(heads)
    inputs = candidate_inputs()
    got = model.score_candidates(inputs).numpy()
    np.testing.assert_allclose(got, np_logits(model, inputs), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got[:, 3], got[:, 1], rtol=1e-6, atol=1e-6)
    assert np.abs(got[:, 0] - got[:, 2]).max() > 1e-3  # the candidates are read


def test_one_pass_over_candidates_equals_one_pass_per_candidate():
    """C candidates together, each alone, and each as the training step's target (forward
    of a [B] target): the same logits; training's loss path reads the same function."""
    model = small_model(2)
    inputs = candidate_inputs()
    together = model.score_candidates(inputs).numpy()
    for k in range(C):
        alone = model.score_candidates(
            {**inputs, "target": [t[:, k:k + 1] for t in inputs["target"]]}).numpy()
        np.testing.assert_allclose(alone[:, 0], together[:, k], rtol=1e-5, atol=1e-6)
        target = {**inputs, "target": [t[:, k] for t in inputs["target"]]}
        logit = model.forward(model.lookup(target, training=False))[0].numpy()
        np.testing.assert_allclose(logit, together[:, k], rtol=1e-5, atol=1e-6)


def test_other_models_refuse_several_candidates_and_heads_must_split_the_width():
    with pytest.raises(SimConfigError, match="hstu"):
        SimModel(SimConfig(user_cardinalities=(5,), item_cardinalities=(20,),
                           history_length=D, long_seq_length=3, model_type="din",
                           embedding_dim=4)).score_candidates(candidate_inputs())
    with pytest.raises(SimConfigError, match="--num_heads"):
        SimConfig(user_cardinalities=(5,), item_cardinalities=(20,), history_length=D,
                  long_seq_length=3, model_type="hstu", embedding_dim=4,
                  hstu_heads=3).validate()


HSTU = ["--model_type", "hstu", "--num_blocks", "1", "--embedding_dim", "8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("sim_hstu")
    return {"long": synthetic(base / "long", "long", 2000, seed=1),
            "tiny": synthetic(base / "tiny", "long", 300, seed=3)}


def test_hstu_learns_the_long_signal(data, tmp_path):
    """The target's category must be found among ~90 older behaviours (test users unseen)."""
    auc = final_auc(train(data["long"], tmp_path, *HSTU, "--epochs", "2"))
    assert auc > 0.8, auc


def test_resume_equals_uninterrupted(data, tmp_path):
    args = HSTU + ["--print_freq", "1", "--dropout_rate", "0.3", "--seed", "5",
                   "--global_batch_size", "64"]
    whole = train(data["tiny"], tmp_path / "whole", "--epochs", "2", *args)
    ckpt = str(tmp_path / "ckpt")
    first = train(data["tiny"], tmp_path / "first", "--epochs", "1",
                  "--save_checkpoint_path", ckpt, *args)
    second = train(data["tiny"], tmp_path / "second", "--epochs", "2",
                   "--load_checkpoint_path", ckpt, *args)
    assert len(step_losses(whole)) == 8
    assert step_losses(first) + step_losses(second) == step_losses(whole)
    assert final_auc(second) == final_auc(whole)


def test_keep_best_checkpoint_and_export_serve_the_same_model(data, tmp_path):
    """--keep_best: the checkpoint and the SavedModel are one state; the SavedModel's
    probabilities are that checkpoint's model's (restored here by hand)."""
    from core.columnar import open_reader
    from core.parallel.comm import make_communicator
    from core.sources import load_spec
    from sim import main as sim_main
    from sim.contract import SIM_CONTRACT
    from sim.data import model_inputs, model_shape
    from sim.trainer import SimTrainer
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "saved_model")
    train(data["tiny"], tmp_path / "t", *HSTU, "--epochs", "2", "--keep_best",
          "--save_checkpoint_path", ckpt, "--export_path", export)
    spec = load_spec(data["tiny"], SIM_CONTRACT)
    config = SimConfig(**model_shape(spec), model_type="hstu", embedding_dim=8, hstu_blocks=1,
                       stage_two_mlp_dims=(32, 16))
    trainer = SimTrainer(SimModel(config), make_communicator())
    sim_main.restore(trainer, ckpt, trainer.comm)
    batch = open_reader(spec, "test", 10).get(0)
    want = tf.sigmoid(trainer.model.forward(trainer.model.lookup(
        {k: [tf.constant(i, tf.int64) for i in v] for k, v in model_inputs(spec, batch).items()},
        training=False))[0]).numpy()
    serve = tf.saved_model.load(export).signatures["serving_default"]
    names = serve.structured_input_signature[1]
    got = serve(**{k: tf.constant(batch[k], names[k].dtype) for k in names})["probabilities"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_open_vocabulary_ids_train(tmp_path):
    from test_sim_dynamic import hashed_copy
    base = synthetic(tmp_path / "base", "long", 600, seed=4)
    data = hashed_copy(base, str(tmp_path / "hashed"))
    records = train(data, tmp_path / "a", *HSTU, "--epochs", "3", "--save_checkpoint_path",
                    str(tmp_path / "ck"))
    assert final_auc(records) > 0.6
    with np.load(tmp_path / "ck" / "arrays.npz") as saved:
        keys = saved["dynamic_map/item_table_0/keys"]
    assert len(keys) > 100 and (keys < 0).any() and 0 not in keys


def test_two_horovod_processes_make_the_one_process_update(data, tmp_path):
    require_or_skip(os.path.exists(HOROVODRUN), "horovodrun is not installed")
    args = SMALL + ["--dataset_dir", data["tiny"]] + HSTU + ["--epochs", "1", "--print_freq",
                                                             "1", "--global_batch_size", "60"]
    one = train(data["tiny"], tmp_path / "one", *args[len(SMALL) + 2:])
    done = bounded_run(horovodrun(2, sys.executable, "-m", "sim.main", "--results_dir",
                                  str(tmp_path / "two"), *args), 300)
    assert done.returncode == 0, done.stderr[-3000:]
    from core.dllog import read_log
    two = read_log(str(tmp_path / "two" / "log.json"))
    assert len(step_losses(one)) == 4
    np.testing.assert_allclose(step_losses(two), step_losses(one), rtol=0, atol=1e-5)
    assert abs(final_auc(two) - final_auc(one)) < 1e-4
