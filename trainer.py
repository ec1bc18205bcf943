"""The training and prediction steps of one rank (any world size).

A step is split at the embedding output: the lookups (and, with several processes, the
all-to-all) run under one tape; everything after them runs in `dense_forward_backward`,
which --xla compiles. Dense gradients are summed across ranks; table gradients stay sparse
and flow back to the rank that owns the rows.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from lr_scheduler import LearningRateSchedule
from optimizers import make_optimizer


class TrainingDivergedError(RuntimeError):
    pass


class Trainer:
    def __init__(self, model, optimizer: str, schedule: LearningRateSchedule, amp: bool = False,
                 loss_scale: float = 1.0, xla: bool = False, run_eagerly: bool = False,
                 compute_dtype=None):
        self.model, self.comm, self.schedule = model, model.comm, schedule
        self.amp = amp
        if compute_dtype is None:
            on_gpu = bool(tf.config.list_logical_devices("GPU"))
            compute_dtype = (tf.float16 if on_gpu else tf.bfloat16) if amp else tf.float32
        self.compute_dtype = compute_dtype
        self.loss_scale = float(loss_scale) if amp else 1.0
        self.dense_vars = model.dense_variables()
        self.table_pairs = [(piece, var) for piece, var in model.embeddings.all_variables()
                            if var.trainable]
        trainable = dict(self.dense_vars)
        trainable.update({f"table/{i}": var for i, (_, var) in enumerate(self.table_pairs)})
        self.optimizer = make_optimizer(optimizer, trainable)
        self.replicated = {var.ref() for var in model.embeddings.replicated_variables.values()}
        dense_fn = self._dense_forward_backward
        if xla and not run_eagerly:
            dense_fn = tf.function(dense_fn, jit_compile=True)
        self._dense_fn = dense_fn
        step, predict = self._train_step, self._predict_step
        if not run_eagerly:
            step, predict = tf.function(step), tf.function(predict)
        self._step_fn, self._predict_fn = step, predict

    def _local_rows(self, global_rows):
        rank, size = self.comm.rank, self.comm.size
        return global_rows * rank // size, global_rows * (rank + 1) // size

    def _dense_forward_backward(self, numerical, embedded, label, global_rows):
        dense = list(self.dense_vars.values())
        with tf.GradientTape() as tape:
            tape.watch(embedded)
            logits = self.model.forward_dense(numerical, embedded, self.compute_dtype)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            # Sum over local rows / global rows: summed over ranks this is the global mean.
            loss = tf.reduce_sum(losses) / tf.cast(global_rows, tf.float32)
            scaled = loss * self.loss_scale if self.loss_scale != 1.0 else loss
        grads = tape.gradient(scaled, dense + [embedded])
        if self.loss_scale != 1.0:
            grads = [g / self.loss_scale for g in grads]
        return loss, grads[:-1], grads[-1]

    def _train_step(self, numerical, categorical, label, global_rows, lr):
        local_rows = self._local_rows(global_rows)
        table_vars = [var for _, var in self.table_pairs]
        with tf.GradientTape() as tape:
            embedded = self.model.embeddings(categorical, local_rows)
        loss, dense_grads, embedded_grad = self._dense_fn(numerical, embedded, label,
                                                          global_rows)
        table_grads = tape.gradient(embedded, table_vars, output_gradients=embedded_grad)
        for var, grad in zip(self.dense_vars.values(), dense_grads):
            self.optimizer.apply_dense(var, self.comm.allreduce_sum(grad), lr)
        for var, grad in zip(table_vars, table_grads):
            if var.ref() in self.replicated:
                grad = self.comm.allreduce_sum(grad)
            if not isinstance(grad, tf.IndexedSlices):
                grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0]))
            self.optimizer.apply_sparse(var, grad, lr)
        self.optimizer.finish_step()
        return self.comm.allreduce_sum(loss)

    def _predict_step(self, numerical, categorical, global_rows):
        logits = self.model(numerical, categorical, self._local_rows(global_rows),
                            self.compute_dtype)
        return tf.sigmoid(logits)

    def train_step(self, batch, step: int) -> float:
        """One update at schedule step `step`; returns the global mean loss."""
        numerical, categorical, label, global_rows = batch
        lr = tf.constant(self.schedule(step), tf.float32)
        loss = float(self._step_fn(numerical, list(categorical), label, global_rows, lr))
        if not np.isfinite(loss):
            raise TrainingDivergedError(
                f"loss became {loss} at step {step} (learning rate {float(lr):g}); training "
                f"stopped, no checkpoint was written for this state. Lower --learning_rate, "
                f"lengthen --warmup_steps or, with --amp, lower --loss_scale.")
        return loss

    def predict(self, batch):
        """Click probabilities for this rank's local rows of the batch."""
        numerical, categorical, _, global_rows = batch
        return self._predict_fn(numerical, list(categorical), global_rows)
