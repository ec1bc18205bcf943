"""Building blocks of DIN, DIEN and SIM as functions of tensors and plain variables.

Sequences are [batch, steps, width] with a float mask [batch, steps] (1 = a behaviour,
0 = padding). The compact architecture's blocks (AttentionUnit, GRU, auxiliary_loss) are
written so that masked steps contribute nothing; the reference architecture's
(ClassifierMLP, ResetAfterGRU, AUGRU, TargetAdaptedAttention, reference_auxiliary_loss)
compute what NVIDIA's layers compute, padding steps included (their inputs are zero
vectors there, as the reference's).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core import fused_ops
from core.initializers import glorot_normal
from core.layers import MLP

PRELU_INITIAL_SLOPE = 0.1  # NVIDIA's PReLU(alpha_initializer=Constant(0.1))
AUX_EPS = 1e-6  # NVIDIA's EPS added to the auxiliary network's probabilities


def glorot_uniform(fan_in: int, fan_out: int, seed: int, key: int) -> np.ndarray:
    """Keras's default Dense kernel initialiser, seeded per variable as core.initializers."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    rng = np.random.default_rng([seed, key])
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)


def orthogonal_columns(rows: int, blocks: int, seed: int, key: int) -> np.ndarray:
    """[rows, blocks * rows]: Keras's orthogonal initialiser for a GRU's recurrent kernel."""
    rng = np.random.default_rng([seed, key])
    q, r = np.linalg.qr(rng.standard_normal((blocks * rows, rows)))
    return (q * np.sign(np.diag(r))).T.astype(np.float32)

def apply_mlp(mlp: MLP, x, compute_dtype):
    """The MLP on the last axis of a tensor of any rank (flattened to one matmul)."""
    leading = tf.shape(x)[:-1]
    y = mlp(tf.reshape(x, [-1, x.shape[-1]]), compute_dtype)
    return tf.reshape(y, tf.concat([leading, [y.shape[-1]]], 0))


class AttentionUnit(tf.Module):
    """DIN's activation unit: score(q, k) = MLP([q, k, q - k, q * k]) -> [B, S] (ReLU; the
    compact architecture's and --item_item_interaction activation_unit's scorer)."""

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
        hidden = tf.nn.relu(pair_layer(query, keys, self.kernel, self.bias, compute_dtype))
        return tf.squeeze(apply_mlp(self.rest, hidden, compute_dtype), axis=-1)


PER_ROW_MIN_STEPS = 32


def pair_layer(query, keys, kernel, bias, compute_dtype, time_major: bool = False):
    """The first layer of an attention MLP on [q, k, q - k, q * k] (kernel [4W, H], blocks
    for q, k, q-k, q*k), before its activation -> [B, S, H] ([S, B, H] for time-major keys
    [S, B, W]).

    Applied in the equivalent form q (Wq + Wd) + k (Wk - Wd) + (q*k) Wp: the query's part
    once per row. Over long sequences (S >= PER_ROW_MIN_STEPS) the keys' part is
    k (Wk - Wd + diag(q) Wp): one [W, H] kernel per row, a batched matmul of width W instead
    of 2W (half the multiply-adds, no [B, S, 2W] product); over short ones the per-row
    kernels cost more than they save."""
    wq, wk, wd, wp = tf.split(tf.cast(kernel, compute_dtype), 4, axis=0)
    per_row = tf.nn.bias_add(tf.matmul(query, wq + wd), tf.cast(bias, compute_dtype))
    at_steps = (lambda x: x[None]) if time_major else (lambda x: x[:, None, :])
    if not time_major and (keys.shape[1] or 0) >= PER_ROW_MIN_STEPS:
        row_kernels = (wk - wd)[None] + query[:, :, None] * wp[None]  # [B, W, H]
        per_step = tf.matmul(keys, row_kernels)
    else:  # two products summed: no [.., 2W] concatenation (nor its split backward)
        per_step = matmul_last_axis(keys, wk - wd) + matmul_last_axis(at_steps(query) * keys,
                                                                      wp)
    return at_steps(per_row) + per_step


