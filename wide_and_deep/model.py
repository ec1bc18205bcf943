"""The Wide & Deep model: plain tf.Variables (tables looked up with tf.nn.embedding_lookup,
so their gradients stay sparse) and a forward pass split at the lookups.

  wide:  sum over categorical features of w_f[id] (multi-hot: every valid id)
         + numerical features times their weights + bias (linear in both, as NVIDIA's)
  deep:  [numerical, e_f(ids) pooled per feature] -> ReLU MLP with dropout -> one unit
  logit = wide + deep
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from core import fused_ops
from core.dropout import bias_relu_dropout
from core.dynamic import DynamicTable
from core.feature_spec import DynamicSpec
from core.layers import copy_rare_row, table_variable
from core.parallel.rows import hash_owner, range_lookup, routed_lookup
from core.initializers import bias_normal, glorot_normal
from wide_and_deep.contract import MULTIHOT_CHANNEL, ONEHOT_CHANNEL
from core.sources import length_key

COMBINERS = ("sum", "mean")
# Tables of at most this many rows enter the first layer projected: the rows a batch uses are
# multiplied by the table's slice of the first kernel once each, and the products summed per
# row (a fused gather-sum). The same layer, with (unique ids x dim x units) multiply-adds
# instead of (batch rows x dim x units), backward included: at batch 16384 on the reference
# shape 13 of the 16 tables qualify and the step is ~0.2 s (5 %) shorter.
PROJECT_MAX_ROWS = 16384


@dataclass(frozen=True)
class Table:
    name: str
    cardinality: int
    dim: int
    hotness: int = None  # None: one id per row
    dynamic: DynamicSpec = None  # an open-vocabulary table (core/dynamic.py): any int64 id


@dataclass(frozen=True)
class WideDeepConfig:
    tables: tuple
    numerical: tuple
    hidden_units: tuple = (1024, 1024, 1024, 1024, 1024)
    dropout: float = 0.1
    combiner: str = "sum"
    project_max_rows: int = PROJECT_MAX_ROWS  # 0: no table enters the first layer projected

    def __post_init__(self):
        if self.combiner not in COMBINERS:
            raise ValueError(f"--combiner must be one of {list(COMBINERS)}, found "
                             f"'{self.combiner}'")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"--deep_dropout must be in [0, 1), found {self.dropout}")

    @classmethod
    def from_spec(cls, spec, embedding_dims: dict, **kwargs) -> "WideDeepConfig":
        tables = [Table(f, spec.cardinality(f), embedding_dims[f], None, spec.dynamic(f))
                  for f in spec.channel(ONEHOT_CHANNEL)]
        tables += [Table(f, spec.cardinality(f), embedding_dims[f], spec.dimension(f),
                         spec.dynamic(f)) for f in spec.channel(MULTIHOT_CHANNEL)]
        return cls(tuple(tables), tuple(spec.channel("numerical")), **kwargs)

    @property
    def deep_input_width(self) -> int:
        return len(self.numerical) + sum(t.dim for t in self.tables)

    def projected(self, t: Table) -> bool:
        """Whether table t enters the first layer projected (a mean combiner scales each
        feature's sum on its own, which the fused row sum cannot)."""
        return t.cardinality <= self.project_max_rows and (t.hotness is None or
                                                           self.combiner == "sum")

    def first_kernel_rows(self) -> tuple:
        """Rows of the first kernel as slices: (runs of the numerical features' and the
        concatenated tables' rows, [rows of each projected table])."""
        runs, projected = [], []
        start = len(self.numerical)
        if start:
            runs.append(slice(0, start))
        for t in self.tables:
            rows = slice(start, start + t.dim)
            if self.projected(t):
                projected.append(rows)
            elif runs and runs[-1].stop == start:
                runs[-1] = slice(runs[-1].start, rows.stop)
            else:
                runs.append(rows)
            start += t.dim
        return runs, projected


class WideDeepModel(tf.Module):
    def __init__(self, config: WideDeepConfig, seed: int = 0, placement=None, comm=None):
        """placement: per table a RoutedTable (core/parallel/placement.py, plan_routed_tables
        with a feature's wide and deep widths summed; None: every table whole). A feature's
        wide and deep tables hold the same rows of this rank (`comm`) and are read together
        by one routed lookup. A dynamic feature split over the ranks holds the share of its
        rows that plan_routed_tables (hashed_tables) gives this rank, with its own map: its
        ids go to the rank a hash of the id names (core/parallel/rows.py hash_owner), which
        gives new ids rows; row 0 of every share is a copy of the rare row (the trainer sums
        its gradient across ranks)."""
        super().__init__(name="wide_deep")
        self.config, self.comm = config, comm
        self.placement = {t.name: p for t, p in zip(config.tables, placement or ())
                          if p.sharded}
        held = {t.name: self.rows_held(t.name) for t in config.tables}
        self.wide_tables = {t.name: tf.Variable(tf.zeros([held[t.name][1] - held[t.name][0], 1]),
                                                name=f"wide_{t.name}") for t in config.tables}
        # FTRL's weights are a function of its slots, which start at zero: so must the weights.
        self.wide_bias = tf.Variable(tf.zeros([1]), name="wide_bias")
        self.wide_numerical = (tf.Variable(tf.zeros([len(config.numerical), 1]),
                                           name="wide_numerical") if config.numerical else None)
        self.deep_tables = {t.name: table_variable(t.cardinality, t.dim, seed, i,
                                                   name=f"deep_{t.name}",
                                                   row_start=held[t.name][0],
                                                   row_stop=held[t.name][1])
                            for i, t in enumerate(config.tables)}
        widths = [config.deep_input_width, *config.hidden_units, 1]
        self.kernels = [tf.Variable(glorot_normal(a, b, seed, i), name=f"deep_kernel_{i}")
                        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
        self.biases = [tf.Variable(bias_normal(b, seed, 100 + i), name=f"deep_bias_{i}")
                       for i, b in enumerate(widths[1:])]
        # one id -> row map per dynamic feature, shared by its wide and deep tables
        self.dynamic = {t.name: DynamicTable(held[t.name][1] - held[t.name][0], t.dynamic,
                                             f"dynamic_{t.name}", t.cardinality)
                        for t in config.tables if t.dynamic}
        for i, t in enumerate(config.tables):
            if t.dynamic and t.name in self.placement:
                copy_rare_row(self.deep_tables[t.name], t.cardinality, t.dim, seed, i)
        self.seed = seed
        # called with (table, rows) when a dynamic table gives rows to new ids: the optimizers
        # reset their slots of the rows (WideDeepTrainer registers them)
        self.new_rows_hooks = []

    def rows_held(self, name: str) -> tuple:
        """(row_start, row_stop) of feature `name`'s rows this rank holds."""
        placement = self.placement.get(name)
        if placement is None:
            return 0, next(t.cardinality for t in self.config.tables if t.name == name)
        return placement.rows_on(self.comm.rank)

    def routed_features(self) -> list:
        """The features whose tables are split over the ranks, in table order."""
        return list(self.placement)

    # ---- variables by checkpoint name --------------------------------------------------
    def wide_variables(self) -> dict:
        out = {f"wide/{n}": v for n, v in self.wide_tables.items()}
        out["wide/bias"] = self.wide_bias
        if self.wide_numerical is not None:
            out["wide/numerical"] = self.wide_numerical
        return out

    def deep_variables(self) -> dict:
        out = {f"deep/{n}": v for n, v in self.deep_tables.items()}
        for i, (k, b) in enumerate(zip(self.kernels, self.biases)):
            out[f"deep/kernel_{i}"], out[f"deep/bias_{i}"] = k, b
        return out

    def tables(self) -> dict:
        """Every table by checkpoint name."""
        return {**{f"wide/{n}": v for n, v in self.wide_tables.items()},
                **{f"deep/{n}": v for n, v in self.deep_tables.items()}}

    def dense_variables(self) -> dict:
        """Every variable that is not a table, by checkpoint name."""
        tables = {v.ref() for v in self.tables().values()}
        return {n: v for n, v in {**self.wide_variables(), **self.deep_variables()}.items()
                if v.ref() not in tables}

    # ---- forward -----------------------------------------------------------------------
    def lookup(self, batch: dict, training: bool = False):
        """Table lookups (run under the tape that gives the tables' sparse gradients; a
        training lookup gives dynamic tables' new ids rows, others read them from row 0):
        wide terms [n, features]; embeddings: (pooled [n, dim] of each table concatenated,
        unique rows [u, dim] of each projected table); layout: (positions in the projected
        tables' unique rows stacked, their batch rows), sorted by row, or None."""
        wide, pooled, unique, positions, segments = [], [], [], [], []
        offset = 0
        for i, t in enumerate(self.config.tables):
            ids, row_of = self._valid_ids(t, batch)
            hashed = t.name in self.dynamic and t.name in self.placement
            if t.dynamic and not hashed:
                ids = self._dynamic_rows(t.name, ids, training)
            rows = tf.shape(batch[t.name])[0]
            if self.config.projected(t):
                rows_used, position = tf.unique(ids, out_idx=tf.int32)
                if hashed:  # every id travels: its owner counts each occurrence to admit it
                    wide_rows, deep_rows = self._routed(t.name, ids, training)
                    deep_rows = tf.gather(deep_rows, tf.math.unsorted_segment_min(
                        tf.range(tf.size(ids)), position, tf.size(rows_used)))
                elif t.name in self.placement:  # the distinct ids travel, once for both tables
                    wide_rows, deep_rows = self._routed(t.name, rows_used)
                    wide_rows = tf.gather(wide_rows, position)
                else:
                    wide_rows = tf.nn.embedding_lookup(self.wide_tables[t.name], ids)
                    deep_rows = tf.nn.embedding_lookup(self.deep_tables[t.name], rows_used)
                unique.append(deep_rows)
                positions.append(position + offset)
                segments.append(tf.range(rows) if row_of is None else row_of)
                offset += tf.shape(rows_used)[0]
            else:
                wide_rows, deep_rows = self._rows_of(t.name, ids, training)
                deep = self._pooled(deep_rows, row_of, rows)
                if t.hotness is not None and self.config.combiner == "mean":
                    lengths = batch[length_key(t.name)]
                    deep /= tf.maximum(tf.cast(lengths, deep.dtype), 1.0)[:, None]
                pooled.append(deep)
            wide.append(self._pooled(wide_rows, row_of, rows)[:, 0])
        layout = None
        if unique:
            segments = tf.concat(segments, 0)
            order = tf.argsort(segments, stable=True)
            layout = (tf.gather(tf.concat(positions, 0), order), tf.gather(segments, order))
        wide = tf.stack(wide, axis=1) if wide else tf.zeros([self._rows(batch), 0])
        return wide, (pooled, unique), layout

    def _dynamic_rows(self, name: str, ids, training: bool):
        """Rows of a dynamic feature's ids (on their owner when the feature is split); in
        training, new ids' rows start anew: the deep row drawn again, the wide row zero
        (FTRL's weights start at zero), slots reset."""
        dynamic = self.dynamic[name]
        if not training:
            return dynamic.lookup(ids)
        rows, new_rows = dynamic.train_lookup(ids)
        table_index = [t.name for t in self.config.tables].index(name)
        dynamic.redraw(self.deep_tables[name], new_rows, self.seed * 1000 + table_index)
        wide = self.wide_tables[name]
        wide.scatter_update(tf.IndexedSlices(tf.zeros([tf.size(new_rows), 1]), new_rows))
        for hook in self.new_rows_hooks:
            for table in (wide, self.deep_tables[name]):
                hook(table, new_rows)
        return rows

    def _rows(self, batch: dict):
        """Rows of the batch (the contract guarantees a table or a numerical feature)."""
        tables, numerical = self.config.tables, self.config.numerical
        return tf.shape(batch[tables[0].name if tables else numerical[0]])[0]

    @staticmethod
    def _valid_ids(t: Table, batch: dict):
        """(ids, row of each; None for one-hot): multi-hot keeps only the first `length` ids
        of a row (the rest is padding, which must not reach the tables' gradients either)."""
        ids = batch[t.name]
        if t.hotness is None:
            return ids, None
        mask = tf.sequence_mask(batch[length_key(t.name)], tf.shape(ids)[1])
        rows = tf.broadcast_to(tf.range(tf.shape(ids)[0])[:, None], tf.shape(ids))
        return tf.boolean_mask(ids, mask), tf.boolean_mask(rows, mask)

    def _rows_of(self, name: str, ids, training: bool) -> list:
        """[wide rows, deep rows] of feature `name` at ids: looked up in this rank's tables,
        or, when the feature is split over the ranks, from the ranks holding them."""
        if name in self.placement:
            return self._routed(name, ids, training)
        return [tf.nn.embedding_lookup(table, ids)
                for table in (self.wide_tables[name], self.deep_tables[name])]

    def _routed(self, name: str, ids, training: bool = False) -> list:
        tables = [self.wide_tables[name], self.deep_tables[name]]
        if name not in self.dynamic:
            return range_lookup(self.comm, self.placement[name].bounds, tables, ids,
                                routed_lookup_name(name))
        return routed_lookup(self.comm, tables, ids, hash_owner(self.comm.size),
                             lambda asked: self._dynamic_rows(name, asked, training),
                             routed_lookup_name(name))

    @staticmethod
    def _pooled(looked_up, row_of, rows):
        """Each batch row's looked-up vectors summed (one-hot: row_of None, one per row)."""
        if row_of is None:
            return looked_up
        return fused_ops.segment_sum_rows(looked_up, row_of, rows)

    def numerical(self, batch: dict):
        if not self.config.numerical:
            return tf.zeros([self._rows(batch), 0])
        return tf.stack([tf.cast(batch[f], tf.float32) for f in self.config.numerical], axis=1)

    def logits(self, numerical, wide_terms, embeddings, layout, training=False,
               dropout_seed=None, compute_dtype=tf.float32):
        """[n] logits from the lookups; dropout (training only) is a hash of `dropout_seed`
        (int64 [2]) and the element's position, so a resumed run draws the same masks."""
        x = self._first_product(numerical, embeddings, layout, compute_dtype)
        for i, (k, b) in enumerate(zip(self.kernels, self.biases[:-1])):
            b = tf.cast(b, compute_dtype)
            if i > 0:
                x = tf.matmul(x, tf.cast(k, compute_dtype))
            if training and self.config.dropout > 0:
                x = bias_relu_dropout(x, b, self.config.dropout,
                                      dropout_seed + tf.constant([0, i], tf.int64))
            else:
                x = tf.nn.relu(tf.nn.bias_add(x, b))
        deep = tf.nn.bias_add(tf.matmul(x, tf.cast(self.kernels[-1], compute_dtype)),
                              tf.cast(self.biases[-1], compute_dtype))
        wide = tf.reduce_sum(wide_terms, axis=1) + self.wide_bias
        if self.wide_numerical is not None:
            wide += tf.linalg.matvec(numerical, self.wide_numerical[:, 0])
        return wide + tf.cast(deep[:, 0], tf.float32)

    def _first_product(self, numerical, embeddings, layout, dtype):
        """[n, units]: the deep input times the first kernel, without the bias."""
        pooled, unique = embeddings
        runs, projected_slices = self.config.first_kernel_rows()
        kernel = tf.cast(self.kernels[0], dtype)
        x = tf.cast(tf.concat([numerical, *pooled], axis=1), dtype)
        if runs:  # slices, not a gather: the kernel's gradient stays one dense tensor
            product = tf.matmul(x, tf.concat([kernel[rows] for rows in runs], axis=0))
        else:  # every input feature is a projected table
            product = tf.zeros([tf.shape(x)[0], kernel.shape[1]], dtype)
        if unique:
            projected = tf.concat([tf.matmul(tf.cast(u, dtype), kernel[rows])
                                   for u, rows in zip(unique, projected_slices)], axis=0)
            positions, segments = layout
            product += _rows_summed(projected, positions, segments, tf.shape(product)[0])
        return product

    def __call__(self, batch: dict, compute_dtype=tf.float32):
        wide, embeddings, layout = self.lookup(batch)
        return self.logits(self.numerical(batch), wide, embeddings, layout,
                           compute_dtype=compute_dtype)


def _rows_summed(data, indices, segment_ids, num_segments):
    """tf.sparse.segment_sum(data, indices, segment_ids, num_segments) (segment_ids sorted)
    and its gradient, a gather of the upstream rows summed per index, each as one
    GatherSegmentSumRows (the same bits): TensorFlow 2.21's SparseSegmentSumGrad takes about
    5x 2.17's time here, its SparseSegmentSum and GatherV2 40-50 % more
    (bench/results/tf221_vs_tf217.txt)."""
    @tf.custom_gradient
    def summed(rows):
        def grad(upstream):  # rows[indices[i]] went into segment segment_ids[i]
            return fused_ops.gather_segment_sum_rows(upstream, segment_ids, indices,
                                                     tf.shape(rows)[0])
        return fused_ops.gather_segment_sum_rows(rows, indices, segment_ids, num_segments,
                                                 sorted_ids=True), grad
    return summed(data)


def routed_lookup_name(feature: str) -> str:
    """Names the routed lookup (its collectives, core/parallel/rows.py) of a split feature."""
    return f"routed_{feature}"


def parameter_count(config: WideDeepConfig) -> int:
    widths = [config.deep_input_width, *config.hidden_units, 1]
    mlp = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    wide = sum(t.cardinality for t in config.tables) + len(config.numerical) + 1
    return int(sum(t.cardinality * t.dim for t in config.tables) + wide + mlp)

