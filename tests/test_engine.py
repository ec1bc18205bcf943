"""The core training engine on a toy task (one table, one dense weight): float16 compute
with dynamic loss scaling skips an overflowing step and halves the scale, a clean step is
applied as float32 computes it, and a diverged run is one `error:` line through cli.run_cli.
The families' own tests check that each of them ends a NaN run with that line."""
import numpy as np
import pytest
import tensorflow as tf

from core.cli import run_cli
from training.loss_scale import DynamicLossScale
from core.optimizers import SGD
from training import (OptimizerGroup, TableDeclaration, TableGradient, Trainer,
                      TrainingDivergedError, table_bookkeeping)
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share

ROWS = 8


class OneRank:
    rank, size = 0, 1

    @staticmethod
    def allreduce_sum(tensor, name=None):
        return tensor


class ToyTask:
    """logit = <table[id], w>; the loss is the mean logistic loss."""
    lookup_collectives = ()

    def __init__(self):
        self.table = tf.Variable(np.full([5, 3], 0.5, np.float32))
        self.w = tf.Variable(np.array([0.5, -0.25, 1.0], np.float32))
        self.dense_variables = {"w": self.w}
        self.tables = [TableGradient("t", self.table, True)]

    def lookup(self, batch):
        return tf.nn.embedding_lookup(self.table, batch[0]), None, []

    @staticmethod
    def dense_inputs(batch, step):
        return batch[1]

    def loss(self, label, embedded, context, dtype):
        logit = tf.linalg.matvec(tf.cast(embedded, dtype), tf.cast(self.w, dtype))
        return mean_share(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=label, logits=tf.cast(logit, tf.float32)), ROWS)

    def predict(self, batch, dtype):
        return tf.sigmoid(tf.linalg.matvec(tf.nn.embedding_lookup(self.table, batch[0]), self.w))


def toy_trainer(dtype, learning_rate=0.5):
    task = ToyTask()
    group = OptimizerGroup(SGD(), lambda step: learning_rate, (task.w, task.table))
    return Trainer(task, OneRank(), [group], dtype, divergence_hint="Lower the rate."), task


BATCH = (tf.constant([0, 1, 2, 3, 0, 1, 4, 4]), tf.constant([1, 0, 1, 1, 0, 0, 1, 0], tf.float32))


def numpy_step(table, w, learning_rate=0.5):
    """The SGD step of the toy model in float64."""
    ids, label = (t.numpy() for t in BATCH)
    p = 1 / (1 + np.exp(-(table[ids] @ w)))
    residual = (p - label) / ROWS
    table_grad = np.zeros_like(table)
    np.add.at(table_grad, ids, residual[:, None] * w[None, :])
    return table - learning_rate * table_grad, w - learning_rate * residual @ table[ids]


def test_float16_overflow_is_skipped_and_halves_the_scale_then_a_step_applies():
    trainer, task = toy_trainer(tf.float16)
    assert isinstance(trainer.loss_scale, DynamicLossScale)
    trainer.loss_scale.scale.assign(2.0 ** 30)  # gradient * 2**30 overflows float16
    before = task.table.numpy().copy(), task.w.numpy().copy()
    assert np.isfinite(float(trainer.train_step(BATCH, 0)))
    assert float(trainer.loss_scale.scale.numpy()) == 2.0 ** 29
    np.testing.assert_array_equal(task.table.numpy(), before[0])
    np.testing.assert_array_equal(task.w.numpy(), before[1])

    trainer.loss_scale.scale.assign(2.0 ** 8)
    trainer.train_step(BATCH, 1)
    assert float(trainer.loss_scale.scale.numpy()) == 2.0 ** 8
    table, w = numpy_step(*(a.astype(np.float64) for a in before))
    np.testing.assert_allclose(task.table.numpy(), table, atol=2e-3)
    np.testing.assert_allclose(task.w.numpy(), w, atol=2e-3)
    trainer.check_diverged()


def test_float32_step_matches_numpy_without_scaling():
    trainer, task = toy_trainer(tf.float32)
    assert not trainer.loss_scale.needed
    before = task.table.numpy().astype(np.float64), task.w.numpy().astype(np.float64)
    trainer.train_step(BATCH, 0)
    table, w = numpy_step(*before)
    np.testing.assert_allclose(task.table.numpy(), table, rtol=1e-5)
    np.testing.assert_allclose(task.w.numpy(), w, rtol=1e-5)


def test_divergence_is_one_error_line_naming_the_first_bad_step(capsys):
    trainer, _ = toy_trainer(tf.float32, learning_rate=1e30)
    losses = [float(trainer.train_step(BATCH, s)) for s in range(6)]
    first_bad = next(s for s, loss in enumerate(losses)
                     if not np.isfinite(loss) or loss > DEFAULT_DIVERGENCE_FACTOR * losses[0])
    with pytest.raises(TrainingDivergedError, match=rf"at step {first_bad}\b"):
        trainer.check_diverged()
    assert run_cli(trainer.check_diverged) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: loss became") and "\n" not in err
    assert "Lower the rate." in err and "learning rate 1e+30" in err


def test_table_bookkeeping_follows_the_declarations():
    """Replicated iff neither routed nor exchanged; distinct rows only where not routed; a
    rare-row sum only for a routed dynamic table; each routed lookup's collectives once, in
    declaration order; a frozen table gets no gradient but keeps its lookup's collectives."""
    var = {n: tf.Variable(tf.zeros([4, 2]), name=n) for n in "abcdef"}
    frozen = tf.Variable(tf.zeros([4, 2]), trainable=False)
    tables, collectives = table_bookkeeping([
        TableDeclaration("a", var["a"], dynamic=True, distinct_rows=True),
        TableDeclaration("b", var["b"], routed_lookup="routed_x", dynamic=True,
                         distinct_rows=True),
        TableDeclaration("c", var["c"], routed_lookup="routed_x"),
        TableDeclaration(3, var["d"], exchanged=True, dynamic=True),
        TableDeclaration("e", var["e"], routed_lookup="routed_e"),
        TableDeclaration("f", frozen, routed_lookup="routed_f")])
    assert tables == [
        TableGradient("a", var["a"], replicated=True, distinct_rows=True),
        TableGradient("b", var["b"], replicated=False, row_zero_sum="rare_row_grad_table_b"),
        TableGradient("c", var["c"], replicated=False),
        TableGradient(3, var["d"], replicated=False),
        TableGradient("e", var["e"], replicated=False)]
    assert collectives == ["routed_x_ids", "routed_x_vectors", "routed_x_vectors_grad",
                           "routed_e_ids", "routed_e_vectors", "routed_e_vectors_grad",
                           "routed_f_ids", "routed_f_vectors", "routed_f_vectors_grad"]
