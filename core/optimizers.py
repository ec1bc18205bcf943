"""Optimizers applied by hand: dense updates for data-parallel variables, sparse (row-wise)
updates for embedding tables, so a step touches only the looked-up rows of a table; and the
learning-rate schedule (linear warmup, constant, polynomial decay to zero), a pure function
of the step, so a resumed run needs only the step to continue it."""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from core import fused_ops

OPTIMIZERS = ("sgd", "adam")


class SGD:
    slot_names = ()

    def slots(self, name: str) -> dict:
        return {}

    def reset_rows(self, var, rows):
        pass

    def apply_dense(self, var, grad, lr):
        # one in-place kernel (var -= lr * grad) instead of a multiply into a temporary and
        # a subtraction
        tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=tf.cast(lr, var.dtype),
                                                delta=grad)

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr, distinct_rows=False):
        # both add duplicate indices' contributions: exactly the summed gradient
        sgd_rows = fused_ops.sgd_rows(var)
        if sgd_rows is not None and grad.values.dtype == tf.float32:
            sgd_rows(var.handle, grad.indices, grad.values, tf.cast(lr, tf.float32))
            return
        var.scatter_sub(tf.IndexedSlices(lr * grad.values, grad.indices, grad.dense_shape))

    def finish_step(self):
        pass


