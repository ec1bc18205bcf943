"""The tiled softmax over a catalogue (ops/tiled_softmax.cc through core/fused_ops.py and
retrieval/metrics.py) against numpy in float64: the per-row cross-entropy and both of its
gradients, and the target's rank among every item and among the unseen ones, ties included,
at sizes that are not multiples of a tile (N = 1, 191, 193, 500), one row, width 1."""
import sys

import numpy as np
import pytest
import tensorflow as tf

from core import fused_ops
from retrieval.metrics import full_ranks, target_ranks
from conftest import ROOT, bounded_run, require_or_skip

SHAPES = [(1, 1, 1), (1, 193, 8), (7, 191, 1), (13, 500, 17), (50, 385, 64)]


def require_kernel():
    require_or_skip(fused_ops.is_current("tiled_softmax"), "build/tiled_softmax.so is not "
                    "built from ops/tiled_softmax.cc (python -m core.fused_ops --build)")


def np_loss_and_grads(q, t, labels, upstream):
    """float64: the cross-entropy per row and the gradients of sum(upstream * loss)."""
    q, t = q.astype(np.float64), t.astype(np.float64)
    s = q @ t.T
    top = s.max(1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(s - top).sum(1))
    rows = np.arange(len(q))
    g = np.exp(s - lse[:, None])
    g[rows, labels] -= 1
    g *= upstream[:, None]
    return lse - s[rows, labels], g @ t, g.T @ q


@pytest.fixture(params=["kept", "made again"])
def gradient_source(request, monkeypatch):
    """The gradient reads the forward pass's kept exponentials, or (a catalogue past
    KEPT_LIMIT) makes each tile's logits again."""
    if request.param == "made again":
        monkeypatch.setattr(fused_ops, "KEPT_LIMIT", 0)
    return request.param


@pytest.mark.parametrize("rows,items,width", SHAPES)
@pytest.mark.parametrize("spread", [1.0, 30.0])  # 30: logits in the hundreds (stability)
def test_loss_and_gradients_match_numpy(rows, items, width, spread, gradient_source):
    require_kernel()
    rng = np.random.default_rng(rows * 1000 + items)
    q = (rng.normal(size=(rows, width)) * spread / np.sqrt(width)).astype(np.float32)
    t = rng.normal(size=(items, width)).astype(np.float32)
    labels = rng.integers(0, items, rows)
    upstream = rng.normal(size=rows).astype(np.float32)
    qv, tv = tf.constant(q), tf.constant(t)
    with tf.GradientTape() as tape:
        tape.watch([qv, tv])
        loss = fused_ops.softmax_cross_entropy_rows(qv, tv, tf.constant(labels))
        total = tf.reduce_sum(loss * upstream)
    dq, dt = tape.gradient(total, [qv, tv])
    want_loss, want_dq, want_dt = np_loss_and_grads(q, t, labels, upstream)
    scale = max(1.0, spread)  # float32 logits of size ~spread: errors in proportion
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-4, atol=2e-5 * scale)
    np.testing.assert_allclose(dq.numpy(), want_dq, rtol=1e-4, atol=2e-5 * scale)
    np.testing.assert_allclose(dt.numpy(), want_dt, rtol=1e-4, atol=2e-5 * scale)


