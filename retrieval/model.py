"""The retrieval family's encoders: SASRec and HSTU over a history of item ids, the next item
scored by a dot product with the same item table that embeds the history.

Batches follow the family's layout (retrieval/data.py): ids int64 [b, L], left-padded with 0,
most recent last. Position p's output predicts the item after position p.

SASRec (Kang & McAuley, 2018): item embedding * sqrt(d) + a learned position, then pre-norm
blocks of causal multi-head softmax attention and a ReLU feed-forward, each a residual.

HSTU (Zhai et al., 2024; Meta's generative-recommenders): item embedding * sqrt(d) + a
learned position, then the HSTU layers of core/hstu.py (their equations are there), causal,
with the relative-position bias and, when the data has timestamps, the time-gap bias.

Item attributes (config.attributes > 0): an item's vector, wherever the model reads or scores
it, is its row of the item table plus the mean of its attributes' rows of an attribute table
(A + 1 rows, row 0 the padding, never read).
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import numpy as np
import tensorflow as tf

from core import hstu
from core.dynamic import DynamicTable
from core.hstu import NamedWeights, dropout, layer_norm, merge_heads, split_heads

MODELS = ("sasrec", "hstu")
# histories of at most this many items attend over their last this many positions only
# (hstu.Packing): most of Beauty's are that short (median 6 of 50)
SHORT_ATTENTION = 16


@dataclass(frozen=True)
class RetrievalConfig:
    model: str = "hstu"
    items: int = 1            # catalogue: ids 1..items, row 0 the padding
    length: int = 50          # history positions the encoder reads
    width: int = 64
    blocks: int = 2
    heads: int = 1
    dropout: float = 0.2      # on the embedded input and every residual branch
    attention_dropout: float = 0.0
    timestamps: bool = False  # HSTU: a time-gap bias as well as the position bias
    normalize: bool = False   # L2-normalised history and item vectors
    temperature: float = 1.0  # scores divided by this
    attributes: int = 0       # A: attribute ids 1..A of the items (0: no attribute table)
    seed: int = 0

    def checkpoint_shape(self) -> dict:
        """What a checkpoint must match to be loaded into this model."""
        return {k: v for k, v in asdict(self).items()
                if k in ("model", "items", "length", "width", "blocks", "heads", "timestamps",
                         "attributes")}


# checkpoint_shape fields that checkpoints written before them lack, with the value they had
CHECKPOINT_DEFAULTS = {"attributes": 0}


def item_read_name(read: str) -> str:
    """Names the collectives of one read of an item table split by rows (RowShards)."""
    return f"item_rows_{read}"


class AttributeMeans:
    """Each item row's mean attribute row, from attributes int [items + 1, M] (row r the
    attribute ids of item row r, 0-padded): called on an attribute table [A + 1, d], gives
    [items + 1, d] (an item with none: 0).

    The mean, not the sum: items have 1 to 6 attributes (a brand, categories), and the mean
    keeps their part of the item vector on one scale beside the item's own row whatever the
    count. A gather of [items + 1, M, d]: 2-4x faster than a sparse [items + 1, A + 1]
    matmul on CPU."""

    def __init__(self, attributes: np.ndarray):
        present = attributes > 0
        self.ids = tf.constant(attributes, tf.int64)
        self.weights = tf.constant(
            (present / np.maximum(present.sum(1, keepdims=True), 1))[..., None], tf.float32)

    def __call__(self, table, rows=None):
        """Every item row's mean, or those of item rows `rows` (any shape) -> [*rows.shape, d]."""
        ids, weights = self.ids, self.weights
        if rows is not None:
            ids, weights = tf.gather(ids, rows), tf.gather(weights, rows)
        return tf.reduce_sum(tf.gather(table, ids) * weights, -2)


