"""Wide & Deep as a client of the training engine (training/engine.py): its lookups (wide
terms, pooled and projected deep rows), its dense part, and two optimizer groups as in the
reference: FTRL with a constant rate for the wide part, RMSProp with the deep schedule for
the deep part. Its tables are declared to the engine (table_bookkeeping): a feature split
over the ranks (--sharding) has its wide and deep tables read by one routed lookup; the
others every rank holds whole.
"""
from __future__ import annotations

import tensorflow as tf

from core.pipelines import DictPipeline
from core.optimizers import FTRL, RMSProp
from training import (OptimizerGroup, TableDeclaration, Trainer, compute_dtype_for,
                      table_bookkeeping)
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share
from training.checkpoint import slot_row_ranges, with_slots
from wide_and_deep.model import routed_lookup_name

# The reference's RMSProp decay for the deep part.
DEEP_RHO = 0.5


class WideDeepTask:
    def __init__(self, model, comm, label: str, seed: int):
        self.model, self.comm, self.label_feature, self.seed = model, comm, label, seed
        self.dense_variables = model.dense_variables()
        routed = model.routed_features()
        # keyed by checkpoint name, as model.tables() (wide, then deep)
        self.tables, self.lookup_collectives = table_bookkeeping(
            TableDeclaration(f"{part}/{f}", var, dynamic=f in model.dynamic,
                             routed_lookup=routed_lookup_name(f) if f in routed else "")
            for part, tables in (("wide", model.wide_tables), ("deep", model.deep_tables))
            for f, var in tables.items())

    def lookup(self, batch):
        wide_terms, embeddings, layout = self.model.lookup(batch, training=True)
        return (wide_terms, embeddings), layout, []

    def dense_inputs(self, batch, step):
        dropout_seed = tf.stack([tf.constant(self.seed * 1000 + self.comm.rank, tf.int64),
                                 tf.cast(step, tf.int64) * 64])
        return (self.model.numerical(batch), tf.cast(batch[self.label_feature], tf.float32),
                batch[DictPipeline.GLOBAL_ROWS], dropout_seed)

    def loss(self, inputs, embedded, layout, compute_dtype):
        numerical, label, global_rows, dropout_seed = inputs
        wide_terms, embeddings = embedded
        logits = self.model.logits(numerical, wide_terms, embeddings, layout, True,
                                   dropout_seed, compute_dtype)
        return mean_share(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits),
                          global_rows)

    def predict(self, batch, compute_dtype):
        return tf.sigmoid(self.model(batch, compute_dtype))

    def label(self, batch):
        return batch[self.label_feature]

    @staticmethod
    def global_rows(batch):
        return batch[DictPipeline.GLOBAL_ROWS]


class WideDeepTrainer(Trainer):
    def __init__(self, model, comm, label: str, linear_learning_rate: float, deep_schedule,
                 seed: int = 0, amp: bool = False, xla: bool = False,
                 divergence_factor: float = DEFAULT_DIVERGENCE_FACTOR):
        if xla and any(map(model.config.projected, model.config.tables)):
            raise ValueError("--xla needs the same shapes every step: build the model with "
                             "project_max_rows=0 (no projected tables)")
        self.model = model
        self.wide_optimizer = FTRL(model.wide_variables())
        self.deep_optimizer = RMSProp(model.deep_variables(), rho=DEEP_RHO)
        wide = {v.ref() for v in model.wide_variables().values()}
        model.new_rows_hooks.append(lambda table, rows: (
            self.wide_optimizer if table.ref() in wide else self.deep_optimizer).reset_rows(
                table, rows))
        groups = [OptimizerGroup(self.wide_optimizer, lambda step: linear_learning_rate,
                                 tuple(model.wide_variables().values()), "wide"),
                  OptimizerGroup(self.deep_optimizer, deep_schedule,
                                 tuple(model.deep_variables().values()), "deep")]
        super().__init__(WideDeepTask(model, comm, label, seed), comm, groups,
                         compute_dtype_for(amp), xla=xla,
                         divergence_hint="Lower --deep_learning_rate or "
                                         "--linear_learning_rate.",
                         divergence_factor=divergence_factor)

    def named_state(self) -> dict:
        """Weights and both optimizers' slots by checkpoint name."""
        return {**with_slots(self.model.wide_variables(), self.wide_optimizer),
                **with_slots(self.model.deep_variables(), self.deep_optimizer)}

    def row_ranges(self) -> dict:
        """{name: (row_start, row_stop, rows)} of the named_state entries that hold a row
        range of a feature split over the ranks (training/checkpoint.py)."""
        model = self.model
        held = {t.name: (*model.rows_held(t.name), t.cardinality) for t in model.config.tables
                if t.name in model.routed_features()}
        return {**slot_row_ranges({f"wide/{n}": r for n, r in held.items()}, self.wide_optimizer),
                **slot_row_ranges({f"deep/{n}": r for n, r in held.items()},
                                  self.deep_optimizer)}

    def dynamic_tables(self) -> dict:
        """{feature: (its map, the named_state entries whose rows it indexes: its wide and
        deep tables and their slots)} of the dynamic features (training/checkpoint.py)."""
        return {n: (table, [*slot_row_ranges({f"wide/{n}": None}, self.wide_optimizer),
                            *slot_row_ranges({f"deep/{n}": None}, self.deep_optimizer)])
                for n, table in self.model.dynamic.items()}