def prelu(x, alpha):
    """max(x, 0) + alpha min(x, 0), alpha per unit (Keras's PReLU without shared axes)."""
    return tf.nn.relu(x) - tf.cast(alpha, x.dtype) * tf.nn.relu(-x)


class ClassifierMLP(tf.Module):
    """NVIDIA's CTRClassificationMLP: for each width, Dense then the activation (PReLU with
    a learned per-unit slope started at 0.1, or sigmoid for DIEN's auxiliary network), then
    a linear Dense to one logit. Kernels glorot-uniform and biases 0, as Keras's Dense.
    Dropout (when given) sits between the last hidden layer and the scorer, as NVIDIA's."""

    def __init__(self, input_width: int, widths, activation: str, seed: int, key: int,
                 name: str):
        super().__init__(name=name)
        self.activation, self.layers = activation, []
        with self.name_scope:
            for i, width in enumerate(tuple(widths) + (1,)):
                hidden = i < len(widths)
                self.layers.append({
                    "kernel": tf.Variable(glorot_uniform(input_width, width, seed, key + i),
                                          name=f"kernel_{i}"),
                    "bias": tf.Variable(tf.zeros([width]), name=f"bias_{i}"),
                    **({"alpha": tf.Variable(tf.fill([width], PRELU_INITIAL_SLOPE),
                                             name=f"alpha_{i}")}
                       if hidden and activation == "prelu" else {})})
                input_width = width

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/{i}/{k}": v for i, layer in enumerate(self.layers)
                for k, v in layer.items()}

    def activate(self, i: int, x):
        """Layer i's activation of its pre-activation x."""
        if self.activation == "sigmoid":
            return tf.sigmoid(x)
        return prelu(x, self.layers[i]["alpha"])

    def __call__(self, x, compute_dtype=tf.float32, dropout=None, start: int = 0):
        """x [N, width] -> logits [N, 1]. dropout: (rate, stateless seed) or None.
        start=1: x is already layer 0's activated output."""
        for i, layer in enumerate(self.layers[start:], start):
            if i == len(self.layers) - 1 and dropout is not None:
                x = tf.nn.experimental.stateless_dropout(x, dropout[0], dropout[1])
            x = tf.nn.bias_add(tf.matmul(x, tf.cast(layer["kernel"], compute_dtype)),
                               tf.cast(layer["bias"], compute_dtype))
            if i < len(self.layers) - 1:
                x = self.activate(i, x)
        return x


class TargetAdaptedAttention(tf.Module):
    """NVIDIA's DIENAttentionUnit: the target is first adapted to the states' width,
    q' = PReLU(q Wa + ba); score(q', h) = a sigmoid MLP (attention_mlp_dims) on
    [q', h, q' - h, q' * h], then a linear Dense -> [B, S]."""

    def __init__(self, item_width: int, state_width: int, widths, seed: int, key: int,
                 name: str):
        super().__init__(name=name)
        with self.name_scope:
            self.adapt_kernel = tf.Variable(glorot_uniform(item_width, state_width, seed, key),
                                            name="adapt_kernel")
            self.adapt_bias = tf.Variable(tf.zeros([state_width]), name="adapt_bias")
            self.adapt_alpha = tf.Variable(tf.fill([state_width], PRELU_INITIAL_SLOPE),
                                           name="adapt_alpha")
            self.kernel = tf.Variable(glorot_uniform(4 * state_width, widths[0], seed, key + 1),
                                      name="kernel")
            self.bias = tf.Variable(tf.zeros([widths[0]]), name="bias")
            self.rest = ClassifierMLP(widths[0], widths[1:], "sigmoid", seed, key + 2, "rest")

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/adapt_kernel": self.adapt_kernel,
                f"{prefix}/adapt_bias": self.adapt_bias,
                f"{prefix}/adapt_alpha": self.adapt_alpha, f"{prefix}/kernel": self.kernel,
                f"{prefix}/bias": self.bias, **self.rest.named_variables(f"{prefix}/rest")}

    def __call__(self, query, keys, compute_dtype):
        """query [B, Q], keys time-major [S, B, H] (the GRU's states) -> scores [B, S]."""
        adapted = prelu(tf.nn.bias_add(tf.matmul(query, tf.cast(self.adapt_kernel,
                                                                compute_dtype)),
                                       tf.cast(self.adapt_bias, compute_dtype)),
                        self.adapt_alpha)
        hidden = tf.sigmoid(pair_layer(adapted, keys, self.kernel, self.bias, compute_dtype,
                                       time_major=True))
        return tf.transpose(tf.squeeze(apply_mlp(self.rest, hidden, compute_dtype), axis=-1))


