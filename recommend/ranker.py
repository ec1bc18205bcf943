"""The ranking stage: scores a history's K retrieved candidates, all in one pass.

    e(i)         the ranker's item table: its own (--start_from_retrieval: the retrieval
                 model's, same width); with --item_attributes, plus the mean of the item's
                 attributes' rows of the ranker's attribute table (retrieval/model.py's rule)
    hstu:  u_c = the SIM family's HSTU ranker's output for candidate c (sim/hstu.py: M-FALCON,
                 the history then the K candidate tokens, none reading another)
    din:   u_c = DIN's attention pool of the history by candidate c (sim/blocks.py's
                 activation unit)
    x_c = [u_c, e(c), u_c * e(c)]
    logit_c = MLP(dropout(x_c)) + b <u_c, e(c)> + a s_c + r [c in the history]

with s_c the retrieval model's score of c, a learned a (started at 1), b and r (started at 0):
the dot product gives the ranker the matching an MLP learns slowly; r learns how likely a
user is to take an item again (retrieval scores a seen item as any other, and a history's own
items are often its nearest). The MLP's last layer starts at zero, so an untrained ranker
orders the candidates as retrieval does and training learns what to change.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import tensorflow as tf

from core.hstu import dropout
from core.layers import MLP
from retrieval.model import AttributeMeans
from sim.blocks import AttentionUnit, apply_mlp, attention_pool
from sim.hstu import HstuRanker

RANKERS = ("hstu", "din")
HEAD_WIDTH = 64
DIN_ATTENTION_WIDTHS = (80, 40)  # DIN's activation unit (the paper's and NVIDIA's)


@dataclass(frozen=True)
class RankerConfig:
    ranker: str = "hstu"
    items: int = 1        # rows 1..items, row 0 the padding
    length: int = 50      # history positions read (the retrieval model's)
    width: int = 64       # the item table's (the retrieval model's)
    blocks: int = 2       # hstu
    heads: int = 4        # hstu (chosen on validation: README)
    dropout: float = 0.2  # on the head's input
    attributes: int = 0   # A: the items' attribute ids 1..A (0: no attribute table)
    seed: int = 1

    def checkpoint_shape(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("dropout", "seed")}


class Ranker(tf.Module):
    def __init__(self, config: RankerConfig, item_table: np.ndarray = None,
                 attributes: np.ndarray = None):
        """item_table: [items + 1, width] float32, the table the ranker's starts from (None:
        its own seeded draw, as retrieval's table starts); attributes: int [items + 1, M],
        row r item row r's attribute ids 1..config.attributes, 0-padded (when
        config.attributes > 0)."""
        super().__init__(name="ranker")
        if config.ranker not in RANKERS:
            raise ValueError(f"--ranker must be one of {list(RANKERS)}, found {config.ranker!r}")
        self.config, c = config, config
        if c.ranker == "hstu" and c.width % c.heads:
            raise ValueError(f"--num_heads {c.heads} does not divide the retrieval model's "
                             f"width {c.width} (its --embedding_dim)")
        if item_table is None:
            item_table = np.random.default_rng([c.seed, 99]).standard_normal(
                (c.items + 1, c.width)) * c.width ** -0.5
        self.items = tf.Variable(np.asarray(item_table, np.float32), name="item_embeddings")
        self.retrieval_weight = tf.Variable(1.0, name="retrieval_weight")
        self.dot_weight = tf.Variable(0.0, name="dot_weight")
        if (attributes is not None) != (c.attributes > 0):
            raise ValueError("the ranker's item attributes need their ids and their count")
        if c.attributes:
            rng = np.random.default_rng([c.seed, 98])
            table = rng.standard_normal((c.attributes + 1, c.width)) * c.width ** -0.5
            table[0] = 0  # the padding: no attribute
            self.attributes = tf.Variable(table.astype(np.float32), name="attribute_embeddings")
            self.attribute_means = AttributeMeans(attributes)
        self.seen_weight = tf.Variable(0.0, name="seen_weight")
        if c.ranker == "hstu":
            self.encoder = HstuRanker(c.width, c.length, c.blocks, c.heads, c.seed, 100, "hstu")
        else:
            self.encoder = AttentionUnit(c.width, DIN_ATTENTION_WIDTHS, c.seed, 100, "din")
        self.head = MLP(3 * c.width, (HEAD_WIDTH, 1), False, c.seed, 200, "head")
        for variable in self.head.layers[-1]:
            variable.assign(tf.zeros_like(variable))
        self.named = {"item_embeddings": self.items, "retrieval_weight": self.retrieval_weight,
                      "dot_weight": self.dot_weight, "seen_weight": self.seen_weight,
                      **self.encoder.named_variables(c.ranker),
                      **self.head.named_variables("head"),
                      **({"attribute_embeddings": self.attributes} if c.attributes else {})}

    def item_vectors(self):
        """[items + 1, width]: each row's e(i)."""
        if not self.config.attributes:
            return self.items
        return self.items + self.attribute_means(self.attributes)

    def __call__(self, history, candidates, retrieval_scores, seed=None,
                 compute_dtype=tf.float32):
        """history int64 [B, length] rows, candidates int64 [B, K] rows, retrieval_scores
        float32 [B, K] -> logits float32 [B, K]. seed: core.hstu.dropout's (training)."""
        mask = tf.cast(history > 0, tf.float32)
        items = self.item_vectors()
        keys = tf.nn.embedding_lookup(items, history)
        targets = tf.nn.embedding_lookup(items, candidates)
        if self.config.ranker == "hstu":
            u = self.encoder(keys, mask, targets, compute_dtype)
        else:
            u = self._din(keys, mask, targets, compute_dtype)
        x = dropout(tf.concat([u, targets, u * targets], -1), self.config.dropout, seed, 1)
        logits = tf.cast(tf.squeeze(apply_mlp(self.head, tf.cast(x, compute_dtype),
                                              compute_dtype), -1), tf.float32)
        seen = tf.reduce_any((candidates[:, :, None] == history[:, None, :]) &
                             (history[:, None, :] > 0), -1)
        return logits + self.dot_weight * tf.reduce_sum(u * targets, -1) + \
            self.retrieval_weight * retrieval_scores + self.seen_weight * tf.cast(seen, tf.float32)

    def _din(self, keys, mask, targets, compute_dtype):
        """[B, K, w]: each candidate's pool of the history (the history repeated per
        candidate)."""
        b, k, w = tf.shape(targets)[0], tf.shape(targets)[1], self.config.width
        pooled, _ = attention_pool(self.encoder, tf.cast(tf.reshape(targets, [-1, w]),
                                                         compute_dtype),
                                   tf.cast(tf.repeat(keys, k, axis=0), compute_dtype),
                                   tf.cast(tf.repeat(mask, k, axis=0), compute_dtype),
                                   compute_dtype)
        return tf.reshape(tf.cast(pooled, tf.float32), [b, k, w])