class Adam:
    """Adam for dense variables; lazy Adam for tables (moments of a row are updated only when
    the row appears in the batch, as in LazyAdam).

    apply_sparse(..., distinct_rows=True): the gradient holds each row once (a lookup that
    deduplicated its ids), so the rows are not sorted and summed again."""

    slot_names = ("m", "v")
    weight_decay = 0.0  # AdamW's

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

    def reset_rows(self, var, rows):
        """Rows a dynamic table gave to new ids start with zero moments."""
        for slot in self._by_ref[var.ref()]:
            _fill_rows(slot, rows, 0.0)

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
        # one in-place kernel for the moments and the variable; the same arithmetic as the
        # sparse rows below (bias-corrected rate, epsilon added to sqrt(v))
        m, v = self._by_ref[var.ref()]
        t = tf.cast(self.iterations + 1, var.dtype)
        constant = lambda x: tf.constant(x, var.dtype)  # noqa: E731
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=m.handle, v=v.handle, beta1_power=constant(self.beta_1) ** t,
            beta2_power=constant(self.beta_2) ** t, lr=tf.cast(lr, var.dtype),
            beta1=constant(self.beta_1), beta2=constant(self.beta_2),
            epsilon=constant(self.epsilon), grad=grad)

    def _summed_rows(self, var, grad: tf.IndexedSlices):
        return _unique_rows(var, grad)

    def _row_step(self, var, rows, m_rows, v_rows, lr):
        step = self._corrected_lr(lr) * m_rows / (tf.sqrt(v_rows) + self.epsilon)
        if self.weight_decay:
            step += lr * self.weight_decay * tf.gather(var, rows)
        return step

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr, distinct_rows=False):
        m, v = self._by_ref[var.ref()]
        rows, g = (grad.indices, grad.values) if distinct_rows else self._summed_rows(var, grad)
        fused = fused_ops.lazy_adam_rows(var)
        if fused is not None:  # one pass over the rows instead of five gathers / scatters
            fused(var=var.handle, m=m.handle, v=v.handle, indices=rows, grad=g,
                  lr_t=self._corrected_lr(lr), beta1=self.beta_1, beta2=self.beta_2,
                  epsilon=self.epsilon, decay=tf.cast(lr * self.weight_decay, tf.float32))
            return
        m_rows = self.beta_1 * tf.gather(m, rows) + (1 - self.beta_1) * g
        v_rows = self.beta_2 * tf.gather(v, rows) + (1 - self.beta_2) * tf.square(g)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        var.scatter_sub(tf.IndexedSlices(self._row_step(var, rows, m_rows, v_rows, lr), rows))

    def finish_step(self):
        self.iterations.assign_add(1)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): each updated variable also
    shrinks by lr * weight_decay * value; a table only in the rows of the batch, as its lazy
    moments. Duplicate rows of a sparse gradient are summed after sorting (segment_sum), which
    is deterministic, unlike an unsorted segment sum. weight_decay=0 is plain (lazy) Adam."""

    def __init__(self, variables: dict, weight_decay: float = 0.0, **kwargs):
        super().__init__(variables, **kwargs)
        self.weight_decay = float(weight_decay)

    def apply_dense(self, var, grad, lr):
        if self.weight_decay:
            var.assign_sub(lr * self.weight_decay * var)
        super().apply_dense(var, grad, lr)

    def _summed_rows(self, var, grad: tf.IndexedSlices):
        order = tf.argsort(grad.indices, stable=True)
        rows, position = fused_ops.distinct_ids(tf.gather(grad.indices, order), var.shape[0])
        return rows, tf.math.segment_sum(tf.gather(grad.values, order), position)


def make_optimizer(name: str, variables: dict, weight_decay: float = None):
    """variables: every trainable variable by checkpoint name (dense and tables).
    weight_decay: None where the family has no such flag (DLRM: Adam), else AdamW's decoupled
    decay (SIM's --weight_decay, which SGD does not take)."""
    if name == "sgd" and not weight_decay:
        return SGD()
    if name == "adam":
        return Adam(variables) if weight_decay is None else AdamW(variables, weight_decay)
    decay = "" if weight_decay is None else f" (sgd without --weight_decay, found {weight_decay})"
    raise ValueError(f"--optimizer must be one of {OPTIMIZERS}{decay}, found '{name}'")


def _fill_rows(slot, rows, value: float):
    slot.scatter_update(tf.IndexedSlices(
        tf.fill(tf.stack([tf.size(rows), tf.shape(slot)[1]]), tf.constant(value, slot.dtype)),
        rows))


def _unique_rows(var, grad: tf.IndexedSlices):
    """Distinct rows of a sparse gradient of var and each row's summed gradient."""
    rows, position = fused_ops.distinct_ids(grad.indices, var.shape[0])
    return rows, fused_ops.segment_sum_rows(grad.values, position, tf.shape(rows)[0])


class FTRL:
    """FTRL-Proximal (McMahan et al. 2013) with the per-coordinate rate of Keras' Ftrl
    (learning_rate_power -0.5). A table row's accumulator, linear term and weight change only
    when the row is in the batch; the weight is a function of (linear, accumulator), so the
    weights must start at zero for a consistent state."""

    slot_names = ("accumulator", "linear")

    def __init__(self, variables: dict, initial_accumulator_value=0.1, l1=0.0, l2=0.0):
        self.l1, self.l2, self.initial_accumulator_value = l1, l2, initial_accumulator_value
        self._slots, self._by_ref = {}, {}
        for name, var in variables.items():
            slots = {"accumulator": tf.Variable(tf.fill(var.shape, initial_accumulator_value),
                                                trainable=False, name=f"{var.name[:-2]}_acc"),
                     "linear": tf.Variable(tf.zeros_like(var), trainable=False,
                                           name=f"{var.name[:-2]}_linear")}
            self._slots[name] = slots
            self._by_ref[var.ref()] = slots

    def slots(self, name: str) -> dict:
        return self._slots.get(name, {})

    def reset_rows(self, var, rows):
        """Rows a dynamic table gave to new ids start as every row does."""
        slots = self._by_ref[var.ref()]
        _fill_rows(slots["accumulator"], rows, self.initial_accumulator_value)
        _fill_rows(slots["linear"], rows, 0.0)

    def _rows(self, var, acc, linear, g, lr):
        new_acc = acc + tf.square(g)
        sigma = (tf.sqrt(new_acc) - tf.sqrt(acc)) / lr
        new_linear = linear + g - sigma * var
        quadratic = tf.sqrt(new_acc) / lr + 2 * self.l2
        shrunk = (tf.sign(new_linear) * self.l1 - new_linear) / quadratic
        return tf.where(tf.abs(new_linear) > self.l1, shrunk, tf.zeros_like(var)), new_acc, \
            new_linear

    def apply_dense(self, var, grad, lr):
        s = self._by_ref[var.ref()]
        new_var, new_acc, new_linear = self._rows(var, s["accumulator"], s["linear"], grad, lr)
        s["accumulator"].assign(new_acc)
        s["linear"].assign(new_linear)
        var.assign(new_var)

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr, distinct_rows=False):
        s = self._by_ref[var.ref()]
        rows, g = (grad.indices, grad.values) if distinct_rows else _unique_rows(var, grad)
        new_var, new_acc, new_linear = self._rows(
            tf.gather(var, rows), tf.gather(s["accumulator"], rows),
            tf.gather(s["linear"], rows), g, lr)
        s["accumulator"].scatter_update(tf.IndexedSlices(new_acc, rows))
        s["linear"].scatter_update(tf.IndexedSlices(new_linear, rows))
        var.scatter_update(tf.IndexedSlices(new_var, rows))

    def finish_step(self):
        pass


