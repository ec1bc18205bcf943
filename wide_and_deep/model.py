"""The Wide & Deep model: plain tf.Variables (tables looked up with tf.nn.embedding_lookup,
so their gradients stay sparse) and a forward pass split at the lookups.

  wide:  sum over categorical features of w_f[id] (multi-hot: every valid id) + bias
  deep:  [numerical, e_f(ids) pooled per feature] -> ReLU MLP with dropout -> one unit
  logit = wide + deep
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from dropout import bias_relu_dropout
from embedding import table_variable
from initializers import bias_normal, glorot_normal
from wide_and_deep.contract import MULTIHOT_CHANNEL, ONEHOT_CHANNEL
from datasets import length_key

COMBINERS = ("sum", "mean")


@dataclass(frozen=True)
class Table:
    name: str
    cardinality: int
    dim: int
    hotness: int = None  # None: one id per row


@dataclass(frozen=True)
class WideDeepConfig:
    tables: tuple
    numerical: tuple
    hidden_units: tuple = (1024, 1024, 1024, 1024, 1024)
    dropout: float = 0.1
    combiner: str = "sum"

    def __post_init__(self):
        if self.combiner not in COMBINERS:
            raise ValueError(f"--combiner must be one of {list(COMBINERS)}, found "
                             f"'{self.combiner}'")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"--deep_dropout must be in [0, 1), found {self.dropout}")

    @classmethod
    def from_spec(cls, spec, embedding_dims: dict, **kwargs) -> "WideDeepConfig":
        tables = [Table(f, spec.cardinality(f), embedding_dims[f])
                  for f in spec.channel(ONEHOT_CHANNEL)]
        tables += [Table(f, spec.cardinality(f), embedding_dims[f], spec.dimension(f))
                   for f in spec.channel(MULTIHOT_CHANNEL)]
        return cls(tuple(tables), tuple(spec.channel("numerical")), **kwargs)

    @property
    def deep_input_width(self) -> int:
        return len(self.numerical) + sum(t.dim for t in self.tables)


class WideDeepModel(tf.Module):
    def __init__(self, config: WideDeepConfig, seed: int = 0):
        super().__init__(name="wide_deep")
        self.config = config
        self.wide_tables = {t.name: tf.Variable(tf.zeros([t.cardinality, 1]),
                                                name=f"wide_{t.name}") for t in config.tables}
        # FTRL's weights are a function of its slots, which start at zero: so must the weights.
        self.wide_bias = tf.Variable(tf.zeros([1]), name="wide_bias")
        self.deep_tables = {t.name: table_variable(t.cardinality, t.dim, seed, i,
                                                   name=f"deep_{t.name}")
                            for i, t in enumerate(config.tables)}
        widths = [config.deep_input_width, *config.hidden_units, 1]
        self.kernels = [tf.Variable(glorot_normal(a, b, seed, i), name=f"deep_kernel_{i}")
                        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
        self.biases = [tf.Variable(bias_normal(b, seed, 100 + i), name=f"deep_bias_{i}")
                       for i, b in enumerate(widths[1:])]

    # ---- variables by checkpoint name --------------------------------------------------
    def wide_variables(self) -> dict:
        out = {f"wide/{n}": v for n, v in self.wide_tables.items()}
        out["wide/bias"] = self.wide_bias
        return out

    def deep_variables(self) -> dict:
        out = {f"deep/{n}": v for n, v in self.deep_tables.items()}
        for i, (k, b) in enumerate(zip(self.kernels, self.biases)):
            out[f"deep/kernel_{i}"], out[f"deep/bias_{i}"] = k, b
        return out

    def table_variables(self) -> list:
        return list(self.wide_tables.values()) + list(self.deep_tables.values())

    def dense_variables(self) -> list:
        return [self.wide_bias] + self.kernels + self.biases

    # ---- forward -----------------------------------------------------------------------
    def lookup(self, batch: dict):
        """Table lookups (run under the tape that gives the tables' sparse gradients):
        wide terms [n, features] and the pooled deep embeddings, one [n, dim] per feature."""
        wide, deep = [], []
        for t in self.config.tables:
            if t.hotness is None:
                ids = batch[t.name]
                wide.append(tf.nn.embedding_lookup(self.wide_tables[t.name], ids)[:, 0])
                deep.append(tf.nn.embedding_lookup(self.deep_tables[t.name], ids))
            else:
                w, d = self._pooled(t, batch[t.name], batch[length_key(t.name)])
                wide.append(w)
                deep.append(d)
        return tf.stack(wide, axis=1), deep

    def _pooled(self, t: Table, ids, lengths):
        """Multi-hot: only the first `length` ids of a row count (the rest is padding, which
        must not reach the tables' gradients either)."""
        rows = tf.shape(ids)[0]
        mask = tf.sequence_mask(lengths, tf.shape(ids)[1])
        valid = tf.boolean_mask(ids, mask)
        row_of = tf.boolean_mask(tf.broadcast_to(tf.range(rows)[:, None], tf.shape(ids)), mask)
        wide = tf.math.unsorted_segment_sum(
            tf.nn.embedding_lookup(self.wide_tables[t.name], valid)[:, 0], row_of, rows)
        deep = tf.math.unsorted_segment_sum(
            tf.nn.embedding_lookup(self.deep_tables[t.name], valid), row_of, rows)
        if self.config.combiner == "mean":
            deep /= tf.maximum(tf.cast(lengths, deep.dtype), 1.0)[:, None]
        return wide, deep

    def numerical(self, batch: dict):
        if not self.config.numerical:  # the contract then guarantees a table
            return tf.zeros([tf.shape(batch[self.config.tables[0].name])[0], 0])
        return tf.stack([tf.cast(batch[f], tf.float32) for f in self.config.numerical], axis=1)

    def logits(self, numerical, wide_terms, embeddings, training=False, dropout_seed=None,
               compute_dtype=tf.float32):
        """[n] logits from the lookups; dropout (training only) is a hash of `dropout_seed`
        (int64 [2]) and the element's position, so a resumed run draws the same masks."""
        x = tf.cast(tf.concat([numerical, *embeddings], axis=1), compute_dtype)
        for i, (k, b) in enumerate(zip(self.kernels[:-1], self.biases[:-1])):
            k, b = tf.cast(k, compute_dtype), tf.cast(b, compute_dtype)
            if training and self.config.dropout > 0:
                x = bias_relu_dropout(tf.matmul(x, k), b, self.config.dropout,
                                      dropout_seed + tf.constant([0, i], tf.int64))
            else:  # bias_add, not "+": oneDNN fuses MatMul + BiasAdd + Relu into one kernel
                x = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, k), b))
        deep = tf.nn.bias_add(tf.matmul(x, tf.cast(self.kernels[-1], compute_dtype)),
                              tf.cast(self.biases[-1], compute_dtype))
        wide = tf.reduce_sum(wide_terms, axis=1) + self.wide_bias
        return wide + tf.cast(deep[:, 0], tf.float32)

    def __call__(self, batch: dict, compute_dtype=tf.float32):
        wide, embeddings = self.lookup(batch)
        return self.logits(self.numerical(batch), wide, embeddings, compute_dtype=compute_dtype)


def parameter_count(config: WideDeepConfig) -> int:
    widths = [config.deep_input_width, *config.hidden_units, 1]
    mlp = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    return int(sum(t.cardinality * (t.dim + 1) for t in config.tables) + 1 + mlp)

