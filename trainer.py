"""DLRM/DCNv2 as a client of the training engine (training/engine.py): the task below says
what DLRM's step looks up (the embedding layer, all-to-all included), what its dense part
computes, which variables the one optimizer updates, and which tables are replicated (their
gradient rows are summed across ranks under the table id's name).
"""
from __future__ import annotations

import tensorflow as tf

from core.optimizers import LearningRateSchedule, make_optimizer
from core.parallel.comm import ALLTOALL_NAMES
from core.parallel.rows import collective_names
from embedding import row_wise_name
from training import OptimizerGroup, TableGradient, Trainer, compute_dtype_for
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share


class DLRMTask:
    def __init__(self, model):
        self.model = model
        self.dense_variables = model.dense_variables()
        replicated = {var.ref() for var in model.embeddings.replicated_variables.values()}
        shared_rare_row = {model.embeddings.table_variable(t).ref(): f"rare_row_grad_table_{t}"
                           for t in model.embeddings.dynamic if t in model.plan.row_wise}
        # the key of a replicated table is its table id; of a model-parallel piece, the piece
        self.tables = [TableGradient(piece, var, var.ref() in replicated,
                                     row_zero_sum=shared_rare_row.get(var.ref(), ""))
                       for piece, var in model.embeddings.all_variables() if var.trainable]
        plan = model.plan
        exchanged = plan.world_size > 1 and any(p.table not in plan.row_wise for p in plan.pieces)
        self.lookup_collectives = (list(ALLTOALL_NAMES) if exchanged else []) + [
            name for t in plan.row_wise for name in collective_names(row_wise_name(t))]

    def lookup(self, batch):
        _, categorical, _, global_rows = batch
        with tf.name_scope("embeddings"):  # names the piece in a profile
            embedded, sources = self.model.embeddings.lookup(list(categorical), global_rows,
                                                             training=True)
        return embedded, None, sources

    @staticmethod
    def dense_inputs(batch, step):
        numerical, _, label, global_rows = batch
        return numerical, label, global_rows

    def loss(self, inputs, embedded, context, compute_dtype):
        numerical, label, global_rows = inputs
        logits = self.model.forward_dense(numerical, embedded, compute_dtype)
        return mean_share(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits),
                          global_rows)

    @staticmethod
    def label(batch):
        return batch[2]

    @staticmethod
    def global_rows(batch):
        return batch[3]

    def predict(self, batch, compute_dtype):
        numerical, categorical, _, global_rows = batch
        return tf.sigmoid(self.model(numerical, list(categorical), global_rows, compute_dtype))


class DlrmTrainer(Trainer):
    def __init__(self, model, optimizer: str, schedule: LearningRateSchedule, amp: bool = False,
                 loss_scale: float = None, xla: bool = False, run_eagerly: bool = False,
                 compute_dtype=None, divergence_factor=DEFAULT_DIVERGENCE_FACTOR):
        """loss_scale: a static scale under amp; None: dynamic for float16, none otherwise."""
        task = DLRMTask(model)
        self.model, self.schedule, self.amp = model, schedule, amp
        self.table_pairs = [(t.key, t.variable) for t in task.tables]
        # slots are named as checkpoints name the variables
        trainable = dict(task.dense_variables)
        trainable.update({f"table/{i}": var for i, (_, var) in enumerate(self.table_pairs)})
        self.optimizer = make_optimizer(optimizer, trainable)
        model.embeddings.new_rows_hooks.append(self.optimizer.reset_rows)
        group = OptimizerGroup(self.optimizer, schedule, tuple(trainable.values()))
        super().__init__(
            task, model.comm, [group],
            compute_dtype_for(amp) if compute_dtype is None else compute_dtype,
            loss_scale if amp else 1.0, xla=xla, run_eagerly=run_eagerly,
            divergence_hint="Lower --learning_rate or lengthen --warmup_steps.",
            divergence_factor=divergence_factor)
