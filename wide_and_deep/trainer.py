"""Training and prediction steps of one data-parallel rank.

The step is split at the table lookups, as in DLRM's trainer: lookups run under one tape,
everything after them in `_dense_forward_backward` (compiled by --xla). Gradients are summed
over ranks with data_parallel.sum_gradients (tables stay tf.IndexedSlices), then FTRL updates
the wide part and RMSProp the deep part, tables row by row.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from data_parallel import sum_gradients
from optimizers import FTRL, RMSProp

# The reference's RMSProp decay for the deep part.
DEEP_RHO = 0.5


class TrainingDivergedError(RuntimeError):
    pass


class WideDeepTrainer:
    def __init__(self, model, comm, label: str, linear_learning_rate: float, deep_schedule,
                 seed: int = 0, amp: bool = False, xla: bool = False):
        self.model, self.comm, self.deep_schedule = model, comm, deep_schedule
        self.label = label
        self.linear_learning_rate, self.seed = linear_learning_rate, seed
        self.wide_optimizer = FTRL(model.wide_variables())
        self.deep_optimizer = RMSProp(model.deep_variables(), rho=DEEP_RHO)
        wide_refs = {v.ref() for v in model.wide_variables().values()}
        self._is_wide = [v.ref() in wide_refs for v in model.dense_variables()]
        self._table_is_wide = [v.ref() in wide_refs for v in model.table_variables()]
        on_gpu = bool(tf.config.list_logical_devices("GPU"))
        self.compute_dtype = (tf.float16 if on_gpu else tf.bfloat16) if amp else tf.float32
        # float16 gradients of a mean loss underflow; bfloat16 has float32's range.
        self.loss_scale = 1024.0 if self.compute_dtype == tf.float16 else 1.0
        if xla and any(map(model.config.projected, model.config.tables)):
            raise ValueError("--xla needs the same shapes every step: build the model with "
                             "project_max_rows=0 (no projected tables)")
        dense_fn = self._dense_forward_backward
        self._dense_fn = tf.function(dense_fn, jit_compile=True) if xla else dense_fn
        self._step_fn = tf.function(self._train_step)
        self._predict_fn = tf.function(self._predict)

    def optimizers(self) -> dict:
        return {"wide": self.wide_optimizer, "deep": self.deep_optimizer}

    def _dense_forward_backward(self, numerical, wide_terms, embeddings, layout, label,
                                global_rows, dropout_seed):
        dense = self.model.dense_variables()
        with tf.GradientTape() as tape:
            tape.watch([wide_terms, embeddings])
            logits = self.model.logits(numerical, wide_terms, embeddings, layout, True,
                                       dropout_seed, self.compute_dtype)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            # this rank's rows / global rows: summed over ranks, the global mean
            loss = tf.reduce_sum(losses) / tf.cast(global_rows, tf.float32)
            scaled = loss * self.loss_scale
        grads = tape.gradient(scaled, dense + [wide_terms, embeddings])
        grads = [tf.nest.map_structure(lambda g: g / self.loss_scale, g) for g in grads]
        return loss, grads[:len(dense)], grads[len(dense)], grads[len(dense) + 1]

    def _train_step(self, batch, deep_lr, step):
        tables = self.model.table_variables()
        with tf.GradientTape() as tape:
            wide_terms, embeddings, layout = self.model.lookup(batch)
        dropout_seed = tf.stack([tf.constant(self.seed * 1000 + self.comm.rank, tf.int64),
                                 tf.cast(step, tf.int64) * 64])
        label = tf.cast(batch[self.label], tf.float32)
        loss, dense_grads, wide_grad, emb_grads = self._dense_fn(
            self.model.numerical(batch), wide_terms, embeddings, layout, label,
            batch["__global_rows"], dropout_seed)
        table_grads = tape.gradient([wide_terms] + tf.nest.flatten(embeddings), tables,
                                    output_gradients=[wide_grad] + tf.nest.flatten(emb_grads))
        grads = sum_gradients(self.comm, list(dense_grads) + list(table_grads))
        linear_lr = tf.constant(self.linear_learning_rate, tf.float32)
        n_dense = len(dense_grads)
        for var, grad, wide in zip(self.model.dense_variables(), grads[:n_dense],
                                   self._is_wide):
            opt, lr = (self.wide_optimizer, linear_lr) if wide else (self.deep_optimizer,
                                                                      deep_lr)
            opt.apply_dense(var, grad, lr)
        for var, grad, wide in zip(tables, grads[n_dense:], self._table_is_wide):
            opt, lr = (self.wide_optimizer, linear_lr) if wide else (self.deep_optimizer,
                                                                      deep_lr)
            opt.apply_sparse(var, grad, lr)
        return self.comm.allreduce_sum(loss)

    def _predict(self, batch):
        return tf.sigmoid(self.model(batch, self.compute_dtype))

    def train_step(self, batch: dict, step: int) -> float:
        """One update at global step `step`; returns the global mean loss."""
        lr = tf.constant(self.deep_schedule(step), tf.float32)
        loss = float(self._step_fn(batch, lr, tf.constant(step, tf.int64)))
        if not np.isfinite(loss):
            raise TrainingDivergedError(
                f"loss became {loss} at step {step}; training stopped, no checkpoint was "
                f"written for this state. Lower --deep_learning_rate or "
                f"--linear_learning_rate.")
        return loss

    def predict(self, batch: dict) -> np.ndarray:
        """Click probabilities of this rank's rows of the batch."""
        return self._predict_fn(batch).numpy()
