"""The HSTU layer (Zhai et al., 2024; Meta's generative-recommenders), read by retrieval's
encoder and by the SIM family's ranker. Per layer, over tokens x [b, T, d]:

    U, V, Q, K = split(SiLU(LayerNorm(x) W1 + b1))
    A = SiLU(Q K^T + bias) / n          masked by `visible` (the caller's: causal, ...)
    x = x + (U * LayerNorm(A V)) W2 + b2

with n a constant (the padded length, as Meta's dense code) and `bias` a learned scalar per
relative position (j - i) plus, where the data has timestamps, one per log-bucket of the time
gap between the query's and the key's actions (floor(ln(max(|t_i - t_j|, 1)) / 0.301), as
Meta's bucketing).

Target-aware ranking (M-FALCON, the paper's section 3.4): `layer_with_targets` runs one layer
over a history and C target tokens, each target attending to the history keys its mask
allows and to itself, never to another target: C targets cost O(L^2 + C L), and a target's
output is the one it has when scored alone.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.dropout import hash_dropout
from core.initializers import glorot_normal

TIME_BUCKETS = 128   # log buckets of time gaps: ln(2^64) / 0.301 < 148, the rest clamp
LAYER_NORM_EPSILON = 1e-6


# rows of a split table drawn at a time (NamedWeights.normal)
DRAWN_ROWS = 1 << 16


class NamedWeights:
    """Named variables drawn from per-variable seeded generators (core/initializers.py): the
    n-th variable created draws from (seed, first_key + n)."""

    def __init__(self, seed: int, first_key: int = 0):
        self.seed, self.first_key, self.variables = seed, first_key, {}

    def matrix(self, name: str, rows: int, cols: int):
        return self._add(name, glorot_normal(rows, cols, self.seed, self._key()))

    def constant(self, name: str, shape, value: float):
        return self._add(name, np.full(shape, value, np.float32))

    def normal(self, name: str, shape, std: float, rows: tuple = None):
        """rows (start, stop): only those rows of the [shape[0], ...] draw (a table split by
        rows over processes), equal to the whole draw's. The draw is made a block of rows at
        a time, so neither its float64 whole nor (split) the whole table ever exists."""
        rng = np.random.default_rng([self.seed, self._key()])
        start, stop = rows or (0, shape[0])
        out = np.empty((stop - start, *shape[1:]), np.float32)
        for first in range(0, stop, DRAWN_ROWS):
            block = rng.standard_normal((min(DRAWN_ROWS, stop - first), *shape[1:])) * std
            if first + len(block) > start:
                skipped = max(start - first, 0)
                out[first + skipped - start:first + len(block) - start] = block[skipped:]
        return self._add(name, out)

    def _key(self) -> int:
        return self.first_key + len(self.variables)

    def _add(self, name: str, value):
        self.variables[name] = tf.Variable(value, name=name.replace("/", "_"))
        return self.variables[name]


def block_weights(weights: NamedWeights, prefix: str, width: int, positions: int,
                  timestamps: bool = False) -> dict:
    """One layer's variables, named prefix + uvqk, uvqk_bias, o, o_bias, position_bias (one
    per relative position of `positions` positions: 2 * positions - 1) and time_bias."""
    block = {"uvqk": weights.matrix(prefix + "uvqk", width, 4 * width),
             "uvqk_bias": weights.constant(prefix + "uvqk_bias", [4 * width], 0.0),
             "o": weights.matrix(prefix + "o", width, width),
             "o_bias": weights.constant(prefix + "o_bias", [width], 0.0),
             "position_bias": weights.constant(prefix + "position_bias", [2 * positions - 1],
                                               0.0)}
    if timestamps:
        block["time_bias"] = weights.constant(prefix + "time_bias", [TIME_BUCKETS], 0.0)
    return block


def layer_norm(x, scale=None, offset=None):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    x = (x - mean) * tf.math.rsqrt(variance + LAYER_NORM_EPSILON)
    return x if scale is None else x * scale + offset


def dropout(x, rate: float, seed, key: int, at=None):
    """Dropout whose mask is a hash of (seed, key, global row, element) (core/dropout.py): runs
    repeat and resume exactly, and a rank's rows of a global batch get the masks one process
    gives them. seed: (int64 [2] run seed and step, the rank's first global row); None: no
    dropout (evaluation). at: x is packed (packed()'s [n, d]): each element gets the mask it
    has in the [b, T, d] whole."""
    if seed is None or rate <= 0:
        return x
    step_seed, first_row = seed
    seed = step_seed + tf.constant([0, 1 << 20], tf.int64) * key
    if at is None:
        flat = tf.reshape(x, [tf.shape(x)[0], -1])
        rows = tf.range(tf.shape(flat)[0], dtype=tf.int32) + first_row
        offsets = tf.zeros_like(rows)
    else:  # element e of position t is element t * d + e of its row, as in the whole
        flat, at = x, tf.cast(at, tf.int32)
        rows, offsets = at[:, 0] + first_row, at[:, 1] * tf.shape(x)[1]
    return tf.reshape(hash_dropout(flat, rows, offsets, seed, rate), tf.shape(x))


def packed(x, at):
    """[b, T, ...] -> [n, ...]: the rows at int64 [n, 2] (row, position) indices (tf.where of
    a [b, T] mask of the real positions). Position-wise work on a packed batch skips the
    padding: Beauty's histories fill 13 % of their 50 positions."""
    return tf.gather_nd(x, at)


def unpacked(x, at, rows_and_length):
    """packed()'s inverse: [n, ...] -> [b, T, ...] (rows_and_length: int64 [2], b and T) with
    zeros where no row was."""
    return tf.scatter_nd(at, x, tf.concat([rows_and_length,
                                           tf.shape(x, out_type=tf.int64)[1:]], 0))


class Packing:
    """A batch of left-padded rows ids [b, T] packed to its n real positions (`at`, row-major),
    and where its attention runs: rows of at most `short` items attend over their last
    `short` positions only, the others over all T (Beauty: most histories are short, and
    attention over the padded [b, T, T] cost as much as the rest of the encoder). A row's
    attention reads its own row only, so the groups change no value. short None: one group,
    the whole [b, T] layout (what attention dropout's masks are defined on)."""

    def __init__(self, ids, short: int = None):
        self.at = tf.where(ids > 0)
        self.shape = tf.shape(ids, out_type=tf.int64)
        # each group: (its rows, None: all; its first position; its members' packed
        # positions, None: all; their (row, position) in the group's [rows, T'] layout)
        self.groups = [(None, 0, None, self.at)]
        if short is not None:
            long = tf.reduce_sum(tf.cast(ids > 0, tf.int64), 1) > short
            self.groups = [self._group(tf.logical_not(long),
                                       tf.minimum(tf.constant(short, tf.int64), self.shape[1])),
                           self._group(long, self.shape[1])]

    def _group(self, chosen, width):
        slot = tf.cumsum(tf.cast(chosen, tf.int64)) - 1  # a chosen row's index in the group
        members = tf.where(tf.gather(chosen, self.at[:, 0]))[:, 0]
        at = tf.gather(self.at, members)
        start = self.shape[1] - width
        return (tf.where(chosen)[:, 0], start, members,
                tf.stack([tf.gather(slot, at[:, 0]), at[:, 1] - start], 1))

    def attention(self, attend, *inputs):
        """attend(window, *unpacked) -> [b', T', e] for each group: its rows' packed inputs
        [n, e] unpacked to [b', T', e], window(t) its part of a [b or 1, ..., T, T] tensor of
        the whole layout -> the outputs packed, [n, e]."""
        outputs = []
        for rows, start, members, at in self.groups:
            rows_and_length = self.shape if rows is None else \
                tf.stack([tf.size(rows, out_type=tf.int64), self.shape[1] - start])

            def window(t, rows=rows, start=start):  # a leading 1 broadcasts to any rows
                t = t if rows is None or t.shape[0] == 1 else tf.gather(t, rows)
                return t[..., start:, start:]
            mine = inputs if members is None else (tf.gather(x, members) for x in inputs)
            outputs.append(packed(attend(window, *(unpacked(x, at, rows_and_length)
                                                   for x in mine)), at))
        if len(outputs) == 1:
            return outputs[0]
        return tf.dynamic_stitch([tf.cast(g[2], tf.int32) for g in self.groups], outputs)


def time_buckets(timestamps):
    """[b, L] int64 -> [b, L, L] bucket of |t_i - t_j| (query i, key j)."""
    gap = tf.abs(timestamps[:, :, None] - timestamps[:, None, :])
    gap = tf.cast(tf.maximum(gap, 1), tf.float32)
    return tf.minimum(tf.cast(tf.math.log(gap) / 0.301, tf.int32), TIME_BUCKETS - 1)


def relative_positions(query_positions, key_positions, positions: int):
    """[Tq], [Tk] int32 positions -> [Tq, Tk] index of (key - query) in a position_bias of
    `positions` positions."""
    return key_positions[None, :] - query_positions[:, None] + positions - 1


def attention_bias(block, bias_index, buckets=None):
    """-> [1 or b, 1, Tq, Tk] float32: the position bias at bias_index [Tq, Tk], plus the
    time bias at buckets [b, Tq, Tk] when given."""
    bias = tf.gather(block["position_bias"], bias_index)[None, None]
    if buckets is not None:
        bias += tf.gather(block["time_bias"], buckets)[:, None]
    return bias


def split_heads(x, heads: int):
    """[b, T, h*e] -> [b, h, T, e]"""
    b, length = tf.shape(x)[0], tf.shape(x)[1]
    return tf.transpose(tf.reshape(x, [b, length, heads, -1]), [0, 2, 1, 3])


def merge_heads(x, width: int):
    """[b, h, T, e] -> [b, T, width = h*e]"""
    b, length = tf.shape(x)[0], tf.shape(x)[2]
    return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [b, length, width])


def _projections(variables, x, dtype):
    """x [b, T, d] -> U, V, Q, K [b, T, d] in dtype."""
    h = tf.cast(layer_norm(x), dtype)
    uvqk = tf.nn.silu(h @ tf.cast(variables["uvqk"], dtype)
                      + tf.cast(variables["uvqk_bias"], dtype))
    return tf.split(uvqk, 4, axis=-1)


def _weights(scores, bias, normalizer, visible=None):
    """SiLU(scores + bias) / n, 0 where not visible (float32)."""
    weights = tf.nn.silu(tf.cast(scores, tf.float32) + bias) / tf.cast(normalizer, tf.float32)
    return weights if visible is None else tf.where(visible, weights, 0.0)


def _output(variables, x, u, attended, dtype, drop=None):
    """The residual update of x from U and the attended values A V (float32)."""
    gated = tf.cast(u, tf.float32) * layer_norm(attended)
    if drop is not None:
        gated = drop(gated)
    out = tf.cast(gated, dtype) @ tf.cast(variables["o"], dtype) + \
        tf.cast(variables["o_bias"], dtype)
    return x + tf.cast(out, tf.float32)


def layer(variables, x, visible, bias, heads: int, normalizer, dtype=tf.float32,
          attention_drop=None, drop=None, packing=None):
    """One HSTU layer (variables: block_weights()'s) over x [b, T, d] float32 -> [b, T, d].
    visible: bool [b, T, T] (query i may read key j); bias: attention_bias()'s;
    normalizer: n; attention_drop / drop: functions applied to the attention weights
    [b, h, T, T] and to U * LayerNorm(A V) [b, T, d] (dropout while training; None: none).
    packing: a Packing, x is packed ([n, d], and so are the output and drop's input): only
    the attention reads a [rows, T] layout, where padding is never visible."""
    width = x.shape[-1]
    u, v, q, k = _projections(variables, x, dtype)

    def attend(window, v, q, k):
        scores = tf.matmul(split_heads(q, heads), split_heads(k, heads), transpose_b=True)
        weights = _weights(scores, window(bias), normalizer, window(visible)[:, None])
        if attention_drop is not None:
            weights = attention_drop(weights)
        return merge_heads(tf.matmul(tf.cast(weights, dtype), split_heads(v, heads)), width)
    attended = attend(lambda t: t, v, q, k) if packing is None else \
        packing.attention(attend, v, q, k)
    return _output(variables, x, u, tf.cast(attended, tf.float32), dtype, drop)


def layer_with_targets(variables, x, targets, visible, bias, target_visible, target_bias,
                       self_bias, heads: int, normalizer, dtype=tf.float32):
    """One HSTU layer over a history x [b, L, d] and targets [b, C, d] (float32) -> (x,
    targets). The history attends to itself as layer() does (visible [b, L, L], bias);
    target c attends to the history keys target_visible [b, C, L] allows (target_bias
    [1 or b, 1, C, L]) and to itself (self_bias: a scalar), to no other target."""
    width = x.shape[-1]
    u, v, q, k = _projections(variables, x, dtype)
    v, q, k = (split_heads(t, heads) for t in (v, q, k))
    target_u, tv, tq, tk = _projections(variables, targets, dtype)
    tv, tq, tk = (split_heads(t, heads) for t in (tv, tq, tk))
    weights = _weights(tf.matmul(q, k, transpose_b=True), bias, normalizer, visible[:, None])
    to_history = _weights(tf.matmul(tq, k, transpose_b=True), target_bias, normalizer,
                          target_visible[:, None])                         # [b, h, C, L]
    to_self = _weights(tf.reduce_sum(tq * tk, -1), self_bias, normalizer)  # [b, h, C]
    attended = merge_heads(tf.matmul(tf.cast(weights, dtype), v), width)
    target_attended = merge_heads(tf.matmul(tf.cast(to_history, dtype), v)
                                  + tf.cast(to_self, dtype)[..., None] * tv, width)
    return (_output(variables, x, u, tf.cast(attended, tf.float32), dtype),
            _output(variables, targets, target_u, tf.cast(target_attended, tf.float32), dtype))