def dot_product(query, keys, compute_dtype=None):
    """NVIDIA's default item-item interaction: score(q, k) = q . k -> [B, S]. No variables;
    same call as an AttentionUnit's."""
    return tf.reduce_sum(query[:, None, :] * keys, axis=-1)


def masked_softmax(scores, mask, zero_padding: bool = True):
    """Softmax over the valid steps. Padding scores become the dtype's lowest finite value,
    as NVIDIA's (a fixed -1e9 is -inf in float16), so padding gets 0 wherever a row has a
    behaviour. A row of padding only gets 0 everywhere (zero_padding) or NVIDIA's uniform
    1/S (which its DIEN attention hands to the AUGRU)."""
    weights = tf.nn.softmax(tf.where(mask > 0, scores,
                                     tf.constant(scores.dtype.min, scores.dtype)))
    return weights * mask if zero_padding else weights


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
        projected = matmul_last_axis(inputs, tf.cast(self.kernel, dtype),
                                     tf.cast(self.bias, dtype))
        hz, hr, hc = tf.split(tf.cast(self.recurrent, dtype), 3, axis=1)
        if attention is None:
            attention = tf.ones_like(mask)
        per_step = [time_major(projected), tf.transpose(mask)[:, :, None],
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
        states = tf.scan(step, per_step, initializer=initial)
        return time_major(states)  # back to [B, S, units]


class ResetAfterGRU(tf.Module):
    """Keras's GRU as NVIDIA's interest extractor builds it (reset_after=True, kernel
    glorot-uniform, recurrent kernel orthogonal, input and recurrent biases [2, 3H] at 0),
    gate columns z, r, n:
        z = s(x Wz + bz + h Uz + b'z),  r = s(x Wr + br + h Ur + b'r)
        n = tanh(x Wn + bn + r * (h Un + b'n)),  h' = z h + (1 - z) n
    over every step from h = 0, padding included (no mask: the reference feeds it zero
    vectors there). Time-major, as the AUGRU and DIEN's attention and auxiliary loss that
    read its states: a step's rows lie together, which the cell ops read at memory speed
    (their time at [4096 rows, 10 steps, 288] falls by about a third against a batch-major
    layout). The input projections of all steps are one matmul; the recurrence is
    gru_states (unrolled, gradient by hand)."""

    def __init__(self, input_width: int, units: int, seed: int, key: int, name: str):
        super().__init__(name=name)
        self.units = units
        with self.name_scope:
            self.kernel = tf.Variable(glorot_uniform(input_width, 3 * units, seed, key),
                                      name="kernel")
            self.recurrent = tf.Variable(orthogonal_columns(units, 3, seed, key + 1),
                                         name="recurrent_kernel")
            self.bias = tf.Variable(tf.zeros([2, 3 * units]), name="bias")

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/kernel": self.kernel, f"{prefix}/recurrent_kernel": self.recurrent,
                f"{prefix}/bias": self.bias}

    def __call__(self, inputs, compute_dtype):
        """inputs [S, B, D] -> the state after each step [S, B, units]."""
        bias = tf.cast(self.bias, compute_dtype)
        projected = matmul_last_axis(inputs, tf.cast(self.kernel, compute_dtype), bias[0])
        return gru_states(projected, tf.cast(self.recurrent, compute_dtype), bias[1])