class RMSProp:
    """RMSProp without momentum: ms = rho*ms + (1-rho)*g^2, w -= lr*g/(sqrt(ms)+eps). A table
    row's mean square decays only when the row is in the batch (lazy, like LazyAdam)."""

    slot_names = ("ms",)

    def __init__(self, variables: dict, rho=0.9, epsilon=1e-7):
        self.rho, self.epsilon = rho, epsilon
        self._slots, self._by_ref = {}, {}
        for name, var in variables.items():
            ms = tf.Variable(tf.zeros_like(var), trainable=False, name=f"{var.name[:-2]}_ms")
            self._slots[name] = {"ms": ms}
            self._by_ref[var.ref()] = ms

    def slots(self, name: str) -> dict:
        return self._slots.get(name, {})

    def reset_rows(self, var, rows):
        _fill_rows(self._by_ref[var.ref()], rows, 0.0)

    def _step(self, ms, g, lr):
        new_ms = self.rho * ms + (1 - self.rho) * tf.square(g)
        return new_ms, lr * g / (tf.sqrt(new_ms) + self.epsilon)

    def apply_dense(self, var, grad, lr):
        ms = self._by_ref[var.ref()]
        new_ms, step = self._step(ms, grad, lr)
        ms.assign(new_ms)
        var.assign_sub(step)

    def apply_sparse(self, var, grad: tf.IndexedSlices, lr, distinct_rows=False):
        ms = self._by_ref[var.ref()]
        rows, g = (grad.indices, grad.values) if distinct_rows else _unique_rows(var, grad)
        new_ms, step = self._step(tf.gather(ms, rows), g, lr)
        ms.scatter_update(tf.IndexedSlices(new_ms, rows))
        sgd_rows = fused_ops.sgd_rows(var)
        if sgd_rows is not None and step.dtype == tf.float32:
            # var[rows] -= 1 * step: ResourceScatterSub's bits, without its TF 2.21 slowness
            sgd_rows(var.handle, rows, step, tf.constant(1.0))
        else:
            var.scatter_sub(tf.IndexedSlices(step, rows))

    def finish_step(self):
        pass


@dataclass(frozen=True)
class LearningRateSchedule:
    base_learning_rate: float
    warmup_steps: int = 8000
    decay_start_step: int = 48000
    decay_steps: int = 24000
    decay_power: float = 2.0

    def __post_init__(self):
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and decay_steps "
                             f"({self.decay_steps}) must be >= 0")
        if self.decay_steps > 0 and self.decay_start_step < self.warmup_steps:
            raise ValueError(f"decay_start_step ({self.decay_start_step}) must not come before "
                             f"the end of warmup (warmup_steps={self.warmup_steps})")

    def __call__(self, step: int) -> float:
        """Learning rate for the update made at `step` (0-based)."""
        lr = self.base_learning_rate
        if step < self.warmup_steps:
            return lr * step / self.warmup_steps
        if self.decay_steps <= 0 or step < self.decay_start_step:
            return lr
        remaining = self.decay_start_step + self.decay_steps - step
        if remaining <= 0:
            return 0.0
        return lr * (remaining / self.decay_steps) ** self.decay_power
