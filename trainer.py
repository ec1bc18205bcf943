"""DLRM/DCNv2 as a client of the training engine (training/engine.py): the task below says
what DLRM's step looks up (the embedding layer, all-to-all included), what its dense part
computes, which variables the one optimizer updates, and how each of its tables is held
(replicated, a model-parallel piece of the all-to-all, or row-wise), keyed by table id.
"""
from __future__ import annotations

import tensorflow as tf

from core.optimizers import LearningRateSchedule, make_optimizer
from core.parallel.comm import ALLTOALL_NAMES
from embedding import row_wise_name
from training import (OptimizerGroup, TableDeclaration, Trainer, compute_dtype_for,
                      table_bookkeeping)
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share


class DLRMTask:
    def __init__(self, model):
        self.model = model
        self.dense_variables = model.dense_variables()
        embeddings, plan = model.embeddings, model.plan
        pieces = [TableDeclaration(p.table, var, dynamic=p.table in embeddings.dynamic,
                                   routed_lookup=row_wise_name(p.table)
                                   if p.table in plan.row_wise else "",
                                   exchanged=p.table not in plan.row_wise)
                  for p, var in zip(embeddings.local_pieces, embeddings.piece_variables)]
        whole = [TableDeclaration(t, var, dynamic=t in embeddings.dynamic)
                 for t, var in embeddings.replicated_variables.items()]
        self.tables, routed = table_bookkeeping(pieces + whole)
        exchanged = plan.world_size > 1 and any(p.table not in plan.row_wise for p in plan.pieces)
        self.lookup_collectives = (list(ALLTOALL_NAMES) if exchanged else []) + routed

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