def gru_states(projected, recurrent, recurrent_bias):
    """ResetAfterGRU's recurrence over projected [S, B, 3H] (x W + b of every step) ->
    states [S, B, H], unrolled over the static steps (no while loop), with its gradient
    written by hand: autodiff of the unrolled cell costs about twice the ops per step, and a
    matmul per step for the recurrent kernel's gradient, here one over all steps. In float32
    on a CPU the whole recurrence is one op each way (ops/recurrent_cells.cc)."""
    cells = fused_ops.recurrent_cells(projected.dtype)
    if cells is not None:
        return fused_gru_states(cells, projected, recurrent, recurrent_bias)
    return gru_states_by_tf_ops(projected, recurrent, recurrent_bias)


def recurrent_product(h, kernel, step: int):
    """h @ kernel in a recurrence's step; at step 0 h is the zero start state, and the
    product zeros without a matmul (a tenth of the recurrent matmuls over 10 steps)."""
    if step == 0:
        return tf.zeros([tf.shape(h)[0], kernel.shape[1]], h.dtype)
    return tf.matmul(h, kernel)


def fused_gru_states(cells, projected, recurrent, recurrent_bias):
    """gru_states as one op each way (ops/recurrent_cells.cc: every step of a thread's rows);
    the formulas are those of gru_states_by_tf_ops. The recurrent kernel's gradient is one
    matmul over the steps that have a previous state."""

    @tf.custom_gradient
    def run(projected, recurrent, recurrent_bias):
        states, zr, n, hu_n = cells.gru_sequence(projected, recurrent, recurrent_bias)

        def grad(d_states):
            d_x, d_hu = cells.gru_sequence_grad(d_states, recurrent, states, zr, n, hu_n)
            units = recurrent.shape[0]
            # h_prev of step 0 is 0: no share in the recurrent kernel's gradient
            d_recurrent = tf.matmul(tf.reshape(states[:-1], [-1, units]),
                                    tf.reshape(d_hu[1:], [-1, 3 * units]), transpose_a=True)
            return d_x, d_recurrent, tf.reduce_sum(d_hu, [0, 1])
        return states, grad
    return run(projected, recurrent, recurrent_bias)


def gru_states_by_tf_ops(projected, recurrent, recurrent_bias):
    """gru_states as TensorFlow ops (any dtype, any device). Backward,
    with dh the state's gradient:
        d n_pre = dh (1 - z)(1 - n^2),   d [z, r]_pre = [dh (h_prev - n), d n_pre hu_n] z'
        (z' = s (1 - s)),   d hu = [d [z, r]_pre, r d n_pre],   dh_prev = z dh + d hu U^T."""
    units = recurrent.shape[0]

    @tf.custom_gradient
    def run(projected, recurrent, recurrent_bias):
        x_zr, x_n = (tf.unstack(x) for x in tf.split(projected, [2 * units, units], axis=2))
        h = tf.zeros_like(x_n[0])
        saved = {"h_prev": [], "zr": [], "n": [], "hu_n": []}
        for t in range(len(x_n)):
            hu_zr, hu_n = tf.split(tf.nn.bias_add(recurrent_product(h, recurrent, t),
                                                  recurrent_bias), [2 * units, units], axis=1)
            zr = tf.sigmoid(x_zr[t] + hu_zr)
            z, r = tf.split(zr, 2, axis=1)
            n = tf.tanh(x_n[t] + r * hu_n)
            for name, value in (("h_prev", h), ("zr", zr), ("n", n), ("hu_n", hu_n)):
                saved[name].append(value)
            h = n + z * (h - n)
        h_prev, zr, n, hu_n = (tf.stack(saved[k]) for k in ("h_prev", "zr", "n", "hu_n"))
        states = tf.concat([h_prev[1:], h[None]], 0)  # [S, B, H]

        def grad(d_states):
            z, r = tf.split(zr, 2, axis=2)
            # the per-step factors of all steps at once: big ops outside the loop
            n_pre_factor = tf.unstack((1 - z) * (1 - n * n))
            zr_factor = tf.unstack(tf.concat([h_prev - n, hu_n], 2) * zr * (1 - zr))
            z, r = tf.unstack(z), tf.unstack(r)
            d_out = tf.unstack(d_states)
            recurrent_t = tf.transpose(recurrent)
            dh, d_x, d_hu = tf.zeros_like(d_out[0]), [], []
            for t in reversed(range(len(d_out))):
                dh += d_out[t]
                d_n_pre = dh * n_pre_factor[t]
                d_zr_pre = tf.concat([dh, d_n_pre], 1) * zr_factor[t]
                d_x.append(tf.concat([d_zr_pre, d_n_pre], 1))
                d_hu.append(tf.concat([d_zr_pre, d_n_pre * r[t]], 1))
                if t:  # h_0 = 0 is no variable
                    dh = dh * z[t] + tf.matmul(d_hu[-1], recurrent_t)
            d_hu = tf.stack(d_hu[::-1])
            d_recurrent = tf.matmul(tf.reshape(h_prev, [-1, units]),
                                    tf.reshape(d_hu, [-1, 3 * units]), transpose_a=True)
            return tf.stack(d_x[::-1]), d_recurrent, tf.reduce_sum(d_hu, [0, 1])
        return states, grad
    return run(projected, recurrent, recurrent_bias)


