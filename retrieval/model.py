"""The retrieval family's encoders: SASRec and HSTU over a history of item ids, the next item
scored by a dot product with the same item table that embeds the history.

Batches follow the family's layout (retrieval/data.py): ids int64 [b, L], left-padded with 0,
most recent last. Position p's output predicts the item after position p.

SASRec (Kang & McAuley, 2018): item embedding * sqrt(d) + a learned position, then pre-norm
blocks of causal multi-head softmax attention and a ReLU feed-forward, each a residual.

HSTU (Zhai et al., 2024; Meta's generative-recommenders), per layer:
    U, V, Q, K = split(SiLU(LayerNorm(x) W1 + b1))
    A = SiLU(Q K^T + bias) / L          causal; L the padded length (as Meta's dense code)
    x = x + (U * LayerNorm(A V)) W2 + b2
with `bias` a learned scalar per relative position (j - i) and, when the data has timestamps,
per log-bucket of the time gap between the query's and the key's actions
(floor(ln(max(|t_i - t_j|, 1)) / 0.301), as Meta's bucketing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import tensorflow as tf

from core.dropout import keep_hash
from core.dynamic import DynamicTable
from core.initializers import glorot_normal

MODELS = ("sasrec", "hstu")
TIME_BUCKETS = 128   # log buckets of time gaps: ln(2^64) / 0.301 < 148, the rest clamp
LAYER_NORM_EPSILON = 1e-6


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
    seed: int = 0

    def checkpoint_shape(self) -> dict:
        """What a checkpoint must match to be loaded into this model."""
        return {k: v for k, v in asdict(self).items()
                if k in ("model", "items", "length", "width", "blocks", "heads", "timestamps")}


def layer_norm(x, scale=None, offset=None):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    x = (x - mean) * tf.math.rsqrt(variance + LAYER_NORM_EPSILON)
    return x if scale is None else x * scale + offset


def dropout(x, rate: float, seed, key: int):
    """Dropout whose mask is a hash of (seed, key, global row, element) (core/dropout.py): runs
    repeat and resume exactly, and a rank's rows of a global batch get the masks one process
    gives them. seed: (int64 [2] run seed and step, the rank's first global row); None: no
    dropout (evaluation)."""
    if seed is None or rate <= 0:
        return x
    step_seed, first_row = seed
    flat = tf.reshape(x, [tf.shape(x)[0], -1])
    threshold = tf.constant(min(round(rate * 2 ** 32), 2 ** 32 - 1), tf.uint32)
    keep = keep_hash(tf.shape(flat)[0], tf.shape(flat)[1],
                     step_seed + tf.constant([0, 1 << 20], tf.int64) * key, first_row)
    kept = tf.where(keep >= threshold, flat / (1 - rate), tf.zeros_like(flat))
    return tf.reshape(kept, tf.shape(x))


def time_buckets(timestamps):
    """[b, L] int64 -> [b, L, L] bucket of |t_i - t_j| (query i, key j)."""
    gap = tf.abs(timestamps[:, :, None] - timestamps[:, None, :])
    gap = tf.cast(tf.maximum(gap, 1), tf.float32)
    return tf.minimum(tf.cast(tf.math.log(gap) / 0.301, tf.int32), TIME_BUCKETS - 1)


class _Weights:
    """Named variables drawn from per-variable seeded generators (core/initializers.py)."""

    def __init__(self, seed: int):
        self.seed, self.variables = seed, {}

    def matrix(self, name: str, rows: int, cols: int):
        return self._add(name, glorot_normal(rows, cols, self.seed, len(self.variables)))

    def constant(self, name: str, shape, value: float):
        return self._add(name, np.full(shape, value, np.float32))

    def normal(self, name: str, shape, std: float):
        rng = np.random.default_rng([self.seed, len(self.variables)])
        return self._add(name, (rng.standard_normal(shape) * std).astype(np.float32))

    def _add(self, name: str, value):
        self.variables[name] = tf.Variable(value, name=name.replace("/", "_"))
        return self.variables[name]


class Encoder(tf.Module):
    """The item table, the positions and the blocks of one model. `encode` gives every
    position's history vector; `scores` compares history vectors with the whole catalogue."""

    def __init__(self, config: RetrievalConfig, dynamic_spec=None):
        """dynamic_spec: a DynamicSpec makes the item table dynamic (raw ids)."""
        super().__init__(name=config.model)
        if config.model not in MODELS:
            raise ValueError(f"--model must be one of {list(MODELS)}, found {config.model!r}")
        if config.width % config.heads:
            raise ValueError(f"--embedding_dim {config.width} is not a multiple of --num_heads "
                             f"{config.heads}")
        self.config, c = config, config
        w = _Weights(c.seed)
        self.items = w.normal("item_embeddings", [c.items + 1, c.width], c.width ** -0.5)
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
                block = {"uvqk": w.matrix(p + "uvqk", c.width, 4 * c.width),
                         "uvqk_bias": w.constant(p + "uvqk_bias", [4 * c.width], 0.0),
                         "o": w.matrix(p + "o", c.width, c.width),
                         "o_bias": w.constant(p + "o_bias", [c.width], 0.0),
                         "position_bias": w.constant(p + "position_bias", [2 * c.length - 1],
                                                     0.0)}
                if c.timestamps:
                    block["time_bias"] = w.constant(p + "time_bias", [TIME_BUCKETS], 0.0)
            self.blocks.append(block)
        self.final_norm = (w.constant("final_norm/scale", [c.width], 1.0),
                           w.constant("final_norm/offset", [c.width], 0.0))
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
    def encode(self, ids, timestamps=None, seed=None, compute_dtype=tf.float32):
        """ids int64 [b, L'] (L' <= L: the last L' of L positions) -> float32 [b, L', d]:
        position p's vector predicts the next item.
        seed (dropout()'s) turns dropout on (training)."""
        c = self.config
        valid = tf.cast(ids > 0, tf.float32)[:, :, None]
        # fewer than L columns: the most recent ones (left padding cut), at their positions
        x = tf.nn.embedding_lookup(self.items, ids) * (c.width ** 0.5) + \
            self.positions[c.length - tf.shape(ids)[1]:]
        x = dropout(x, c.dropout, seed, 1) * valid
        # key j is visible from query i when j <= i and j holds an item (or is i itself, so
        # a padded query still has a key: its output is masked anyway)
        length = tf.shape(ids)[1]
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        visible = causal[None] & ((ids > 0)[:, None, :] | tf.eye(length, dtype=tf.bool)[None])
        bias_index = tf.range(length)[None, :] - tf.range(length)[:, None] + c.length - 1
        buckets = time_buckets(timestamps) if c.timestamps else None
        for b, block in enumerate(self.blocks):
            key = 10 * (b + 1)
            if c.model == "sasrec":
                x = self._sasrec_block(block, x, visible, seed, key, compute_dtype)
            else:
                x = self._hstu_block(block, x, visible, bias_index, buckets, seed, key,
                                     compute_dtype)
            x *= valid
        return layer_norm(x, *self.final_norm)

    def _heads(self, x):
        """[b, L, h*e] -> [b, h, L, e]"""
        b, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [b, length, self.config.heads, -1]), [0, 2, 1, 3])

    def _merged(self, x):
        """[b, h, L, e] -> [b, L, h*e]"""
        b, length = tf.shape(x)[0], tf.shape(x)[2]
        return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [b, length, self.config.width])

    def _sasrec_block(self, block, x, visible, seed, key, dtype):
        c = self.config
        h = tf.cast(layer_norm(x, *block["norm_1"]), dtype)
        q, k, v = (self._heads(h @ tf.cast(block[n], dtype)) for n in ("q", "k", "v"))
        logits = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) * \
            (c.width // c.heads) ** -0.5
        logits = tf.where(visible[:, None], logits, -1e9)
        weights = dropout(tf.nn.softmax(logits), c.attention_dropout, seed, key)
        attended = self._merged(tf.matmul(tf.cast(weights, dtype), v)) @ tf.cast(block["o"], dtype)
        x = x + dropout(tf.cast(attended, tf.float32), c.dropout, seed, key + 1)
        h = tf.cast(layer_norm(x, *block["norm_2"]), dtype)
        h = tf.nn.relu(h @ tf.cast(block["ffn_in"], dtype) + tf.cast(block["ffn_in_bias"], dtype))
        h = dropout(tf.cast(h, tf.float32), c.dropout, seed, key + 2)
        h = tf.cast(h, dtype) @ tf.cast(block["ffn_out"], dtype) + \
            tf.cast(block["ffn_out_bias"], dtype)
        return x + dropout(tf.cast(h, tf.float32), c.dropout, seed, key + 3)

    def _hstu_block(self, block, x, visible, bias_index, buckets, seed, key, dtype):
        c = self.config
        h = tf.cast(layer_norm(x), dtype)
        uvqk = tf.nn.silu(h @ tf.cast(block["uvqk"], dtype) + tf.cast(block["uvqk_bias"], dtype))
        u, v, q, k = tf.split(uvqk, 4, axis=-1)
        bias = tf.gather(block["position_bias"], bias_index)[None, None]
        if buckets is not None:
            bias += tf.gather(block["time_bias"], buckets)[:, None]
        scores = tf.cast(tf.matmul(self._heads(q), self._heads(k), transpose_b=True), tf.float32)
        weights = tf.nn.silu(scores + bias) / tf.cast(c.length, tf.float32)
        weights = tf.where(visible[:, None], weights, 0.0)
        weights = dropout(weights, c.attention_dropout, seed, key)
        attended = tf.cast(self._merged(tf.matmul(tf.cast(weights, dtype), self._heads(v))),
                           tf.float32)
        gated = tf.cast(u, tf.float32) * layer_norm(attended)
        gated = dropout(gated, c.dropout, seed, key + 1)
        out = tf.cast(gated, dtype) @ tf.cast(block["o"], dtype) + tf.cast(block["o_bias"], dtype)
        return x + tf.cast(out, tf.float32)

    # ---- scoring ---------------------------------------------------------------------------
    def catalogue(self):
        """[N, d] the items 1..N as scored (row 0, the padding, is never a candidate)."""
        items = self.items[1:]
        return tf.math.l2_normalize(items, -1) if self.config.normalize else items

    def queries(self, vectors):
        """History vectors as scored: normalised, over the temperature."""
        if self.config.normalize:
            vectors = tf.math.l2_normalize(vectors, -1)
        return vectors / self.config.temperature

    def scores(self, vectors, compute_dtype=tf.float32):
        """[n, d] history vectors -> [n, N] scores of rows 1..N (column i: row i + 1); rows
        that are not candidates score -inf."""
        scores = tf.cast(tf.matmul(tf.cast(self.queries(vectors), compute_dtype),
                                   tf.cast(self.catalogue(), compute_dtype), transpose_b=True),
                         tf.float32)
        candidates = self.candidates()
        return scores if candidates is None else tf.where(candidates, scores, -np.inf)