class Encoder(tf.Module):
    """The item table, the positions and the blocks of one model. `encode` gives every
    position's history vector; `scores` compares history vectors with the whole catalogue."""

    def __init__(self, config: RetrievalConfig, dynamic_spec=None, attributes=None,
                 shards=None):
        """dynamic_spec: a DynamicSpec makes the item table dynamic (raw ids); attributes:
        int [items + 1, M], row r the attribute ids 1..config.attributes of item row r,
        0-padded (with config.attributes > 0 only); shards: a core.parallel.rows.RowShards of
        items + 1 rows: this process holds its rows of the item table only, and reads the
        others from their owners."""
        super().__init__(name=config.model)
        if config.model not in MODELS:
            raise ValueError(f"--model must be one of {list(MODELS)}, found {config.model!r}")
        if config.width % config.heads:
            raise ValueError(f"--embedding_dim {config.width} is not a multiple of --num_heads "
                             f"{config.heads}")
        self.config, c = config, config
        w = NamedWeights(c.seed)
        if shards is not None and (dynamic_spec is not None or shards.rows != c.items + 1):
            raise ValueError("a table split by rows needs a static item table of items + 1 rows")
        self.shards, self._read = shards, None
        self.items = w.normal("item_embeddings", [c.items + 1, c.width], c.width ** -0.5,
                              None if shards is None else shards.held)
        self.positions = w.normal("positions", [c.length, c.width], c.width ** -0.5)
        self.blocks = []
        for b in range(c.blocks):
            p = f"block_{b}/"
            if c.model == "sasrec":
                block = {k: w.matrix(p + k, c.width, c.width) for k in ("q", "k", "v", "o")}
                block.update(ffn_in=w.matrix(p + "ffn_in", c.width, c.width),
                             ffn_out=w.matrix(p + "ffn_out", c.width, c.width),
                             ffn_in_bias=w.constant(p + "ffn_in_bias", [c.width], 0.0),
                             ffn_out_bias=w.constant(p + "ffn_out_bias", [c.width], 0.0))
                for n in ("norm_1", "norm_2"):
                    block[n] = (w.constant(p + n + "/scale", [c.width], 1.0),
                                w.constant(p + n + "/offset", [c.width], 0.0))
            else:
                block = hstu.block_weights(w, p, c.width, c.length, c.timestamps)
            self.blocks.append(block)
        self.final_norm = (w.constant("final_norm/scale", [c.width], 1.0),
                           w.constant("final_norm/offset", [c.width], 0.0))
        if (attributes is not None) != (c.attributes > 0) or (
                c.attributes and dynamic_spec is not None):
            raise ValueError("item attributes need a static item table, their ids and their "
                             "count (config.attributes) together")
        if c.attributes:
            self.attributes = w.normal("attribute_embeddings", [c.attributes + 1, c.width],
                                       c.width ** -0.5)
            self.attributes[0].assign(tf.zeros([c.width]))  # the padding: no attribute
            self.attribute_means = AttributeMeans(attributes)
        self.named = w.variables
        self.dynamic = None if dynamic_spec is None else DynamicTable(
            c.items + 1, dynamic_spec, "dynamic_items")

    # ---- ids --------------------------------------------------------------------------------
    def rows(self, ids, training: bool = False):
        """Table rows of item ids (any shape; 0 stays 0). A dynamic table maps raw ids (a
        training step first gives new ids rows: returns (rows, new rows) then); ids without
        a row become 0."""
        if self.dynamic is None:
            return (ids, tf.zeros([0], tf.int64)) if training else ids
        real = tf.where(ids != 0)
        if not training:
            return tf.scatter_nd(real, self.dynamic.lookup(tf.gather_nd(ids, real)),
                                 tf.shape(ids, out_type=tf.int64))
        rows, new_rows = self.dynamic.train_lookup(tf.gather_nd(ids, real))
        self.dynamic.redraw(self.items, new_rows, self.config.seed)
        return tf.scatter_nd(real, rows, tf.shape(ids, out_type=tf.int64)), new_rows

    def candidates(self):
        """bool [N]: which of rows 1..N may be retrieved (a dynamic table's allocated rows),
        or None: all."""
        if self.dynamic is None:
            return None
        return tf.range(1, self.config.items + 1, dtype=tf.int64) <= self.dynamic.allocated

    def item_ids(self, rows):
        """The ids that table rows hold (a dynamic table's raw ids)."""
        return rows if self.dynamic is None else tf.gather(self.dynamic.row_ids, rows)

    # ---- the encoders ----------------------------------------------------------------------
    def encode(self, ids, timestamps=None, seed=None, compute_dtype=tf.float32,
               short_attention: bool = True):
        """ids int64 [b, L'] (L' <= L: the last L' of L positions) -> float32 [b, L', d]:
        position p's vector predicts the next item (a padded position's is the final
        norm's offset, what a history of nothing gives).
        seed (dropout()'s) turns dropout on (training). short_attention: short histories
        attend over their last positions only (encode_real); False under XLA, which cannot
        compile the groups' data-dependent shapes."""
        vectors, at = self.encode_real(ids, timestamps, seed, compute_dtype, short_attention)
        whole = hstu.unpacked(vectors, at, tf.shape(ids, out_type=tf.int64))
        return tf.where((ids > 0)[:, :, None], whole, self.final_norm[1])

    def encode_real(self, ids, timestamps=None, seed=None, compute_dtype=tf.float32,
                    short_attention: bool = True):
        """encode()'s vectors of the positions that hold an item only: (float32 [n, d], their
        int64 [n, 2] (row, position) in ids, in row-major order). Every position-wise step
        runs on these n rows (hstu.Packing), only the attention on a [rows, positions]
        layout: the short histories' over their last SHORT_ATTENTION positions (unless
        short_attention is False, or attention dropout's masks, drawn over the whole
        [b, L', L'] layout, are on)."""
        c = self.config
        short = short_attention and c.attention_dropout == 0
        packing = hstu.Packing(ids, SHORT_ATTENTION if short else None)
        at = packing.at
        # fewer than L columns: the most recent ones (left padding cut), at their positions
        length = tf.shape(ids)[1]
        x = self.item_vectors(hstu.packed(ids, at), "history") * (c.width ** 0.5) + \
            tf.gather(self.positions, tf.cast(at[:, 1], tf.int32) + c.length - length)
        x = dropout(x, c.dropout, seed, 1, at)
        # key j is visible from query i when j <= i and j holds an item (or is i itself, so
        # a padded query still has a key: its output is never read)
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        visible = causal[None] & ((ids > 0)[:, None, :] | tf.eye(length, dtype=tf.bool)[None])
        positions = tf.range(length)
        bias_index = hstu.relative_positions(positions, positions, c.length)
        buckets = hstu.time_buckets(timestamps) if c.timestamps else None
        for b, block in enumerate(self.blocks):
            key = 10 * (b + 1)
            if c.model == "sasrec":
                x = self._sasrec_block(block, x, packing, visible, seed, key, compute_dtype)
            else:
                x = self._hstu_block(block, x, packing, visible, bias_index, buckets, seed, key,
                                     compute_dtype)
        return layer_norm(x, *self.final_norm), at

    def _sasrec_block(self, block, x, packing, visible, seed, key, dtype):
        """x, the output: packed [n, d] (encode_real's)."""
        c, at = self.config, packing.at
        h = tf.cast(layer_norm(x, *block["norm_1"]), dtype)

        def attend(window, q, k, v):
            q, k, v = (split_heads(t, c.heads) for t in (q, k, v))
            logits = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) * \
                (c.width // c.heads) ** -0.5
            logits = tf.where(window(visible)[:, None], logits, -1e9)
            weights = dropout(tf.nn.softmax(logits), c.attention_dropout, seed, key)
            return merge_heads(tf.matmul(tf.cast(weights, dtype), v), c.width)
        # q, k and v in one product (one matmul and its two gradients, not three of each)
        qkv = h @ tf.cast(tf.concat([block[n] for n in ("q", "k", "v")], 1), dtype)
        attended = packing.attention(attend, *tf.split(qkv, 3, axis=1))
        attended = attended @ tf.cast(block["o"], dtype)
        x = x + dropout(tf.cast(attended, tf.float32), c.dropout, seed, key + 1, at)
        h = tf.cast(layer_norm(x, *block["norm_2"]), dtype)
        h = tf.nn.relu(h @ tf.cast(block["ffn_in"], dtype) + tf.cast(block["ffn_in_bias"], dtype))
        h = dropout(tf.cast(h, tf.float32), c.dropout, seed, key + 2, at)
        h = tf.cast(h, dtype) @ tf.cast(block["ffn_out"], dtype) + \
            tf.cast(block["ffn_out_bias"], dtype)
        return x + dropout(tf.cast(h, tf.float32), c.dropout, seed, key + 3, at)

    def _hstu_block(self, block, x, packing, visible, bias_index, buckets, seed, key, dtype):
        c = self.config
        return hstu.layer(block, x, visible, hstu.attention_bias(block, bias_index, buckets),
                          c.heads, c.length, dtype,
                          lambda w: dropout(w, c.attention_dropout, seed, key),
                          lambda g: dropout(g, c.dropout, seed, key + 1, packing.at), packing)

    # ---- scoring ---------------------------------------------------------------------------
    def item_vectors(self, rows=None, read: str = "catalogue"):
        """Item vectors as read and scored: an item's row of the item table, plus the mean of
        its attributes' rows when the model has attributes. rows=None: every row's [N + 1, d];
        else those of `rows` (any shape), gathered: their gradient is rows of the tables.
        read: names this read's collectives when the table is split by rows (each read of a
        step its own name, alike on every rank)."""
        if self._read is not None:
            return self._read if rows is None else tf.gather(self._read, rows)
        if self.shards is not None:
            items = self.shards.whole(self.items, item_read_name(read)) if rows is None else \
                self.shards.lookup(self.items, rows, item_read_name(read))
        elif rows is None:
            items = self.items
        else:
            items = tf.nn.embedding_lookup(self.items, rows)
        if not self.config.attributes:
            return items
        return items + self.attribute_means(self.attributes, rows)

    def _as_scored(self, vectors):
        return tf.math.l2_normalize(vectors, -1) if self.config.normalize else vectors

    def catalogue(self, padded: bool = False):
        """[N, d] the items 1..N as scored (row 0, the padding, is never a candidate);
        padded: [1 + N, d], row 0 kept first (for a caller that leaves it out itself)."""
        vectors = self._as_scored(self.item_vectors())
        return vectors if padded else vectors[1:]

    def scored_items(self, rows, read: str):
        """catalogue()'s vectors of item rows `rows` (1..N, any shape), computed for those
        rows only: a sampled loss's cost and gradient follow the batch, not the catalogue."""
        return self._as_scored(self.item_vectors(rows, read))

    @contextlib.contextmanager
    def reading(self, vectors):
        """Within: item_vectors() reads `vectors` (its own value, every row, computed once,
        e.g. before an evaluation's batches: a split table's collectives then run once, not
        once per batch on ranks with different batch counts); None: the tables."""
        self._read = vectors
        try:
            yield
        finally:
            self._read = None

    def queries(self, vectors):
        """History vectors as scored: normalised, over the temperature."""
        if self.config.normalize:
            vectors = tf.math.l2_normalize(vectors, -1)
        return vectors / self.config.temperature

    def scores(self, vectors, compute_dtype=tf.float32, catalogue=None):
        """[n, d] history vectors -> [n, N] scores of rows 1..N (column i: row i + 1); rows
        that are not candidates score -inf. catalogue: catalogue()'s value, when computed
        beforehand."""
        catalogue = self.catalogue() if catalogue is None else catalogue
        scores = tf.cast(tf.matmul(tf.cast(self.queries(vectors), compute_dtype),
                                   tf.cast(catalogue, compute_dtype), transpose_b=True),
                         tf.float32)
        candidates = self.candidates()
        return scores if candidates is None else tf.where(candidates, scores, -np.inf)