class AUGRU(tf.Module):
    """NVIDIA's interest evolution (VecAttGRUCell in a Keras RNN): with a the attention
    weight of the step,
        [r, u] = s([x, h] Wg + bg)   (bg starts at 1),   c = tanh([x, r * h] Wc + bc)
        u' = (1 - a) u,   h' = u' h + (1 - u') c
    over every step from h = 0; returns the last state. Time-major (see ResetAfterGRU). The
    kernels' rows for x apply to all steps in one matmul outside the loop; the recurrence is
    augru_last_state."""

    def __init__(self, input_width: int, units: int, seed: int, key: int, name: str):
        super().__init__(name=name)
        self.input_width, self.units = input_width, units
        with self.name_scope:
            self.gate_kernel = tf.Variable(glorot_uniform(input_width + units, 2 * units, seed,
                                                          key), name="gate_kernel")
            self.gate_bias = tf.Variable(tf.ones([2 * units]), name="gate_bias")
            self.candidate_kernel = tf.Variable(glorot_uniform(input_width + units, units,
                                                               seed, key + 1),
                                                name="candidate_kernel")
            self.candidate_bias = tf.Variable(tf.zeros([units]), name="candidate_bias")

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/gate_kernel": self.gate_kernel,
                f"{prefix}/gate_bias": self.gate_bias,
                f"{prefix}/candidate_kernel": self.candidate_kernel,
                f"{prefix}/candidate_bias": self.candidate_bias}

    def __call__(self, inputs, attention, compute_dtype):
        """inputs [S, B, D], attention [S, B] -> the last state [B, units]."""
        d = self.input_width
        gate = tf.cast(self.gate_kernel, compute_dtype)
        candidate = tf.cast(self.candidate_kernel, compute_dtype)
        projected = matmul_last_axis(
            inputs, tf.concat([gate[:d], candidate[:d]], 1),
            tf.cast(tf.concat([self.gate_bias, self.candidate_bias], 0), compute_dtype))
        return augru_last_state(projected, 1 - tf.cast(attention, compute_dtype), gate[d:],
                                candidate[d:])


def augru_last_state(projected, keep, gate_kernel, candidate_kernel):
    """AUGRU's recurrence over projected [S, B, 3H] ([x Wg + bg, x Wc + bc] of every step),
    keep = 1 - attention [S, B] -> the last state [B, H]; unrolled, gradient by hand as
    gru_states', one op each way in float32 on a CPU."""
    cells = fused_ops.recurrent_cells(projected.dtype)
    if cells is not None:
        return fused_augru_last_state(cells, projected, keep, gate_kernel, candidate_kernel)
    return augru_last_state_by_tf_ops(projected, keep, gate_kernel, candidate_kernel)


