"""The training and prediction steps of one rank (any world size).

A step is split at the embedding output: the lookups (and, with several processes, the
all-to-all) run under one tape; everything after them runs in `dense_forward_backward`,
which --xla compiles. Dense gradients are summed across ranks; table gradients stay sparse
and flow back to the rank that owns the rows.

The step never waits for the host: a non-finite loss is recorded on the device (the first
step it happened at) and `check_finite()` reads that record when the loop reports.
"""
from __future__ import annotations

import tensorflow as tf

from embedding import ALLTOALL_NAMES
from loss_scale import make_loss_scale
from lr_scheduler import LearningRateSchedule
from optimizers import make_optimizer


class TrainingDivergedError(RuntimeError):
    pass


def replicated_gradient_name(table: int) -> str:
    """The collective summing a replicated table's gradient rows: named after the table id of
    the plan, so every rank names it alike whatever else it holds."""
    return f"replicated_grad_table_{table}"


def dense_gradient_name(variable: str) -> str:
    return f"dense_grad_{variable.replace('/', '_')}"


class Trainer:
    def __init__(self, model, optimizer: str, schedule: LearningRateSchedule, amp: bool = False,
                 loss_scale: float = None, xla: bool = False, run_eagerly: bool = False,
                 compute_dtype=None):
        """loss_scale: a static scale under amp; None: dynamic for float16, none otherwise."""
        self.model, self.comm, self.schedule = model, model.comm, schedule
        self.amp = amp
        if compute_dtype is None:
            on_gpu = bool(tf.config.list_logical_devices("GPU"))
            compute_dtype = (tf.float16 if on_gpu else tf.bfloat16) if amp else tf.float32
        self.compute_dtype = compute_dtype
        self.loss_scale = make_loss_scale(compute_dtype, loss_scale if amp else 1.0)
        self.dense_vars = model.dense_variables()
        self.table_pairs = [(piece, var) for piece, var in model.embeddings.all_variables()
                            if var.trainable]
        trainable = dict(self.dense_vars)
        trainable.update({f"table/{i}": var for i, (_, var) in enumerate(self.table_pairs)})
        self.optimizer = make_optimizer(optimizer, trainable)
        self.replicated = {var.ref() for var in model.embeddings.replicated_variables.values()}
        self.diverged_at = tf.Variable(-1, dtype=tf.int64, trainable=False, name="diverged_at")
        self.diverged_loss = tf.Variable(0.0, trainable=False, name="diverged_loss")
        dense_fn = self._dense_forward_backward
        if xla and not run_eagerly:
            dense_fn = tf.function(dense_fn, jit_compile=True)
        self._dense_fn = dense_fn
        step, predict = self._train_step, self._predict_step
        if not run_eagerly:
            step, predict = tf.function(step), tf.function(predict)
        self._step_fn, self._predict_fn = step, predict

    def _dense_forward_backward(self, numerical, embedded, label, global_rows, scale):
        dense = list(self.dense_vars.values())
        with tf.GradientTape() as tape:
            tape.watch(embedded)
            logits = self.model.forward_dense(numerical, embedded, self.compute_dtype)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            # Sum over local rows / global rows: summed over ranks this is the global mean.
            loss = tf.reduce_sum(losses) / tf.cast(global_rows, tf.float32)
            scaled = loss * scale if self.loss_scale.needed else loss
        grads = tape.gradient(scaled, dense + [embedded])
        if self.loss_scale.needed:
            grads = [g / scale for g in grads]
        return loss, grads[:-1], grads[-1]

    def _train_step(self, numerical, categorical, label, global_rows, lr, step):
        table_vars = [var for _, var in self.table_pairs]
        with tf.GradientTape() as tape:
            embedded, sources = self.model.embeddings.lookup(categorical, global_rows)
        loss, dense_grads, embedded_grad = self._dense_fn(numerical, embedded, label,
                                                          global_rows, self.loss_scale.scale)
        # the extra sources keep the backward all-to-all on a rank that holds no piece
        grads = tape.gradient(embedded, table_vars + sources, output_gradients=embedded_grad)
        table_grads, source_grads = grads[:len(table_vars)], grads[len(table_vars):]
        # collectives are named: Horovod matches them across ranks by name, and the names
        # it generates differ between ranks whose graphs differ (e.g. one without tables)
        dense_grads = [self.comm.allreduce_sum(g, name=dense_gradient_name(name))
                       for name, g in zip(self.dense_vars, dense_grads)]
        table_grads = [self._table_gradient(piece, var, g)
                       for (piece, var), g in zip(self.table_pairs, table_grads)]
        if self.loss_scale.dynamic:
            finite = self._all_finite(dense_grads + [g.values for g in table_grads])
            tf.cond(finite, lambda: self._apply(dense_grads, table_grads, lr), lambda: None)
            self.loss_scale.update(finite)
        else:
            self._apply(dense_grads, table_grads, lr)
        loss = self.comm.allreduce_sum(loss, name="loss")
        for grad in source_grads:  # + 0 (no elements): tf.function prunes control-only paths
            loss += tf.reduce_sum(tf.convert_to_tensor(grad))
        self._record_divergence(loss, step)
        return loss

    def step_collectives(self) -> list:
        """The collectives of one training step by name: a function of the placement plan
        and the model alone, hence the same on every rank (Horovod matches them by name)."""
        plan = self.model.plan
        names = list(ALLTOALL_NAMES) if plan.world_size > 1 else []
        names += [dense_gradient_name(name) for name in self.dense_vars]
        names += [replicated_gradient_name(t) for t, var in self.table_pairs
                  if var.ref() in self.replicated]
        return names + (["nonfinite_count"] if self.loss_scale.dynamic else []) + ["loss"]

    def _table_gradient(self, piece, var, grad):
        if var.ref() in self.replicated:  # `piece` is then the table id
            grad = self.comm.allreduce_sum(grad, name=replicated_gradient_name(piece))
        if not isinstance(grad, tf.IndexedSlices):
            grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0]))
        return grad

    def _all_finite(self, grads):
        """True on every rank, or on none: the count of non-finite values is summed."""
        bad = tf.add_n([tf.reduce_sum(tf.cast(~tf.math.is_finite(g), tf.float32))
                        for g in grads])
        return tf.equal(self.comm.allreduce_sum(bad, name="nonfinite_count"), 0.0)

    def _apply(self, dense_grads, table_grads, lr):
        for var, grad in zip(self.dense_vars.values(), dense_grads):
            self.optimizer.apply_dense(var, grad, lr)
        for (_, var), grad in zip(self.table_pairs, table_grads):
            self.optimizer.apply_sparse(var, grad, lr)
        self.optimizer.finish_step()

    def _record_divergence(self, loss, step):
        first = tf.logical_and(~tf.math.is_finite(loss), self.diverged_at < 0)
        self.diverged_at.assign(tf.where(first, step, self.diverged_at))
        self.diverged_loss.assign(tf.where(first, loss, self.diverged_loss))

    def _predict_step(self, numerical, categorical, global_rows):
        logits = self.model(numerical, categorical, global_rows, self.compute_dtype)
        return tf.sigmoid(logits)

    def train_step(self, batch, step: int):
        """One update at schedule step `step`; returns the global mean loss as a tensor,
        without waiting for it (check_finite() tells whether a loss was NaN/inf)."""
        numerical, categorical, label, global_rows = batch
        lr = tf.constant(self.schedule(step), tf.float32)
        return self._step_fn(numerical, list(categorical), label, global_rows, lr,
                             tf.constant(step, tf.int64))

    def check_finite(self) -> None:
        """Raise TrainingDivergedError naming the first step whose loss was not finite."""
        step = int(self.diverged_at.numpy())
        if step < 0:
            return
        raise TrainingDivergedError(
            f"loss became {float(self.diverged_loss.numpy())} at step {step} (learning rate "
            f"{self.schedule(step):g}); training stopped, no checkpoint was written for this "
            f"state. Lower --learning_rate or lengthen --warmup_steps.")

    def predict(self, batch):
        """Click probabilities for this rank's local rows of the batch."""
        numerical, categorical, _, global_rows = batch
        return self._predict_fn(numerical, list(categorical), global_rows)
