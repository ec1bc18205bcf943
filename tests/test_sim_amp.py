"""Float16 training with dynamic loss scaling (the core's loss_scale.py), the bfloat16
forward pass (--amp on a CPU) against float32, and NVIDIA's defaults for the seed, repeat,
prefetch and affinity flags."""
import numpy as np
import pytest
import tensorflow as tf

from test_sim_training import final_auc, train


def float16_trainer(monkeypatch):
    """A SimTrainer computing in float16 (what --amp gives on a GPU), here on the CPU."""
    from core.parallel.comm import make_communicator
    from sim.model import SimConfig, SimModel
    from sim.trainer import SimTrainer
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: ["GPU:0"])
    config = SimConfig((20,), (30, 5), 8, long_seq_length=4, stage_one_mlp_dims=(8,),
                       stage_two_mlp_dims=(8,), aux_mlp_dims=(8,), attention_mlp_dims=(8,))
    return SimTrainer(SimModel(config), make_communicator(), amp=True)


def batch(rows=16, seed=0):
    rng = np.random.default_rng(seed)
    history = np.where(np.arange(8)[None, :] >= 3, rng.integers(1, 31, (rows, 8)), 0)
    inputs = {"user": [tf.constant(rng.integers(1, 21, rows))],
              "target": [tf.constant(rng.integers(1, 31, rows)),
                         tf.constant(rng.integers(1, 6, rows))],
              "positive": [tf.constant(history), tf.constant(history % 5 + (history > 0))],
              "negative": [tf.constant(history), tf.constant(history % 5 + (history > 0))]}
    return inputs, tf.constant(rng.integers(0, 2, rows), tf.float32), tf.constant(rows)


def test_float16_overflow_skips_the_step_and_halves_the_scale(monkeypatch):
    trainer = float16_trainer(monkeypatch)
    assert trainer.compute_dtype == tf.float16 and trainer.loss_scale.dynamic
    trainer.loss_scale.scale.assign(2.0 ** 40)  # scaled float16 gradients overflow
    before = {k: v.numpy().copy() for k, v in trainer.variables().items()}
    trainer.train_step(batch(), 0)
    assert trainer.loss_scale.scale.numpy() == 2.0 ** 39
    for name, value in trainer.variables().items():
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)


def test_float16_step_with_a_sane_scale_matches_float32(monkeypatch):
    """A scale of 2**10 keeps every gradient finite: the step is applied, its loss is the
    float32 step's within float16 precision, and the scale is unchanged."""
    trainer = float16_trainer(monkeypatch)
    trainer.loss_scale.scale.assign(2.0 ** 10)
    monkeypatch.undo()
    from core.parallel.comm import make_communicator
    from sim.trainer import SimTrainer
    reference = SimTrainer(trainer.model.__class__(trainer.model.config), make_communicator())
    before = trainer.tables["item_table_0"].numpy().copy()
    loss16 = float(trainer.train_step(batch(seed=1), 0))
    loss32 = float(reference.train_step(batch(seed=1), 0))
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    assert trainer.loss_scale.scale.numpy() == 2.0 ** 10
    assert not np.array_equal(trainer.tables["item_table_0"].numpy(), before)


def test_reference_defaults_are_accepted(tmp_path):
    """--seed -1 (a random seed, logged), --repeat_count 0 (one pass), --prefetch_* -1
    (autotune), --num_parallel_calls, --affinity, --optimizer lazy_adam."""
    from test_sim_training import synthetic
    data = synthetic(tmp_path / "d", "long", 300, seed=3)
    records = train(data, tmp_path / "r", "--seed", "-1", "--repeat_count", "0",
                    "--prefetch_train_size", "-1", "--prefetch_test_size", "-1",
                    "--num_parallel_calls", "2", "--affinity", "disabled", "--epochs", "1",
                    "--optimizer", "lazy_adam", "--global_batch_size", "60")
    params = [r["data"] for r in records if r["step"] == "PARAMETER"][0]
    assert params["seed"] >= 0
    final = [r["data"] for r in records if r["step"] == []][-1]
    assert final["step"] == 4 and final["train_samples"] == 240  # 240 rows / 60, one pass
    assert 0 <= final_auc(records) <= 1


@pytest.mark.parametrize("model_type,architecture,interaction", [
    ("sim", "reference", "dot"), ("sim", "compact", "activation_unit"),
    ("dien", "reference", "dot"), ("din", "compact", "activation_unit")])
def test_bfloat16_forward_follows_float32(model_type, architecture, interaction):
    """--amp on a CPU (bfloat16, 8 significant bits) through the GRU, AUGRU, attention and
    the GSU's selection: the same logits as float32 within a few 2^-8 of their scale."""
    from sim.model import SimConfig, SimModel
    config = SimConfig((20,), (30, 5), 8, model_type=model_type, long_seq_length=4,
                       stage_one_mlp_dims=(16,), stage_two_mlp_dims=(32, 16),
                       aux_mlp_dims=(8,), attention_mlp_dims=(16, 8), gsu_top_k=2,
                       architecture=architecture, item_item_interaction=interaction)
    model = SimModel(config)
    embedded = model.lookup(batch(rows=256, seed=2)[0], training=False)
    full, _, _ = model.forward(embedded)
    half, _, _ = model.forward(embedded, tf.bfloat16)
    assert half.dtype == tf.float32
    error = np.abs(half.numpy() - full.numpy()).max()
    assert 0 < error < 0.03 * np.abs(full.numpy()).max()  # 0: bfloat16 was not used
    assert np.corrcoef(half.numpy(), full.numpy())[0, 1] > 0.999