def fused_augru_last_state(cells, projected, keep, gate_kernel, candidate_kernel):
    """augru_last_state as one op each way (ops/recurrent_cells.cc); the kernels' gradients
    are one matmul each over the steps that have a previous state."""

    @tf.custom_gradient
    def run(projected, keep, gate_kernel, candidate_kernel):
        states, g, rh, c = cells.augru_sequence(projected, keep, gate_kernel, candidate_kernel)

        def grad(d_last):
            d_x, d_keep = cells.augru_sequence_grad(projected, d_last, keep, gate_kernel,
                                                    candidate_kernel, states, g, c)
            units = candidate_kernel.shape[0]
            d_g, d_c = tf.split(d_x[1:], [2 * units, units], axis=2)
            # h_prev and r h of step 0 are 0: no share in the kernels' gradients
            d_gate = tf.matmul(tf.reshape(states[:-1], [-1, units]),
                               tf.reshape(d_g, [-1, 2 * units]), transpose_a=True)
            d_candidate = tf.matmul(tf.reshape(rh[1:], [-1, units]),
                                    tf.reshape(d_c, [-1, units]), transpose_a=True)
            return d_x, d_keep, d_gate, d_candidate
        return states[-1], grad
    return run(projected, keep, gate_kernel, candidate_kernel)


def augru_last_state_by_tf_ops(projected, keep, gate_kernel, candidate_kernel):
    """augru_last_state as TensorFlow ops (any dtype, any device). With k u the attended
    update gate and dh the state's gradient:
        d c_pre = dh (1 - k u)(1 - c^2),   d(r h) = d c_pre Wc_h^T,   d(k u) = dh (h_prev - c)
        d [r, u]_pre = [d(r h) h_prev, k d(k u)] g',   d k = sum(u d(k u))
        dh_prev = k u dh + r d(r h) + d [r, u]_pre Wg_h^T."""
    units = candidate_kernel.shape[0]

    @tf.custom_gradient
    def run(projected, keep, gate_kernel, candidate_kernel):
        x_g, x_c = (tf.unstack(x) for x in tf.split(projected, [2 * units, units], axis=2))
        keeps = tf.unstack(keep[:, :, None])
        h = tf.zeros_like(x_c[0])
        saved = {"h_prev": [], "g": [], "rh": [], "c": []}
        for t in range(len(x_c)):
            g = tf.sigmoid(x_g[t] + recurrent_product(h, gate_kernel, t))
            r, u = tf.split(g, 2, axis=1)
            rh = r * h
            c = tf.tanh(x_c[t] + recurrent_product(rh, candidate_kernel, t))
            for name, value in (("h_prev", h), ("g", g), ("rh", rh), ("c", c)):
                saved[name].append(value)
            h = c + keeps[t] * u * (h - c)
        last = h

        def grad(d_last):
            h_prev, g, rh, c = (tf.stack(saved[k]) for k in ("h_prev", "g", "rh", "c"))
            r, u = tf.split(g, 2, axis=2)
            k = keep[:, :, None]
            ku = k * u
            c_pre_factor = tf.unstack((1 - ku) * (1 - c * c))
            diff, gate_factor = tf.unstack(h_prev - c), tf.unstack(g * (1 - g))
            h_prev_t, r, u, ku, k = (tf.unstack(x) for x in (h_prev, r, u, ku, k))
            candidate_t, gate_t = tf.transpose(candidate_kernel), tf.transpose(gate_kernel)
            dh, d_x, d_keep, d_g, d_c = d_last, [], [], [], []
            for t in reversed(range(len(diff))):
                d_c_pre = dh * c_pre_factor[t]
                d_ku = dh * diff[t]
                d_rh = tf.matmul(d_c_pre, candidate_t)
                d_g_pre = tf.concat([d_rh * h_prev_t[t], d_ku * k[t]], 1) * gate_factor[t]
                d_keep.append(tf.reduce_sum(d_ku * u[t], 1))
                d_x.append(tf.concat([d_g_pre, d_c_pre], 1))
                d_g.append(d_g_pre)
                d_c.append(d_c_pre)
                if t:  # h_0 = 0 is no variable
                    dh = dh * ku[t] + d_rh * r[t] + tf.matmul(d_g_pre, gate_t)
            d_gate = tf.matmul(tf.reshape(h_prev, [-1, units]),
                               tf.reshape(tf.stack(d_g[::-1]), [-1, 2 * units]),
                               transpose_a=True)
            d_candidate = tf.matmul(tf.reshape(rh, [-1, units]),
                                    tf.reshape(tf.stack(d_c[::-1]), [-1, units]),
                                    transpose_a=True)
            return tf.stack(d_x[::-1]), tf.stack(d_keep[::-1]), d_gate, d_candidate
        return last, grad
    return run(projected, keep, gate_kernel, candidate_kernel)


