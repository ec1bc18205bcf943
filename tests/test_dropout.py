"""dropout.bias_relu_dropout and hash_dropout against numpy: the hash (re-implemented in
numpy), the kept fraction and independence of the masks (binomial bounds), values and
gradients; a packed batch's dropout (core/hstu.py) takes the whole batch's masks."""
import numpy as np
import pytest
import tensorflow as tf

from core import dropout, hstu
from core.dropout import bias_relu_dropout, hash_dropout, keep_hash

U = np.uint64  # every constant typed, so numpy never promotes to float
M32, GOLDEN, GOLDEN2 = U(0xFFFFFFFF), U(0x9E3779B9), U(0x85EBCA77)


def fmix(h):
    h = h ^ (h >> U(16))
    h = (h * U(0x85EBCA6B)) & M32
    h = h ^ (h >> U(13))
    h = (h * U(0xC2B2AE35)) & M32
    return h ^ (h >> U(16))


def numpy_hash(rows, cols, seed):
    """The formula of dropout.py's docstring over a [rows, cols] matrix."""
    return numpy_hash_at(np.arange(rows)[:, None], np.arange(cols)[None, :], seed)


def numpy_hash_at(row, col, seed):
    """The formula at int indices row, col (broadcast), in uint64 arithmetic masked to 32
    bits."""
    words = np.array(seed, np.int64).view(np.uint32).astype(np.uint64)  # little endian
    k0 = fmix(words[0] ^ fmix((words[1] + GOLDEN) & M32))
    k1 = fmix(words[2] ^ fmix((words[3] + GOLDEN2) & M32) ^ k0)
    row, col = (np.asarray(i).astype(np.uint32).astype(U) for i in (row, col))
    h = fmix(((row * GOLDEN) & M32) ^ k0)
    return fmix(fmix((h + col * GOLDEN2) & M32) ^ k1)


@pytest.mark.parametrize("seed", [(0, 0), (7, 3), (-1, 2**40 + 5)])
def test_hash_matches_numpy(seed):
    got = keep_hash(37, 53, tf.constant(seed, tf.int64)).numpy()
    np.testing.assert_array_equal(got.astype(np.uint64), numpy_hash(37, 53, seed))


def kept(rate, seed, shape=(2048, 512)):
    ones = tf.ones(shape)
    out = bias_relu_dropout(ones, tf.zeros(shape[1]), rate, tf.constant(seed, tf.int64))
    return out.numpy() > 0


def within_binomial(count, n, p, sigmas=5):
    return abs(count - n * p) < sigmas * np.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_kept_fraction_and_independence(rate):
    a, b = kept(rate, [3, 0]), kept(rate, [3, 1])  # two layers of one step
    n, keep = a.size, 1 - rate
    assert within_binomial(a.sum(), n, keep)
    # a pair of masks (other seed; right neighbour; next row) is kept together with
    # probability keep^2 when the draws are independent
    for x, y in ((a, b), (a[:, :-1], a[:, 1:]), (a[:-1], a[1:])):
        assert within_binomial((x & y).sum(), x.size, keep * keep)


def test_same_seed_same_mask_and_other_rank_or_step_another():
    np.testing.assert_array_equal(kept(0.3, [5, 64]), kept(0.3, [5, 64]))
    assert (kept(0.3, [5, 64]) != kept(0.3, [6, 64])).mean() > 0.3
    assert (kept(0.3, [5, 64]) != kept(0.3, [5, 128])).mean() > 0.3


