"""DIN/DIEN/SIM building blocks against independent numpy loops."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from core.layers import MLP  # noqa: E402
from sim import blocks  # noqa: E402

F32 = tf.float32


def np_mlp(mlp, x):
    for i, (kernel, bias) in enumerate(mlp.layers):
        x = x @ kernel.numpy() + bias.numpy()
        if i < len(mlp.layers) - 1:
            x = np.maximum(x, 0)
    return x


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_scores(unit, q, keys):
    """The activation unit as written in DIN: an MLP on the concatenation [q, k, q-k, q*k]."""
    def score(query, key):
        x = np.concatenate([query, key, query - key, query * key])
        hidden = np.maximum(x @ unit.kernel.numpy() + unit.bias.numpy(), 0)
        return np_mlp(unit.rest, hidden[None])[0, 0]
    return np.array([[score(q[b], k) for k in keys[b]] for b in range(len(keys))])


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    B, S, W = 3, 6, 4
    q = rng.standard_normal((B, W)).astype(np.float32)
    keys = rng.standard_normal((B, S, W)).astype(np.float32)
    mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0], [0] * 6], np.float32)
    return q, keys, mask


@pytest.mark.parametrize("normalize", [False, True])
def test_attention_pool_matches_numpy_and_ignores_padding(data, normalize):
    q, keys, mask = data
    unit = blocks.AttentionUnit(4, (8, 6), seed=1, key=0, name="att")
    unit.bias.assign([0.1 * i - 0.3 for i in range(8)])
    pooled, weights = blocks.attention_pool(unit, q, keys, mask, F32, normalize=normalize)
    scores = np_scores(unit, q, keys)
    expected_w = np.zeros_like(scores)
    for b in range(len(q)):
        valid = mask[b] > 0
        s = scores[b, valid]
        if valid.any():
            expected_w[b, valid] = np.exp(s - s.max()) / np.exp(s - s.max()).sum() \
                if normalize else s
    np.testing.assert_allclose(weights.numpy(), expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled.numpy(), (expected_w[:, :, None] * keys).sum(1),
                               rtol=1e-5, atol=1e-6)
    # Appending padding (arbitrary values, mask 0) changes nothing.
    junk = np.random.default_rng(9).standard_normal((3, 5, 4)).astype(np.float32) * 100
    padded, _ = blocks.attention_pool(unit, q, np.concatenate([keys, junk], 1),
                                      np.concatenate([mask, np.zeros((3, 5), np.float32)], 1),
                                      F32, normalize=normalize)
    np.testing.assert_allclose(padded.numpy(), pooled.numpy(), rtol=1e-6, atol=1e-6)
    assert np.all(pooled.numpy()[2] == 0)  # a row of padding only pools to zero


def np_gru(gru, x, mask, attention=None):
    W, U, b = gru.kernel.numpy(), gru.recurrent.numpy(), gru.bias.numpy()
    H = gru.units
    B, S, _ = x.shape
    h = np.zeros((B, H), np.float64)
    out = np.zeros((B, S, H))
    for t in range(S):
        for r in range(B):
            xp = x[r, t] @ W + b
            z = sigmoid(xp[:H] + h[r] @ U[:, :H])
            g = sigmoid(xp[H:2 * H] + h[r] @ U[:, H:2 * H])
            c = np.tanh(xp[2 * H:] + (g * h[r]) @ U[:, 2 * H:])
            u = z * (1.0 if attention is None else attention[r, t])
            if mask[r, t]:
                h[r] = (1 - u) * h[r] + u * c
            out[r, t] = h[r]
    return out


@pytest.mark.parametrize("augru", [False, True])
def test_gru_and_augru_match_numpy(data, augru):
    _, x, mask = data
    mask = np.array([[1] * 6, [0, 0, 1, 1, 1, 1], [0] * 6], np.float32)
    gru = blocks.GRU(4, 5, seed=2, key=0, name="gru")
    gru.bias.assign(np.random.default_rng(1).standard_normal(15).astype(np.float32))
    att = np.random.default_rng(4).random((3, 6)).astype(np.float32) if augru else None
    got = gru(tf.constant(x), tf.constant(mask), F32,
              None if att is None else tf.constant(att)).numpy()
    np.testing.assert_allclose(got, np_gru(gru, x, mask, att), rtol=1e-5, atol=1e-6)
    if augru:  # attention 0 freezes the state: AUGRU differs from the GRU
        plain = gru(tf.constant(x), tf.constant(mask), F32).numpy()
        assert np.abs(plain - got).max() > 1e-3


def test_auxiliary_loss_matches_numpy():
    rng = np.random.default_rng(5)
    B, S, H, W = 3, 5, 4, 3
    states = rng.standard_normal((B, S, H)).astype(np.float32)
    pos = rng.standard_normal((B, S, W)).astype(np.float32)
    neg = rng.standard_normal((B, S, W)).astype(np.float32)
    mask = np.array([[1] * 5, [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], np.float32)
    mlp = MLP(H + W, (6, 1), False, seed=3, key=0, name="aux")
    got = blocks.auxiliary_loss(mlp, states, pos, neg, mask, F32).numpy()
    expected = []
    for b in range(B):
        terms = []
        for t in range(S - 1):
            if mask[b, t] and mask[b, t + 1]:
                lp = np_mlp(mlp, np.concatenate([states[b, t], pos[b, t + 1]])[None])[0, 0]
                ln = np_mlp(mlp, np.concatenate([states[b, t], neg[b, t + 1]])[None])[0, 0]
                terms.append(-np.log(sigmoid(lp)) - np.log(1 - sigmoid(ln)))
        expected.append(np.mean(terms) if terms else 0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got[2] == 0  # one behaviour: no pair


def np_masked_softmax(scores, mask):
    """NVIDIA's masking: softmax over the valid steps only (padding weight 0)."""
    weights = np.zeros_like(scores)
    for b in range(len(scores)):
        valid = mask[b] > 0
        if valid.any():
            e = np.exp(scores[b, valid] - scores[b, valid].max())
            weights[b, valid] = e / e.sum()
    return weights


