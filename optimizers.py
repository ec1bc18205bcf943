"""Optimizers applied by hand: dense updates for data-parallel variables, sparse (row-wise)
updates for embedding tables, so a step touches only the looked-up rows of a table."""
from __future__ import annotations

import tensorflow as tf

OPTIMIZERS = ("sgd", "adam")


class SGD:
    slot_names = ()

    def slots(self, name: str) -> dict:
        return {}

    def apply_dense(self, var, grad, lr):
        var.assign_sub(lr * grad)

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr):
        # ResourceScatterSub adds duplicate indices' contributions: exactly the summed gradient.
        var.scatter_sub(tf.IndexedSlices(lr * grad.values, grad.indices, grad.dense_shape))

    def finish_step(self):
        pass


class Adam:
    """Adam for dense variables; lazy Adam for tables (moments of a row are updated only when
    the row appears in the batch, as in LazyAdam)."""

    slot_names = ("m", "v")

    def __init__(self, variables: dict, beta_1=0.9, beta_2=0.999, epsilon=1e-8):
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_iterations")
        self._slots = {}
        self._by_ref = {}
        for name, var in variables.items():
            m, v = (self._slot(var, slot) for slot in self.slot_names)
            self._slots[name] = {"m": m, "v": v}
            self._by_ref[var.ref()] = (m, v)

    def slots(self, name: str) -> dict:
        return self._slots.get(name, {})

    @staticmethod
    def _slot(var, slot: str):
        # next to its variable: a host-memory (offloaded) table keeps its moments in host memory
        with tf.device(var.device):
            return tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False,
                               name=f"{var.name[:-2]}_{slot}")

    def _corrected_lr(self, lr):
        t = tf.cast(self.iterations + 1, tf.float32)
        return lr * tf.sqrt(1 - self.beta_2 ** t) / (1 - self.beta_1 ** t)

    def apply_dense(self, var, grad, lr):
        m, v = self._by_ref[var.ref()]
        m.assign(self.beta_1 * m + (1 - self.beta_1) * grad)
        v.assign(self.beta_2 * v + (1 - self.beta_2) * tf.square(grad))
        var.assign_sub(self._corrected_lr(lr) * m / (tf.sqrt(v) + self.epsilon))

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr):
        m, v = self._by_ref[var.ref()]
        rows, position = tf.unique(grad.indices)
        g = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(rows)[0])
        m_rows = self.beta_1 * tf.gather(m, rows) + (1 - self.beta_1) * g
        v_rows = self.beta_2 * tf.gather(v, rows) + (1 - self.beta_2) * tf.square(g)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        step = self._corrected_lr(lr) * m_rows / (tf.sqrt(v_rows) + self.epsilon)
        var.scatter_sub(tf.IndexedSlices(step, rows))

    def finish_step(self):
        self.iterations.assign_add(1)


def make_optimizer(name: str, variables: dict):
    """variables: every trainable variable by checkpoint name (dense and tables)."""
    if name == "sgd":
        return SGD()
    if name == "adam":
        return Adam(variables)
    raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, found '{name}'")