def test_values_and_gradients_match_numpy():
    rng = np.random.default_rng(0)
    product = rng.standard_normal((300, 40)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    upstream = rng.standard_normal((300, 40)).astype(np.float32)
    seed, rate = [11, 22], 0.25
    p, b = tf.constant(product), tf.constant(bias)
    with tf.GradientTape() as tape:
        tape.watch([p, b])
        out = bias_relu_dropout(p, b, rate, tf.constant(seed, tf.int64))
        loss = tf.reduce_sum(out * upstream)
    dp, db = tape.gradient(loss, [p, b])
    keep = numpy_hash(300, 40, seed) >= round(rate * 2**32)
    z = product + bias
    expected = np.where(keep & (z > 0), z / (1 - rate), 0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-6)
    expected_dp = np.where(keep & (z > 0), upstream / (1 - rate), 0)
    np.testing.assert_allclose(dp.numpy(), expected_dp, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(db.numpy(), expected_dp.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_rate_zero_is_relu_and_bad_rate_is_refused():
    product = tf.constant([[-1.0, 2.0], [3.0, -4.0]])
    out = bias_relu_dropout(product, tf.constant([0.5, 0.5]), 0.0, tf.constant([1, 2], tf.int64))
    np.testing.assert_array_equal(out.numpy(), [[0, 2.5], [3.5, 0]])
    with pytest.raises(ValueError, match="1.0"):
        bias_relu_dropout(product, tf.zeros(2), 1.0, tf.constant([1, 2], tf.int64))


def test_bfloat16():
    product = tf.ones([64, 8], tf.bfloat16)
    out = bias_relu_dropout(product, tf.zeros([8], tf.bfloat16), 0.5, tf.constant([1, 2], tf.int64))
    assert out.dtype == tf.bfloat16
    assert set(np.unique(out.numpy().astype(np.float32))) <= {0.0, 2.0}


@pytest.mark.parametrize("kernel", [True, False], ids=["HashDropout op", "TensorFlow ops"])
def test_hash_dropout_values_and_gradient_match_numpy(kernel, monkeypatch):
    """Element e of row r kept where the hash at (rows[r], offsets[r] + e) reaches rate * 2^32,
    divided by 1 - rate; the gradient the upstream's with the same mask. The op and
    TensorFlow's ops give the same floats."""
    if not kernel:
        monkeypatch.setattr(dropout, "cpu_library", lambda name: None)
    elif dropout.cpu_library("hash_dropout") is None:
        pytest.fail("build/hash_dropout.so is not built (make setup builds it)")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(29, 67)).astype(np.float32)
    upstream = rng.normal(size=x.shape).astype(np.float32)
    rows, offsets = rng.integers(-5, 1000, 29), rng.integers(0, 4000, 29)
    seed, rate = (11, -3), 0.3
    keep = numpy_hash_at(rows[:, None], offsets[:, None] + np.arange(67)[None], seed) >= \
        U(round(rate * 2 ** 32))
    kept = np.float32(1 - rate)
    x_tensor = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_tensor)
        y = hash_dropout(x_tensor, tf.constant(rows, tf.int32), tf.constant(offsets, tf.int32),
                         tf.constant(seed, tf.int64), rate)
    np.testing.assert_array_equal(y.numpy(), np.where(keep, x / kept, 0))
    np.testing.assert_array_equal(tape.gradient(y, x_tensor, upstream).numpy(),
                                  np.where(keep, upstream / kept, 0))


def test_a_packed_batch_takes_the_whole_batchs_masks():
    """hstu.dropout of a [b, T, d] batch's real positions alone (packed, their (row, position)
    given) equals the whole batch's dropout at those positions, at every rank's first row."""
    rng = np.random.default_rng(5)
    whole = tf.constant(rng.normal(size=(6, 9, 8)).astype(np.float32))
    real = rng.random((6, 9)) < 0.4
    at = tf.where(real)
    for first_row in (0, 12):
        seed = (tf.constant([3, 21], tf.int64), tf.constant(first_row, tf.int32))
        want = tf.gather_nd(hstu.dropout(whole, 0.25, seed, key=7), at)
        got = hstu.dropout(hstu.packed(whole, at), 0.25, seed, key=7, at=at)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert 0 < np.mean(got.numpy() == 0) < 0.5