@pytest.mark.parametrize("first_row", [1, 3])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "TensorFlow ops"])
def test_rows_before_first_row_take_no_part(first_row, kernel, monkeypatch, gradient_source):
    """A table whose first rows are left out (a padding row): the loss and gradients of the
    rest alone, labels counted from first_row, and a zero gradient for the rows left out."""
    if kernel:
        require_kernel()
    else:
        monkeypatch.setattr(fused_ops, "cpu_library", lambda name: None)
    rng = np.random.default_rng(first_row)
    q = rng.normal(size=(11, 16)).astype(np.float32)
    t = rng.normal(size=(first_row + 400, 16)).astype(np.float32)
    labels = rng.integers(0, 400, 11)
    upstream = rng.normal(size=11).astype(np.float32)
    qv, tv = tf.constant(q), tf.constant(t)
    with tf.GradientTape() as tape:
        tape.watch([qv, tv])
        loss = fused_ops.softmax_cross_entropy_rows(qv, tv, tf.constant(labels), first_row)
        total = tf.reduce_sum(loss * upstream)
    dq, dt = tape.gradient(total, [qv, tv])
    want_loss, want_dq, want_dt = np_loss_and_grads(q, t[first_row:], labels, upstream)
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(dq.numpy(), want_dq, rtol=1e-4, atol=2e-5)
    np.testing.assert_array_equal(tf.convert_to_tensor(dt).numpy()[:first_row], 0)
    np.testing.assert_allclose(tf.convert_to_tensor(dt).numpy()[first_row:], want_dt,
                               rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("limit,kept", [(0, False), (1 << 26, True)])
def test_exponentials_kept_within_the_limit_only(limit, kept):
    """The forward pass keeps [tiles, rows rounded up to 6, 192] exponentials (each at most 1,
    the padding 0) and a shift per tile and row, whose product with exp(shift - lse) is the
    softmax; or nothing past kept_limit. A gradient given other shapes is an error."""
    require_kernel()
    lib = fused_ops.cpu_library("tiled_softmax")
    rng = np.random.default_rng(4)
    q, t = rng.normal(size=(7, 8)).astype(np.float32), rng.normal(size=(400, 8)).astype(
        np.float32)
    labels = tf.constant(rng.integers(0, 400, 7))
    _, lse, exps, shifts = lib.tiled_softmax_loss(q, t, labels, kept_limit=limit)
    assert exps.shape == ((3, 12, 192) if kept else (0,))
    assert shifts.shape == ((3, 12) if kept else (0,))
    if kept:
        e = exps.numpy()
        assert e.max() <= 1 and e.min() >= 0
        np.testing.assert_array_equal(e[2, :7, 400 - 2 * 192:], 0)  # past the table
        # what the gradient reads: exps * exp(shift - lse) is the softmax
        s = q.astype(np.float64) @ t.T.astype(np.float64)
        softmax = np.exp(s - s.max(1, keepdims=True))
        softmax /= softmax.sum(1, keepdims=True)
        got = e[:, :7] * np.exp(shifts.numpy()[:, :7, None] - lse.numpy()[None, :, None])
        np.testing.assert_allclose(got.transpose(1, 0, 2).reshape(7, -1)[:, :400], softmax,
                                   rtol=1e-5, atol=1e-7)
        with pytest.raises(tf.errors.InvalidArgumentError, match="exps and shifts must be"):
            lib.tiled_softmax_loss_grad(q, t, labels, lse, tf.ones([7]), exps[:2], shifts)


def test_loss_equals_tensorflows_sparse_softmax_cross_entropy():
    """The kernel path and TensorFlow's ops (the path without the kernel) agree."""
    require_kernel()
    rng = np.random.default_rng(5)
    q, t = rng.normal(size=(30, 16)).astype(np.float32), rng.normal(size=(700, 16)).astype(
        np.float32)
    labels = rng.integers(0, 700, 30)
    got = fused_ops.softmax_cross_entropy_rows(tf.constant(q), tf.constant(t),
                                               tf.constant(labels))
    want = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=q @ t.T)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_gradient_inside_a_function_of_bfloat16_rounded_inputs():
    """As the trainer's --amp path: inputs rounded to bfloat16, the loss in a tf.function."""
    require_kernel()
    rng = np.random.default_rng(6)
    q, t = rng.normal(size=(9, 8)).astype(np.float32), rng.normal(size=(200, 8)).astype(
        np.float32)
    labels = rng.integers(0, 200, 9)
    table = tf.Variable(t)

    @tf.function
    def grads(q):
        with tf.GradientTape() as tape:
            rounded = [tf.cast(tf.cast(x, tf.bfloat16), tf.float32) for x in (q, table)]
            loss = tf.reduce_sum(fused_ops.softmax_cross_entropy_rows(*rounded, labels))
        return loss, tape.gradient(loss, table)
    loss, dt = grads(tf.constant(q))
    q16, t16 = (tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy() for x in (q, t))
    want_loss, _, want_dt = np_loss_and_grads(q16, t16, labels, np.ones(9, np.float32))
    np.testing.assert_allclose(loss.numpy(), want_loss.sum(), rtol=1e-5)
    # the gradient comes back through the cast to bfloat16: rounded to its 8 bits
    np.testing.assert_allclose(dt.numpy(), want_dt, rtol=2 ** -7, atol=1e-5)


def np_ranks(scores, targets, seen):
    """0-based ranks (items scored at least as high as the target, the target excluded), over
    every item and without the seen ones (the target kept)."""
    rows = np.arange(len(scores))
    bar = scores[rows, targets - 1][:, None]
    plain = (scores >= bar).sum(1) - 1
    hidden = np.zeros(scores.shape, bool)
    for r, ids in enumerate(seen):
        for i in ids[ids > 0]:
            hidden[r, i - 1] = i != targets[r]
    return plain, plain - (hidden & (scores >= bar)).sum(1)