def gather_rows(params, indices):
    """tf.gather(params, indices) along axis 0, whose gradient is params' shape, dense: one
    segment sum of the positions' gradients, where autodiff would hand a list of every
    position's row (IndexedSlices) to the ops before it."""

    @tf.custom_gradient
    def gather(params):
        def grad(d_out):
            flat = tf.reshape(d_out, tf.concat([[-1], tf.shape(d_out)[indices.shape.rank:]], 0))
            return fused_ops.segment_sum_rows(flat, tf.reshape(indices, [-1]),
                                              tf.shape(params)[0])
        return tf.gather(params, indices), grad
    return gather(params)


def batch_gather_rows(params, indices):
    """tf.gather(params, indices, batch_dims=1) of params [B, L, ...] and indices [B, k]
    (each row's positions), as one gather_rows of the flattened rows: its gradient is
    SegmentSumRows, where TensorFlow's batch-gather gradient is UnsortedSegmentSum (about
    4x slower on TensorFlow 2.21 than 2.17 at SIM's top-k selection: 1.4 -> 6.7 ms of a
    ~100 ms step, batch 1024, 50 of 90 rows of 32). The same values and gradients."""
    inner = params.shape[2:]
    flat_shape = ([-1, *inner.as_list()] if inner.is_fully_defined() else
                  tf.concat([[-1], tf.shape(params)[2:]], 0))
    length = tf.shape(params, out_type=indices.dtype)[1]
    rows = tf.range(tf.shape(indices, out_type=indices.dtype)[0])[:, None] * length
    return gather_rows(tf.reshape(params, flat_shape), indices + rows)


def steps_between(x, start: int, stop: int = None, axis: int = 1):
    """x[start:stop] along the static steps axis (1: batch-major [B, S, ...], 0: time-major),
    whose gradient is a pad: TensorFlow's gradient of the slice (StridedSliceGrad) costs
    about 4x the pad on CPU (20 ms vs 4 ms for DIEN's [4096, 10, 96] states)."""
    steps = x.shape[axis]
    stop = steps if stop is None else stop % steps

    @tf.custom_gradient
    def cut(x):
        def grad(d):
            padding = [[0, 0]] * len(x.shape)
            padding[axis] = [start, steps - stop]
            return tf.pad(d, padding)
        return x[(slice(None),) * axis + (slice(start, stop),)], grad
    return cut(x)


def time_major(x):
    """[B, S, ...] -> [S, B, ...]: the layout of the reference architecture's recurrences
    (ResetAfterGRU)."""
    return tf.transpose(x, [1, 0] + list(range(2, len(x.shape))))


