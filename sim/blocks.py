"""Building blocks of DIN, DIEN and SIM as functions of tensors and plain variables.

Sequences are [batch, steps, width] with a float mask [batch, steps] (1 = a behaviour,
0 = padding). Every block is written so that masked steps contribute nothing: appending
padding to a sequence never changes a result.
"""
from __future__ import annotations

import tensorflow as tf

from core.initializers import glorot_normal
from core.layers import MLP

def apply_mlp(mlp: MLP, x, compute_dtype):
    """The MLP on the last axis of a tensor of any rank (flattened to one matmul)."""
    leading = tf.shape(x)[:-1]
    y = mlp(tf.reshape(x, [-1, x.shape[-1]]), compute_dtype)
    return tf.reshape(y, tf.concat([leading, [y.shape[-1]]], 0))


class AttentionUnit(tf.Module):
    """DIN's activation unit: score(q, k) = MLP([q, k, q - k, q * k]) -> [B, S].

    The first layer's kernel is one [4W, H] matrix (blocks for q, k, q-k, q*k), applied in
    the equivalent form q (Wq + Wd) + [k, q*k] [Wk - Wd; Wp]: the query's part once per row.
    Over long sequences (S >= PER_ROW_MIN_STEPS) the keys' part is k (Wk - Wd + diag(q) Wp):
    one [W, H] kernel per row, a batched matmul of width W instead of 2W (half the
    multiply-adds, no [B, S, 2W] product); over short ones the per-row kernels cost more
    than they save."""

    PER_ROW_MIN_STEPS = 32

    def __init__(self, item_width: int, widths, seed: int, key: int, name: str):
        super().__init__(name=name)
        with self.name_scope:
            self.kernel = tf.Variable(glorot_normal(4 * item_width, widths[0], seed, key),
                                      name="kernel")
            self.bias = tf.Variable(tf.zeros([widths[0]]), name="bias")
            self.rest = MLP(widths[0], tuple(widths[1:]) + (1,), False, seed, key + 1, "rest")

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/kernel": self.kernel, f"{prefix}/bias": self.bias,
                **self.rest.named_variables(f"{prefix}/rest")}

    def __call__(self, query, keys, compute_dtype):
        wq, wk, wd, wp = tf.split(tf.cast(self.kernel, compute_dtype), 4, axis=0)
        per_row = tf.nn.bias_add(tf.matmul(query, wq + wd), tf.cast(self.bias, compute_dtype))
        if (keys.shape[1] or 0) >= self.PER_ROW_MIN_STEPS:
            row_kernels = (wk - wd)[None] + query[:, :, None] * wp[None]  # [B, W, H]
            per_step = tf.matmul(keys, row_kernels)
        else:
            per_step = matmul_last_axis(tf.concat([keys, query[:, None, :] * keys], -1),
                                        tf.concat([wk - wd, wp], 0))
        hidden = tf.nn.relu(per_row[:, None, :] + per_step)
        return tf.squeeze(apply_mlp(self.rest, hidden, compute_dtype), axis=-1)


def dot_product(query, keys, compute_dtype=None):
    """NVIDIA's default item-item interaction: score(q, k) = q . k -> [B, S]. No variables;
    same call as an AttentionUnit's."""
    return tf.reduce_sum(query[:, None, :] * keys, axis=-1)


def masked_softmax(scores, mask):
    """Softmax over the valid steps; padding gets exactly 0. Padding scores become the
    dtype's lowest finite value, as NVIDIA's (a fixed -1e9 is -inf in float16): a row of
    padding only then has a finite softmax, zeroed by the mask, rather than NaN."""
    weights = tf.nn.softmax(tf.where(mask > 0, scores,
                                     tf.constant(scores.dtype.min, scores.dtype)))
    return weights * mask


def attention_pool(unit, query, keys, mask, compute_dtype, normalize: bool = False):
    """Weighted sum of the keys by their scores against the query (unit: an AttentionUnit
    or dot_product). normalize=True: a masked softmax of the scores, as NVIDIA's
    DINItemSequenceInteractionBlock; False: the raw scores (the activation unit as in the
    DIN paper: the pooled norm then carries how much of the history matches).
    Returns (pooled [B, W], weights [B, S])."""
    if unit is dot_product and normalize:
        return dot_attention_pool(query, keys, mask)
    scores = unit(query, keys, compute_dtype)
    weights = masked_softmax(scores, mask) if normalize else scores * mask
    return tf.reduce_sum(weights[:, :, None] * keys, axis=1), weights


def dot_attention_pool(query, keys, mask):
    """The dot product's masked-softmax pool as batched matmuls, its gradient written by hand:
    autodiff of the broadcast products makes [B, S, W] temporaries for every product and its
    reduction (about 1.8x the time at batch 256, 2.8x at 4096 on CPU). With w the weights,
    g the upstream gradient of the pooled vector and h that of the weights:
        d_scores = w * (k g + h - sum(w * (k g + h)))   (softmax; 0 at padding, as w)
        d_query = d_scores k,   d_keys = d_scores q^T + w g^T  (one matmul of rank 2)."""

    @tf.custom_gradient
    def pool(query, keys):
        scores = tf.squeeze(tf.matmul(keys, query[:, :, None]), -1)
        weights = masked_softmax(scores, mask)
        pooled = tf.squeeze(tf.matmul(weights[:, None, :], keys), 1)

        def grad(d_pooled, d_weights):
            d_w = tf.squeeze(tf.matmul(keys, d_pooled[:, :, None]), -1)
            if d_weights is not None:
                d_w += d_weights
            d_scores = weights * (d_w - tf.reduce_sum(weights * d_w, -1, keepdims=True))
            d_query = tf.squeeze(tf.matmul(d_scores[:, None, :], keys), 1)
            d_keys = tf.matmul(tf.stack([d_scores, weights], -1),
                               tf.stack([query, d_pooled], 1))
            return d_query, d_keys
        return (pooled, weights), grad
    return pool(query, keys)