@pytest.mark.parametrize("rows,items,width", SHAPES)
def test_ranks_match_numpy_with_ties(rows, items, width):
    """Items with the target's own vector (or a scaled copy of one) tie with it exactly;
    seen lists repeat ids, hold the target and padding."""
    require_kernel()
    rng = np.random.default_rng(rows + items)
    # small integers: every score is exact in float32, so numpy's are the kernel's
    t = rng.integers(-3, 4, (items, width)).astype(np.float32)
    q = rng.integers(-3, 4, (rows, width)).astype(np.float32)
    targets = rng.integers(1, items + 1, rows)
    twins = rng.integers(0, items, items // 3)
    t[twins] = t[rng.integers(0, items, len(twins))]  # repeated rows: ties
    seen = rng.integers(0, items + 1, (rows, 6))
    seen[:, 0] = targets
    seen[:, 1] = seen[:, 2]
    got = full_ranks(tf.constant(q), tf.constant(t), tf.constant(targets),
                     tf.constant(seen))
    plain, filtered = np_ranks(q.astype(np.float64) @ t.T, targets, seen)
    assert (plain > 0).any() or items == 1
    np.testing.assert_array_equal(got[0].numpy(), plain)
    np.testing.assert_array_equal(got[1].numpy(), filtered)


def test_ranks_of_real_valued_scores_equal_target_ranks():
    """Non-integer scores: the kernel's ranks are target_ranks' over TensorFlow's scores
    but where the two round a near tie apart (at most a few rows of 300)."""
    require_kernel()
    rng = np.random.default_rng(8)
    q, t = rng.normal(size=(300, 32)).astype(np.float32), rng.normal(size=(1000, 32)).astype(
        np.float32)
    targets = rng.integers(1, 1001, 300)
    seen = rng.integers(0, 1001, (300, 10))
    got = full_ranks(tf.constant(q), tf.constant(t), tf.constant(targets), tf.constant(seen))
    scores = tf.constant(q @ t.T)
    want = (target_ranks(scores, tf.constant(targets)),
            target_ranks(scores, tf.constant(targets), tf.constant(seen)))
    for g, w in zip(got, want):
        assert np.mean(np.abs(g.numpy() - w.numpy()) <= 1) == 1.0
        assert np.mean(g.numpy() == w.numpy()) >= 0.98


def test_bad_labels_are_an_error():
    require_kernel()
    lib = fused_ops.cpu_library("tiled_softmax")
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the table's rows"):
        lib.tiled_softmax_loss(tf.zeros([2, 4]), tf.zeros([3, 4]),
                               tf.constant([0, 3], tf.int64))


def test_a_nan_logit_makes_the_loss_nan():
    """As TensorFlow's: a diverged model's loss must not look finite (the engine stops on
    it), whether the NaN is in the query or in another item's row."""
    require_kernel()
    q, t = np.ones((2, 4), np.float32), np.ones((300, 4), np.float32)
    t[250, 1] = np.nan  # not a target: only the log-sum-exp reads it
    got = fused_ops.softmax_cross_entropy_rows(tf.constant(q), tf.constant(t),
                                               tf.constant([0, 3], tf.int64))
    assert np.isnan(got.numpy()).all()


LANES_SCRIPT = """
import sys, numpy as np, tensorflow as tf
from core import fused_ops
from retrieval.metrics import full_ranks
rng = np.random.default_rng(3)
out = {}
for rows, items, width in ((50, 385, 64), (13, 500, 17), (7, 191, 8)):
    q = tf.constant(rng.normal(size=(rows, width)).astype(np.float32))
    t = tf.constant(rng.normal(size=(items, width)).astype(np.float32))
    labels = tf.constant(rng.integers(0, items, rows))
    with tf.GradientTape() as tape:
        tape.watch([q, t])
        loss = fused_ops.softmax_cross_entropy_rows(q, t, labels)
        total = tf.reduce_sum(loss)
    dq, dt = tape.gradient(total, [q, t])
    seen = tf.constant(rng.integers(0, items, (rows, 5)))
    ranks = full_ranks(q, t, labels + 1, seen + 1)
    for name, x in (("loss", loss), ("dq", dq), ("dt", dt), ("ranks", ranks[0]),
                    ("filtered", ranks[1])):
        out[f"{name}_{width}"] = x.numpy()
np.savez(sys.argv[1], **out)
"""


def test_sixteen_and_eight_lanes_give_the_same_bits(tmp_path):
    """On a CPU with AVX-512 the kernel runs 16 lanes; TILED_SOFTMAX_LANES=8 forces the AVX2
    code. Each lane runs the same chain of FMAs either way: the loss, both gradients and the
    ranks are equal bit for bit (on an AVX2-only CPU both runs take the 8-lane code)."""
    require_kernel()
    runs = {}
    for lanes in ("16", "8"):
        path = tmp_path / f"lanes_{lanes}.npz"
        proc = bounded_run([sys.executable, "-c", LANES_SCRIPT, str(path)], timeout=300,
                           env={"PYTHONPATH": ROOT, "TILED_SOFTMAX_LANES": lanes})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[lanes] = dict(np.load(path))
    assert runs["16"].keys() == runs["8"].keys()
    for name, value in runs["16"].items():
        np.testing.assert_array_equal(value, runs["8"][name], err_msg=name)