def matmul_last_axis(x, kernel, bias=None):
    """[..., D] @ [D, K] (+ bias [K]) as one 2-D matmul: the bias added to the 2-D product
    is fused into the matmul (a separate pass over [.., K] otherwise: 8 ms of DIEN's
    prediction at batch 4096)."""
    leading = tf.shape(x)[:-1]
    y = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), kernel)
    if bias is not None:
        y = tf.nn.bias_add(y, bias)
    return tf.reshape(y, tf.concat([leading, [kernel.shape[-1]]], 0))


def auxiliary_loss(aux_mlp: MLP, states, positive_next, negative_next, mask, compute_dtype):
    """DIEN's auxiliary loss per row: the state after behaviour t must tell the real
    behaviour t+1 (positive) from a sampled one (negative), by a logistic loss through an
    auxiliary network on [h_t, e]. Averaged over the row's valid (t, t+1) pairs; 0 for a row
    with fewer than two behaviours. Returns [B] float32."""
    h = steps_between(states, 0, -1)
    pair_mask = tf.cast(mask[:, :-1] * mask[:, 1:], tf.float32)
    pos = tf.squeeze(apply_mlp(aux_mlp, tf.concat([h, steps_between(positive_next, 1)], -1),
                               compute_dtype), -1)
    neg = tf.squeeze(apply_mlp(aux_mlp, tf.concat([h, steps_between(negative_next, 1)], -1),
                               compute_dtype), -1)
    pair_loss = tf.nn.softplus(-tf.cast(pos, tf.float32)) + tf.nn.softplus(
        tf.cast(neg, tf.float32))
    pairs = tf.reduce_sum(pair_mask, axis=1)
    return tf.reduce_sum(pair_loss * pair_mask, axis=1) / tf.maximum(pairs, 1.0)


def reference_auxiliary_loss(aux_mlp: ClassifierMLP, states, positive, negative, mask,
                             compute_dtype, dropout=None):
    """NVIDIA's DIEN auxiliary loss per row (its batch mean is NVIDIA's reduce_mean):
        sum_t m_{t+1} (-log(p+_t) - log(1 - p-_t)) / (S - 1),  t = 1 .. S-1
    with p = s(aux([h_t, e_{t+1}])) + 1e-6 for the positive and the negative behaviour t+1
    and m the mask of step t+1 only. states, positive and negative time-major [S, B, ...]
    (as the GRU's), mask [B, S]. The first layer's share of h_t is computed once for both;
    the positive and the negative behaviours are joined before the first layer (their
    embeddings are a third as wide as its output) and go through the network as one batch.
    Where NVIDIA's 1 - p- is <= 0 (NaN) the log is floored at 1e-6. dropout: as
    ClassifierMLP's. Returns [B] float32."""
    width, pairs = states.shape[-1], states.shape[0] - 1
    first = aux_mlp.layers[0]
    kernel = tf.cast(first["kernel"], compute_dtype)
    from_states = matmul_last_axis(steps_between(states, 0, -1, axis=0), kernel[:width],
                                   tf.cast(first["bias"], compute_dtype))  # [S - 1, B, A]
    behaviours = tf.concat([steps_between(e, 1, axis=0) for e in (positive, negative)], 0)
    from_behaviours = matmul_last_axis(behaviours, kernel[width:])  # [2 (S - 1), B, A]
    hidden = aux_mlp.activate(0, tf.reshape(from_behaviours, [2, pairs, -1, kernel.shape[1]])
                              + from_states[None])
    logits = tf.reshape(tf.cast(aux_mlp(tf.reshape(hidden, [-1, kernel.shape[1]]),
                                        compute_dtype, dropout, start=1), tf.float32),
                        [2, pairs, -1])  # [2, S - 1, B]
    click = -tf.math.log(tf.sigmoid(logits[0]) + AUX_EPS)
    no_click = -tf.math.log(tf.maximum(tf.sigmoid(-logits[1]) - AUX_EPS, AUX_EPS))
    next_mask = tf.transpose(tf.cast(mask[:, 1:], tf.float32))
    return tf.reduce_sum((click + no_click) * next_mask, 0) / pairs


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
