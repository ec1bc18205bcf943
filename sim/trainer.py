"""The SIM/DIEN/DIN training and prediction steps of one data-parallel rank.

The lookups run under an outer tape; everything after them (`_dense_step`, which --xla
compiles) returns the dense gradients and the gradients of the looked-up rows, which the
outer tape turns into sparse (IndexedSlices) table gradients. Gradients are summed over
ranks (tables: rows gathered, never densified); each rank's loss is the sum over its rows
divided by the global batch, so N ranks make the same update as one. Float16 compute
(--amp on a GPU) scales the loss dynamically (the core's loss_scale): a step whose summed
gradients are not finite is skipped and the scale halved.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from data_parallel import sum_gradients
from loss_scale import make_loss_scale
from optimizers import SGD, AdamW

# the embedded tensors that depend on tables (the rest of lookup()'s output are masks)
EMBEDDED = ("user", "target", "history", "short", "short_negative", "long")


class TrainingDivergedError(RuntimeError):
    pass


def make_optimizer(name: str, variables: dict, weight_decay: float):
    if name == "adam":
        return AdamW(variables, weight_decay=weight_decay)
    if name == "sgd" and not weight_decay:
        return SGD()
    raise ValueError(f"--optimizer must be 'adam' or 'sgd' (sgd without --weight_decay), "
                     f"found '{name}' with --weight_decay {weight_decay}")


def input_signature(config) -> dict:
    """TensorSpecs of SimModel.lookup's inputs (ids int64, any batch size)."""
    def ids(count, shape):
        return [tf.TensorSpec(shape, tf.int64) for _ in range(count)]

    items, history = len(config.item_cardinalities), [None, config.history_length]
    return {"user": ids(len(config.user_cardinalities), [None]), "target": ids(items, [None]),
            "positive": ids(items, history), "negative": ids(items, history)}


class SimTrainer:
    def __init__(self, model, comm, optimizer="adam", lr=0.01, weight_decay=0.0, amp=False,
                 xla=False, seed=0):
        self.model, self.comm, self.lr, self.seed = model, comm, float(lr), int(seed)
        self.compute_dtype = ((tf.float16 if tf.config.list_logical_devices("GPU")
                               else tf.bfloat16) if amp else tf.float32)
        self.dense = model.dense_variables()
        self.tables = model.tables()
        self.optimizer = make_optimizer(optimizer, {**self.dense, **self.tables}, weight_decay)
        self.loss_scale = make_loss_scale(self.compute_dtype)
        self._dense_fn = tf.function(self._dense_step, jit_compile=True) if xla \
            else self._dense_step
        # One trace for every batch size (the last batch of an epoch is usually smaller).
        inputs = input_signature(model.config)
        self._train_fn = tf.function(self._train_step, input_signature=[
            inputs, tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.int64)])
        self._predict_fn = tf.function(self._predict_step, input_signature=[inputs])

    def variables(self) -> dict:
        return {**{f"dense/{k}": v for k, v in self.dense.items()},
                **{f"table/{k}": v for k, v in self.tables.items()}}

    def _dense_step(self, embedded, label, global_rows, dropout_seed, scale):
        names = [k for k in EMBEDDED if k in embedded]
        with tf.GradientTape() as tape:
            tape.watch([embedded[k] for k in names])
            logit, gsu_logit, aux = self.model.forward(embedded, self.compute_dtype,
                                                       dropout_seed)
            per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit)
            if gsu_logit is not None:
                per_row += tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                                   logits=gsu_logit)
            if aux is not None:
                per_row += aux
            loss = tf.reduce_sum(per_row) / tf.cast(global_rows, tf.float32)
            scaled = loss * scale if self.loss_scale.needed else loss
        grads = tape.gradient(scaled, list(self.dense.values()) + [embedded[k] for k in names])
        return loss, grads[:len(self.dense)], grads[len(self.dense):]

    def _train_step(self, inputs, label, global_rows, step):
        with tf.GradientTape() as tape:
            embedded = self.model.lookup(inputs)
        names = [k for k in EMBEDDED if k in embedded]
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
        scale = self.loss_scale.scale
        loss, dense_grads, embedded_grads = self._dense_fn(embedded, label, global_rows, seed,
                                                           scale)
        tables = list(self.tables.values())
        table_grads = tape.gradient([embedded[k] for k in names], tables,
                                    output_gradients=embedded_grads)
        grads = sum_gradients(self.comm, list(dense_grads) + list(table_grads))
        if self.loss_scale.dynamic:  # float16: the only scale make_loss_scale gives here
            grads = [tf.IndexedSlices(g.values / scale, g.indices, g.dense_shape)
                     if isinstance(g, tf.IndexedSlices) else g / scale for g in grads]
            # summed gradients are the same on every rank, so every rank decides alike
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(
                g.values if isinstance(g, tf.IndexedSlices) else g)) for g in grads])
            tf.cond(finite, lambda: self._apply(grads), lambda: None)
            self.loss_scale.update(finite)
        else:
            self._apply(grads)
        return self.comm.allreduce_sum(loss)

    def _apply(self, grads):
        lr = tf.constant(self.lr, tf.float32)
        for var, grad in zip(self.dense.values(), grads[:len(self.dense)]):
            self.optimizer.apply_dense(var, grad, lr)
        for var, grad in zip(self.tables.values(), grads[len(self.dense):]):
            self.optimizer.apply_sparse(var, grad, lr)
        self.optimizer.finish_step()

    def _predict_step(self, inputs):
        logit, _, _ = self.model.forward(self.model.lookup(inputs), self.compute_dtype)
        return tf.sigmoid(logit)

    def train_step(self, inputs, label, global_rows, step: int) -> float:
        loss = float(self._train_fn(inputs, label, tf.constant(global_rows, tf.int32),
                                    tf.constant(step, tf.int64)))
        if not np.isfinite(loss):
            raise TrainingDivergedError(f"loss became {loss} at step {step}; lower --lr")
        return loss

    def predict(self, inputs):
        return self._predict_fn(inputs)