def test_dot_attention_pool_is_a_masked_softmax_of_dot_products(data):
    q, keys, mask = data
    pooled, weights = blocks.attention_pool(blocks.dot_product, q, keys, mask, F32,
                                            normalize=True)
    dots = np.array([[q[b] @ k for k in keys[b]] for b in range(len(q))])
    expected_w = np_masked_softmax(dots, mask)
    np.testing.assert_allclose(weights.numpy(), expected_w, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(pooled.numpy(), (expected_w[:, :, None] * keys).sum(1),
                               rtol=1e-5, atol=1e-6)
    assert np.all(pooled.numpy()[2] == 0)  # a row of padding only pools to zero
    # float16 (GPU --amp): a row of padding only must not give NaN.
    _, half = blocks.attention_pool(blocks.dot_product, tf.constant(q, tf.float16),
                                    tf.constant(keys, tf.float16), tf.constant(mask, tf.float16),
                                    tf.float16, normalize=True)
    np.testing.assert_allclose(half.numpy().astype(np.float32), expected_w, atol=2e-3)


def test_dot_attention_pool_gradient_matches_numpy_differences(data):
    """The hand-written gradient against central differences of a numpy forward, through
    both outputs (the pooled vector, and the weights as the GSU's top-k would use them)."""
    q, keys, mask = (x.astype(np.float64) for x in data)
    rng = np.random.default_rng(5)
    g, h = rng.standard_normal(q.shape), rng.standard_normal(mask.shape)

    def np_loss(q, keys):
        w = np_masked_softmax(np.einsum("bw,bsw->bs", q, keys), mask)
        return np.sum((w[:, :, None] * keys).sum(1) * g) + np.sum(w * h)

    def numeric(x, f, eps=1e-6):
        out = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            up, down = x.copy(), x.copy()
            up[i] += eps
            down[i] -= eps
            out[i] = (f(up) - f(down)) / (2 * eps)
        return out

    tq, tk = tf.constant(q), tf.constant(keys)
    with tf.GradientTape() as tape:
        tape.watch([tq, tk])
        pooled, weights = blocks.attention_pool(blocks.dot_product, tq, tk, tf.constant(mask),
                                                tf.float64, normalize=True)
        loss = tf.reduce_sum(pooled * g) + tf.reduce_sum(weights * h)
    d_q, d_keys = tape.gradient(loss, [tq, tk])
    np.testing.assert_allclose(d_q.numpy(), numeric(q, lambda x: np_loss(x, keys)),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(d_keys.numpy(), numeric(keys, lambda x: np_loss(q, x)),
                               rtol=1e-6, atol=1e-8)
    assert np.all(d_q.numpy()[2] == 0)  # a row of padding only: no gradient


def np_top_k(weights, k):
    """NVIDIA's GSU selection: the k largest weights (ties: lower position first), kept
    where the weight is > 0."""
    order = np.argsort(-weights, axis=1, kind="stable")[:, :k]
    return order, (np.take_along_axis(weights, order, 1) > 0).astype(np.float32)


def test_top_k_selection_matches_numpy():
    rng = np.random.default_rng(6)
    scores = rng.integers(0, 4, (5, 9)).astype(np.float32)  # many ties
    mask = (rng.random((5, 9)) < 0.6).astype(np.float32)
    mask[0] = 0
    mask[1, :2] = 1
    mask[1, 2:] = 0
    weights = np_masked_softmax(scores, mask).astype(np.float32)
    k = 4
    indices, selected_mask = blocks.top_k_selection(tf.constant(weights), k)
    expected_indices, expected_mask = np_top_k(weights, k)
    valid = expected_mask > 0  # where the weights are 0 any order is the reference's
    np.testing.assert_array_equal(np.where(valid, indices.numpy(), -1),
                                  np.where(valid, expected_indices, -1))
    np.testing.assert_array_equal(selected_mask.numpy(), expected_mask)
    assert selected_mask.numpy()[1].tolist() == [1, 1, 0, 0]  # 2 behaviours < k


def test_masked_mean_plus_one_matches_numpy(data):
    _, keys, mask = data
    got = blocks.masked_mean_plus_one(keys, mask).numpy()
    expected = (keys * mask[:, :, None]).sum(1) / (mask.sum(1) + 1)[:, None]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)  # summation order


def test_sim_search_with_dot_scoring_matches_numpy():
    """SIM's long branch end to end against numpy: GSU = masked softmax of target . behaviour
    pooling the long part; the top-k weights (> 0) select; ESU = masked softmax of dot
    products over the selection, plus its masked mean."""
    from sim.model import SimConfig, SimModel
    rng = np.random.default_rng(8)
    B, L, W, k = 4, 7, 6, 3
    model = SimModel(SimConfig((3,), (5, 5, 5), L + 2, long_seq_length=L, embedding_dim=2,
                               gsu_top_k=k, stage_one_mlp_dims=(4,)))
    target = rng.standard_normal((B, W)).astype(np.float32)
    long = rng.standard_normal((B, L, W)).astype(np.float32)
    mask = np.ones((B, L), np.float32)
    mask[1, :5] = 0  # 2 behaviours < k
    mask[2] = 0
    mask[3, :2] = 0
    e = {"user": tf.zeros((B, 2)), "target": tf.constant(target), "long": tf.constant(long),
         "long_mask": tf.constant(mask)}
    esu, mean, _ = model._search(e, F32)
    gsu = np_masked_softmax(np.einsum("bw,blw->bl", target, long), mask)
    order, sel_mask = np_top_k(gsu, k)
    selected = np.take_along_axis(long, order[:, :, None], 1)
    att = np_masked_softmax(np.einsum("bw,bkw->bk", target, selected), sel_mask)
    np.testing.assert_allclose(esu.numpy(), (att[:, :, None] * selected).sum(1),
                               rtol=1e-5, atol=1e-6)
    expected_mean = (selected * sel_mask[:, :, None]).sum(1) / (sel_mask.sum(1) + 1)[:, None]
    np.testing.assert_allclose(mean.numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    assert not hasattr(model, "gsu_scorer")  # stage_one_mlp_dims: the GSU head's only


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_batch_gather_rows_is_tf_gather_with_batch_dims(dtype):
    """SIM's selection of the top-k rows: the values and the gradient of
    tf.gather(params, indices, batch_dims=1), bit for bit (SegmentSumRows for float32)."""
    rng = np.random.default_rng(9)
    params = tf.cast(tf.constant(rng.standard_normal((5, 9, 3, 2)), F32), dtype)
    indices = tf.math.top_k(tf.constant(rng.random((5, 9)), F32), 4).indices
    upstream = tf.cast(tf.constant(rng.standard_normal((5, 4, 3, 2)), F32), dtype)
    got = []
    for gather in (lambda p: tf.gather(p, indices, batch_dims=1),
                   lambda p: blocks.batch_gather_rows(p, indices)):
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = gather(params)
            loss = tf.reduce_sum(out * upstream)
        got.append((out.numpy(), tf.convert_to_tensor(tape.gradient(loss, params)).numpy()))
    for expected, actual in zip(*got):
        np.testing.assert_array_equal(actual, expected)
