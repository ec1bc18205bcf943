"""The training step itself: no host sync per step (diverged losses are recorded on the
device and reported naming the step) and dynamic loss scaling for float16 compute."""
import numpy as np
import pytest
import tensorflow as tf

from core.parallel.placement import make_plan
from training.loss_scale import DynamicLossScale, StaticLossScale
from core.optimizers import LearningRateSchedule
from model import DLRM, ModelConfig
from trainer import DlrmTrainer
from training import TrainingDivergedError
from training.engine import DEFAULT_DIVERGENCE_FACTOR

CARDINALITIES = (20, 30)


def tiny_trainer(learning_rate, **kwargs):
    config = ModelConfig(num_numerical=3, cardinalities=CARDINALITIES, embedding_dim=4,
                         bottom_mlp_dims=(8, 4), top_mlp_dims=(6, 1), seed=1)
    model = DLRM(config, make_plan(CARDINALITIES, 4))
    return DlrmTrainer(model, "sgd", LearningRateSchedule(learning_rate, 0, 10**6, 0), **kwargs)


def batch(seed, rows=16):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.standard_normal((rows, 3)), tf.float32),
            tuple(tf.constant(rng.integers(0, c, rows), tf.int32) for c in CARDINALITIES),
            tf.constant(rng.integers(0, 2, rows), tf.float32), tf.constant(rows, tf.int32))


def weights(trainer):
    return [v.numpy().copy() for v in trainer.dense_vars.values()] + \
        [v.numpy().copy() for _, v in trainer.table_pairs]


def test_steps_do_not_fetch_the_loss_and_divergence_names_its_step():
    trainer = tiny_trainer(1e30)
    losses = [trainer.train_step(batch(s), s) for s in range(4)]  # no error, no host value
    assert all(isinstance(loss, tf.Tensor) for loss in losses)
    losses = [float(loss) for loss in losses]
    first_bad = next(s for s, loss in enumerate(losses)
                     if not np.isfinite(loss) or loss > DEFAULT_DIVERGENCE_FACTOR * losses[0])
    with pytest.raises(TrainingDivergedError, match=rf"at step {first_bad}\b"):
        trainer.check_diverged()


def test_finite_training_passes_the_check():
    trainer = tiny_trainer(0.1)
    for s in range(3):
        trainer.train_step(batch(s), s)
    trainer.check_diverged()


def test_float16_overflow_skips_steps_and_halves_the_scale():
    trainer = tiny_trainer(0.1, amp=True, compute_dtype=tf.float16)
    scaler = trainer.loss_scale
    assert isinstance(scaler, DynamicLossScale)
    scaler.scale.assign(2.0 ** 30)  # (p - y) / 16 * 2**30 is far beyond float16's 65504
    scaler.growth_interval = 3
    clean_in_a_row, skipped, applied = 0, 0, 0
    for s in range(25):
        before, scale = weights(trainer), float(scaler.scale.numpy())
        loss = float(trainer.train_step(batch(s), s))
        after, new_scale = weights(trainer), float(scaler.scale.numpy())
        assert np.isfinite(loss) and all(np.isfinite(w).all() for w in after)
        if all(np.array_equal(a, b) for a, b in zip(before, after)):  # skipped
            skipped, clean_in_a_row = skipped + 1, 0
            assert new_scale == scale / 2
        else:
            applied, clean_in_a_row = applied + 1, clean_in_a_row + 1
            grows = clean_in_a_row == 3
            assert new_scale == (scale * 2 if grows else scale)
            clean_in_a_row = 0 if grows else clean_in_a_row
        if s == 0:
            assert skipped == 1
    assert skipped >= 10 and applied >= 6  # 2**30 -> below 2**16 takes > 10 halvings
    trainer.check_diverged()


def test_given_loss_scale_stays_static():
    trainer = tiny_trainer(0.1, amp=True, compute_dtype=tf.float16, loss_scale=128.0)
    assert isinstance(trainer.loss_scale, StaticLossScale) and trainer.loss_scale.scale == 128
    before = weights(trainer)
    assert np.isfinite(float(trainer.train_step(batch(0), 0)))
    assert not np.array_equal(before[0], weights(trainer)[0])
    assert tiny_trainer(0.1, amp=True, compute_dtype=tf.bfloat16).loss_scale.scale == 1.0


def test_dynamic_loss_scale_is_checkpointed_and_resumed(tmp_path):
    from training import checkpoint
    trainer = tiny_trainer(0.1, amp=True, compute_dtype=tf.float16)
    trainer.loss_scale.scale.assign(512.0)
    trainer.loss_scale.clean_steps.assign(7)
    checkpoint.save(str(tmp_path / "f16"), trainer, {"step": 3, "epoch": 0, "batch_in_epoch": 3})
    resumed = tiny_trainer(0.1, amp=True, compute_dtype=tf.float16)
    assert float(resumed.loss_scale.scale.numpy()) == 2.0 ** 15
    checkpoint.restore(str(tmp_path / "f16"), resumed)
    assert float(resumed.loss_scale.scale.numpy()) == 512.0
    assert int(resumed.loss_scale.clean_steps.numpy()) == 7
    # a float32 checkpoint carries no scale: a float16 run restored from it starts at 2^15
    checkpoint.save(str(tmp_path / "f32"), tiny_trainer(0.1), {"step": 0, "epoch": 0,
                                                                "batch_in_epoch": 0})
    fresh = tiny_trainer(0.1, amp=True, compute_dtype=tf.float16)
    checkpoint.restore(str(tmp_path / "f32"), fresh)
    assert float(fresh.loss_scale.scale.numpy()) == 2.0 ** 15


def test_step_collectives_are_a_function_of_the_plan():
    """Ranks holding different pieces issue the same named collectives: two replicated tables
    (which used to get graph-derived names, numbered differently per rank) included."""
    class RankOf:
        def __init__(self, rank):
            self.rank, self.size = rank, 2

    cards = (3000, 2000, 300, 50, 20)
    plan = make_plan(cards, 4, 2, 6000, 250)
    assert plan.replicated == (3, 4) and plan.pieces_on(0) != plan.pieces_on(1)
    config = ModelConfig(num_numerical=3, cardinalities=cards, embedding_dim=4,
                         bottom_mlp_dims=(8, 4), top_mlp_dims=(6, 1), seed=1)
    names = [DlrmTrainer(DLRM(config, plan, RankOf(r)), "sgd",
                     LearningRateSchedule(0.1, 0, 10, 0)).step_collectives() for r in (0, 1)]
    assert names[0] == names[1]
    assert names[0][:2] == ["embedding_alltoall", "embedding_alltoall_grad"]
    assert names[0][-3:] == ["replicated_grad_table_3", "replicated_grad_table_4", "loss"]