class GRU(tf.Module):
    """A GRU (update gate z, reset gate r applied before the recurrent matmul):
        z = s(x Wz + h Uz + bz), r = s(x Wr + h Ur + br), c = tanh(x Wc + (r*h) Uc + bc)
        h' = (1 - u) h + u c   with u = z (GRU) or u = a z (AUGRU, a = attention weight).
    A masked step keeps h. The input projections of all steps are one matmul outside the
    loop; only the recurrent part runs per step, in a tf.scan."""

    def __init__(self, input_width: int, units: int, seed: int, key: int, name: str):
        super().__init__(name=name)
        self.units = units
        with self.name_scope:
            self.kernel = tf.Variable(glorot_normal(input_width, 3 * units, seed, key),
                                      name="kernel")
            self.recurrent = tf.Variable(glorot_normal(units, 3 * units, seed, key + 1),
                                         name="recurrent_kernel")
            self.bias = tf.Variable(tf.zeros([3 * units]), name="bias")

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/kernel": self.kernel, f"{prefix}/recurrent_kernel": self.recurrent,
                f"{prefix}/bias": self.bias}

    def __call__(self, inputs, mask, compute_dtype, attention=None):
        """inputs [B, S, D], mask [B, S], attention [B, S] or None -> states [B, S, units]
        (the state after each step)."""
        dtype = compute_dtype
        projected = tf.nn.bias_add(matmul_last_axis(inputs, tf.cast(self.kernel, dtype)),
                                   tf.cast(self.bias, dtype))
        hz, hr, hc = tf.split(tf.cast(self.recurrent, dtype), 3, axis=1)
        if attention is None:
            attention = tf.ones_like(mask)
        time_major = [tf.transpose(projected, [1, 0, 2]), tf.transpose(mask)[:, :, None],
                      tf.transpose(attention)[:, :, None]]

        def step(h, elems):
            x, m, a = elems
            xz, xr, xc = tf.split(x, 3, axis=1)
            z = tf.sigmoid(xz + tf.matmul(h, hz))
            r = tf.sigmoid(xr + tf.matmul(h, hr))
            c = tf.tanh(xc + tf.matmul(r * h, hc))
            u = a * z
            new = (1 - u) * h + u * c
            return m * new + (1 - m) * h

        initial = tf.zeros([tf.shape(inputs)[0], self.units], dtype)
        states = tf.scan(step, time_major, initializer=initial)
        return tf.transpose(states, [1, 0, 2])


def gather_rows(params, indices):
    """tf.gather(params, indices) along axis 0, whose gradient is params' shape, dense: one
    segment sum of the positions' gradients, where autodiff would hand a list of every
    position's row (IndexedSlices) to the ops before it."""

    @tf.custom_gradient
    def gather(params):
        def grad(d_out):
            return tf.math.unsorted_segment_sum(d_out, indices, tf.shape(params)[0])
        return tf.gather(params, indices), grad
    return gather(params)


def matmul_last_axis(x, kernel):
    """[B, S, D] @ [D, K] as one 2-D matmul."""
    leading = tf.shape(x)[:-1]
    y = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), kernel)
    return tf.reshape(y, tf.concat([leading, [kernel.shape[-1]]], 0))


def auxiliary_loss(aux_mlp: MLP, states, positive_next, negative_next, mask, compute_dtype):
    """DIEN's auxiliary loss per row: the state after behaviour t must tell the real
    behaviour t+1 (positive) from a sampled one (negative), by a logistic loss through an
    auxiliary network on [h_t, e]. Averaged over the row's valid (t, t+1) pairs; 0 for a row
    with fewer than two behaviours. Returns [B] float32."""
    h = states[:, :-1]
    pair_mask = tf.cast(mask[:, :-1] * mask[:, 1:], tf.float32)
    pos = tf.squeeze(apply_mlp(aux_mlp, tf.concat([h, positive_next[:, 1:]], -1),
                               compute_dtype), -1)
    neg = tf.squeeze(apply_mlp(aux_mlp, tf.concat([h, negative_next[:, 1:]], -1),
                               compute_dtype), -1)
    pair_loss = tf.nn.softplus(-tf.cast(pos, tf.float32)) + tf.nn.softplus(
        tf.cast(neg, tf.float32))
    pairs = tf.reduce_sum(pair_mask, axis=1)
    return tf.reduce_sum(pair_loss * pair_mask, axis=1) / tf.maximum(pairs, 1.0)


def top_k_selection(weights, k: int):
    """The GSU's selection as NVIDIA's SIM makes it: indices [B, k] of the k largest
    attention weights of each row (a masked softmax, 0 at padding; ties: earlier position
    first) and their mask, 1 where the weight is > 0: padding (or a behaviour whose weight
    underflowed to 0) is chosen only when fewer than k weights are positive, and stays
    masked."""
    values, indices = tf.math.top_k(tf.cast(weights, tf.float32), k=k, sorted=True)
    return indices, tf.cast(values > 0, weights.dtype)


def masked_mean_plus_one(sequence, mask):
    """NVIDIA's SIM's mean of the selection: the masked sum over (valid steps + 1), so a row
    with no valid step gives 0."""
    total = tf.reduce_sum(sequence * mask[:, :, None], axis=1)
    return total / (tf.reduce_sum(mask, axis=1, keepdims=True) + 1)
