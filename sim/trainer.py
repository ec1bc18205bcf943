"""SIM/DIEN/DIN as a client of the training engine (training/engine.py): the lookups give
the embedded user, target and history tensors (the masks ride along untouched), the dense
part is the model's forward with its auxiliary and search-stage losses, one optimizer (Adam
with decoupled weight decay, or SGD) with a constant rate. Its tables are declared to the
engine (table_bookkeeping): a table split over the ranks (--sharding) is read by a routed
lookup; the others every rank holds whole.
"""
from __future__ import annotations

import tensorflow as tf

from core import fused_ops
from core.optimizers import make_optimizer
from core.pipelines import DictPipeline
from sim.data import model_inputs
from sim.model import routed_lookup_name
from training import (OptimizerGroup, TableDeclaration, Trainer, compute_dtype_for,
                      table_bookkeeping)
from training.checkpoint import slot_row_ranges, with_slots
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share

# the embedded tensors that depend on tables (the rest of lookup()'s output are masks)
EMBEDDED = ("user", "target", "history", "short", "short_negative", "long")


def input_signature(config) -> dict:
    """TensorSpecs of SimModel.lookup's inputs (ids int64, any batch size)."""
    def ids(count, shape):
        return [tf.TensorSpec(shape, tf.int64) for _ in range(count)]

    items, history = len(config.item_cardinalities), [None, config.history_length]
    return {"user": ids(len(config.user_cardinalities), [None]), "target": ids(items, [None]),
            "positive": ids(items, history), "negative": ids(items, history)}


def step_batch(spec, batch: dict) -> tuple:
    """A DictPipeline element -> the engine's SIM batch: (inputs, label, global_rows)."""
    return (model_inputs(spec, batch), batch[spec.label_feature],
            batch[DictPipeline.GLOBAL_ROWS])


class SimTask:
    """A batch is (inputs, label, global_rows) (step_batch)."""

    def __init__(self, model, seed: int):
        self.model, self.seed = model, seed
        self.dense_variables = model.dense_variables()
        # every lookup reads a table at the batch's distinct ids (SimModel._shared_lookup)
        routed = model.routed_tables()
        self.tables, self.lookup_collectives = table_bookkeeping(
            TableDeclaration(n, var, dynamic=n in model.dynamic, distinct_rows=True,
                             routed_lookup=routed_lookup_name(n) if n in routed else "")
            for n, var in model.tables().items())

    def lookup(self, batch):
        looked_up = self.model.lookup(batch[0])
        embedded = {k: v for k, v in looked_up.items() if k in EMBEDDED}
        return embedded, {k: v for k, v in looked_up.items() if k not in EMBEDDED}, []

    def dense_inputs(self, batch, step):
        _, label, global_rows = batch
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
        return label, global_rows, seed

    def loss(self, inputs, embedded, masks, compute_dtype):
        label, global_rows, seed = inputs
        logit, gsu_logit, aux = self.model.forward({**embedded, **masks}, compute_dtype, seed)
        per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit)
        if gsu_logit is not None:
            per_row += tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=gsu_logit)
            if self.model.config.reference:  # NVIDIA's SIM loss: the two stages' mean
                per_row *= 0.5
        if aux is not None:
            per_row += aux
        return mean_share(per_row, global_rows)

    @property
    def loss_name(self) -> str:
        """The terms loss() adds (DIEN and SIM: the auxiliary loss of the behaviour GRU)."""
        c = self.model.config
        if c.model_type in ("din", "hstu"):
            return "binary cross-entropy"
        if c.model_type == "dien":
            return "total loss: BCE + auxiliary loss"
        stages = "mean of the two stages' BCE" if c.reference else "BCE + search-stage BCE"
        return f"total loss: {stages} + auxiliary loss"

    def predict(self, batch, compute_dtype):
        logit, _, _ = self.model.forward(self.model.lookup(batch[0], training=False),
                                         compute_dtype)
        return tf.sigmoid(logit)

    @staticmethod
    def label(batch):
        return batch[1]

    @staticmethod
    def global_rows(batch):
        return batch[2]


TABLE_UPDATES = ("lazy", "dense")


def dense_table_updates(optimizer):
    """The optimizer, its table updates made dense as the reference's (Horovod's tape hands
    its AdamW dense table gradients): each row's gradient (0 where the batch has none) goes
    through apply_dense, so every row's moments decay and every row moves each step."""
    apply_dense = optimizer.apply_dense

    def apply_sparse(var, grad, lr, distinct_rows=False):
        apply_dense(var, fused_ops.segment_sum_rows(grad.values, grad.indices, var.shape[0]), lr)
    optimizer.apply_sparse = apply_sparse
    return optimizer


class SimTrainer(Trainer):
    def __init__(self, model, comm, optimizer="adam", lr=0.01, weight_decay=0.0, amp=False,
                 xla=False, seed=0, divergence_factor=DEFAULT_DIVERGENCE_FACTOR,
                 table_updates="lazy"):
        self.model, self.lr = model, float(lr)
        self.dense, self.tables = model.dense_variables(), model.tables()
        self.optimizer = make_optimizer(optimizer, {**self.dense, **self.tables}, weight_decay)
        if table_updates == "dense":
            self.optimizer = dense_table_updates(self.optimizer)
        model.new_rows_hooks.append(self.optimizer.reset_rows)
        group = OptimizerGroup(self.optimizer, lambda step: self.lr,
                               tuple(self.dense.values()) + tuple(self.tables.values()))
        signature = (input_signature(model.config), tf.TensorSpec([None], tf.float32),
                     tf.TensorSpec([], tf.int32))
        super().__init__(SimTask(model, int(seed)), comm, [group], compute_dtype_for(amp),
                         xla=xla, input_signature=signature, predict_signature=signature,
                         divergence_hint="Lower --lr.", divergence_factor=divergence_factor)

    def variables(self) -> dict:
        return model_variables(self.model)

    def named_state(self) -> dict:
        """variables() and the optimizer's slots, keyed by the name without its dense/ or
        table/ prefix."""
        return with_slots(self.variables(), self.optimizer, slot_key)

    def row_ranges(self) -> dict:
        """{name: (row_start, row_stop, rows)} of the named_state entries that hold a row
        range of a table split over the ranks (training/checkpoint.py)."""
        return slot_row_ranges({f"table/{n}": self.model.rows_held(n)
                                for n in self.model.routed_tables()}, self.optimizer, slot_key)

    def dynamic_tables(self) -> dict:
        """{table: (its map, the named_state entries whose rows it indexes: the table and its
        slots)} of the dynamic tables (training/checkpoint.py)."""
        return {n: (table, list(slot_row_ranges({f"table/{n}": None}, self.optimizer,
                                                slot_key)))
                for n, table in self.model.dynamic.items()}


def model_variables(model) -> dict:
    """A model's variables by checkpoint name: dense/<name>, table/<name>."""
    return {**{f"dense/{k}": v for k, v in model.dense_variables().items()},
            **{f"table/{k}": v for k, v in model.tables().items()}}


def slot_key(name: str) -> str:
    """The optimizer's name of a variables() entry: without its dense/ or table/ prefix."""
    return name.split("/", 1)[1]
