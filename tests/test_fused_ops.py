"""The project's CPU kernels for lazy Adam (ops/lazy_adam_rows.cc) and SGD's row update
(ops/sgd_rows.cc) against numpy, beside the TensorFlow-op path they replace: plain and
weight-decayed, eager and in a tf.function, a read taken before the update left as it was, a
bad row refused."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from conftest import require_or_skip  # noqa: E402
from core import fused_ops  # noqa: E402
from core.optimizers import SGD, Adam, AdamW  # noqa: E402

for kernel in ("lazy_adam_rows", "sgd_rows"):
    require_or_skip(fused_ops.is_current(kernel), f"build/{kernel}.so is not built from "
                    f"ops/{kernel}.cc (python -m core.fused_ops --build)")


def numpy_lazy_adam(table, steps, lr, weight_decay, b1=0.9, b2=0.999, eps=1e-8):
    """steps: (rows, grads) per step; a row's moments move only in the steps it appears in."""
    table, m, v = table.astype(np.float64), np.zeros(table.shape), np.zeros(table.shape)
    for t, (rows, grads) in enumerate(steps, start=1):
        summed = {}
        for r, g in zip(rows, grads):
            summed[r] = summed.get(r, 0) + g.astype(np.float64)
        for r, g in summed.items():
            m[r] = b1 * m[r] + (1 - b1) * g
            v[r] = b2 * v[r] + (1 - b2) * g * g
            lr_t = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            table[r] -= lr_t * m[r] / (np.sqrt(v[r]) + eps) + lr * weight_decay * table[r]
    return table


@pytest.mark.parametrize("path", ["fused", "tensorflow ops"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("compiled", [False, True])
def test_lazy_adam_rows_match_numpy(path, weight_decay, compiled, monkeypatch):
    if path == "tensorflow ops":
        monkeypatch.setattr(fused_ops, "lazy_adam_rows", lambda var: None)
    rng = np.random.default_rng(3)
    table0 = rng.standard_normal((50, 6)).astype(np.float32)
    table = tf.Variable(table0)
    assert (fused_ops.lazy_adam_rows(table) is None) == (path == "tensorflow ops")
    opt = AdamW({"t": table}, weight_decay=weight_decay) if weight_decay else Adam({"t": table})
    steps = []
    for _ in range(4):  # duplicates in a batch; rows 40.. never looked up
        rows = rng.integers(0, 40, 30)
        steps.append((rows, rng.standard_normal((30, 6)).astype(np.float32)))

    def update(rows, grads):
        opt.apply_sparse(table, tf.IndexedSlices(grads, rows), tf.constant(0.01))
        opt.finish_step()
    run = tf.function(update) if compiled else update
    for rows, grads in steps:
        run(tf.constant(rows), tf.constant(grads))
    np.testing.assert_allclose(table.numpy(), numpy_lazy_adam(table0, steps, 0.01, weight_decay),
                               rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(table.numpy()[40:], table0[40:])


@pytest.mark.parametrize("path", ["fused", "tensorflow ops"])
@pytest.mark.parametrize("compiled", [False, True])
def test_sgd_rows_match_numpy_bit_for_bit(path, compiled, monkeypatch):
    """Rows listed twice get both steps; float32 as numpy computes it (lr * g rounded, then
    subtracted), so the kernel and the op path give the same bits."""
    if path == "tensorflow ops":
        monkeypatch.setattr(fused_ops, "sgd_rows", lambda var: None)
    rng = np.random.default_rng(5)
    table0 = rng.standard_normal((50, 6)).astype(np.float32)
    table = tf.Variable(table0)
    assert (fused_ops.sgd_rows(table) is None) == (path == "tensorflow ops")
    expected, lr = table0.copy(), np.float32(0.3)
    update = lambda rows, grads: SGD().apply_sparse(table, tf.IndexedSlices(grads, rows),
                                                    tf.constant(lr))  # noqa: E731
    run = tf.function(update) if compiled else update
    for dtype in (np.int32, np.int64):
        rows = rng.integers(0, 40, 30).astype(dtype)  # duplicates; rows 40.. never updated
        grads = rng.standard_normal((30, 6)).astype(np.float32)
        run(tf.constant(rows), tf.constant(grads))
        for r, g in zip(rows, grads):
            expected[r] -= lr * g
    np.testing.assert_array_equal(table.numpy(), expected)


def test_sgd_rows_keep_a_read_before_and_refuse_a_row_outside():
    table = tf.Variable(tf.ones([8, 4]))
    before = table.read_value()  # may share the variable's buffer
    SGD().apply_sparse(table, tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 5])), 0.5)
    np.testing.assert_array_equal(before.numpy(), np.ones([8, 4]))
    assert table.numpy()[1, 0] == 0.5 and table.numpy()[0, 0] == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 9 outside"):
        SGD().apply_sparse(table, tf.IndexedSlices(tf.ones([1, 4]), tf.constant([9])), 0.5)


def test_a_read_before_the_update_keeps_its_values():
    table = tf.Variable(tf.ones([8, 4]))
    opt = Adam({"t": table})
    before = table.read_value()  # may share the variable's buffer
    opt.apply_sparse(table, tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 5])), 0.1,
                     distinct_rows=True)
    np.testing.assert_array_equal(before.numpy(), np.ones([8, 4]))
    assert table.numpy()[1, 0] < 1 and table.numpy()[0, 0] == 1


def test_a_row_outside_the_table_is_refused():
    table = tf.Variable(tf.zeros([4, 2]))
    opt = Adam({"t": table})
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 9 outside"):
        opt.apply_sparse(table, tf.IndexedSlices(tf.ones([1, 2]), tf.constant([9])), 0.1,
                         distinct_rows=True)


def test_a_change_of_compile_flags_makes_the_library_stale(monkeypatch):
    """The build stamp covers the flags as well as the source: a library built with other
    flags (as before -fno-math-errno) is rebuilt by the set-up, not loaded."""
    assert fused_ops.is_current("lazy_adam_rows")
    monkeypatch.setattr(fused_ops, "COMPILE_FLAGS", fused_ops.COMPILE_FLAGS[:-1])
    assert not fused_ops.is_current("lazy_adam_rows")


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_segment_sum_rows_matches_numpy_and_tensorflow(index_dtype):
    """Sums per segment against numpy's add.at (rows with no id stay 0, 3-D rows keep their
    shape), bit for bit equal to UnsortedSegmentSum (same order of additions); the gradient
    is the gather of the upstream rows; an id outside the segments is an error naming it."""
    require_or_skip(fused_ops.is_current("segment_sum_rows"), "build/segment_sum_rows.so is "
                    "not built (python -m core.fused_ops --build)")
    rng = np.random.default_rng(5)
    data = rng.standard_normal((3000, 2, 5)).astype(np.float32)
    ids = rng.integers(0, 700, 3000)
    expected = np.zeros((800, 2, 5), np.float64)
    np.add.at(expected, ids, data.astype(np.float64))
    ids_t, data_t = tf.constant(ids, index_dtype), tf.constant(data)
    with tf.GradientTape() as tape:
        tape.watch(data_t)
        out = fused_ops.segment_sum_rows(data_t, ids_t, 800)
        weights = tf.constant(rng.standard_normal((800, 2, 5)).astype(np.float32))
        total = tf.reduce_sum(out * weights)
    assert out.shape == (800, 2, 5)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out.numpy()[700:], 0)
    np.testing.assert_array_equal(out.numpy(),
                                  tf.math.unsorted_segment_sum(data_t, ids_t, 800).numpy())
    np.testing.assert_allclose(tape.gradient(total, data_t).numpy(), weights.numpy()[ids])
    compiled = tf.function(lambda d, i: fused_ops.segment_sum_rows(d, i, 800))
    np.testing.assert_array_equal(compiled(data_t, ids_t).numpy(), out.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="segment id 800 at 3"):
        fused_ops.segment_sum_rows(data_t[:4], tf.constant([0, 1, 2, 800], index_dtype), 800)


@pytest.mark.parametrize("width", [1, 7, 64])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_gather_segment_sum_rows_is_tensorflow_bit_for_bit(width, index_dtype):
    """GatherSegmentSumRows: with sorted segment ids (segments of 0 to 25 rows, so every
    grouping of SparseSegmentSum's 8-row sums) tf.sparse.segment_sum's bits, in a tf.function
    too; in any order, SegmentSumRows of the gathered rows; both near numpy's add.at; an index
    or segment id out of range and unsorted ids where sorted is asked are errors naming them."""
    require_or_skip(fused_ops.is_current("segment_sum_rows"), "build/segment_sum_rows.so is "
                    "not built (python -m core.fused_ops --build)")
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 26, 60)
    lengths[:4] = [0, 1, 9, 17]
    segments = np.repeat(np.arange(60), lengths)
    indices = rng.integers(0, 300, segments.size)
    data = (rng.standard_normal((300, width)) *
            10.0 ** rng.uniform(-3, 3, (300, 1))).astype(np.float32)
    expected = np.zeros((62, width))
    np.add.at(expected, segments, data.astype(np.float64)[indices])
    data_t, idx_t, seg_t = (tf.constant(data), tf.constant(indices, index_dtype),
                            tf.constant(segments, index_dtype))
    grouped = fused_ops.gather_segment_sum_rows(data_t, idx_t, seg_t, 62, sorted_ids=True)
    np.testing.assert_array_equal(
        grouped.numpy(), tf.sparse.segment_sum(data_t, idx_t, seg_t, num_segments=62).numpy())
    compiled = tf.function(lambda d, i, s: fused_ops.gather_segment_sum_rows(d, i, s, 62, True))
    np.testing.assert_array_equal(compiled(data_t, idx_t, seg_t).numpy(), grouped.numpy())
    order = rng.permutation(segments.size)
    idx_t, seg_t = tf.gather(idx_t, order), tf.gather(seg_t, order)
    ungrouped = fused_ops.gather_segment_sum_rows(data_t, idx_t, seg_t, 62)
    np.testing.assert_array_equal(
        ungrouped.numpy(), fused_ops.segment_sum_rows(tf.gather(data_t, idx_t), seg_t, 62))
    for out in (grouped, ungrouped):
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(out.numpy()[60:], 0)
    two = tf.constant([0, 1], index_dtype)
    with pytest.raises(tf.errors.InvalidArgumentError, match="index 300 at 1"):
        fused_ops.gather_segment_sum_rows(data_t, tf.constant([0, 300], index_dtype), two, 62)
    with pytest.raises(tf.errors.InvalidArgumentError, match="segment id 62 at 1"):
        fused_ops.gather_segment_sum_rows(data_t, two, tf.constant([0, 62], index_dtype), 62)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not sorted at 1"):
        fused_ops.gather_segment_sum_rows(data_t, two, tf.constant([1, 0], index_dtype), 62,
                                          sorted_ids=True)


@pytest.mark.parametrize("rows", [60, 100_000])  # a slot per row / a hash map (> 8 per id)
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_distinct_ids_are_tf_unique(rows, index_dtype):
    """DistinctIds gives tf.unique's outputs exactly (first-appearance order, int32
    positions) on either path, and names an id outside the table's rows."""
    require_or_skip(fused_ops.is_current("distinct_ids"), "build/distinct_ids.so is not built "
                    "(python -m core.fused_ops --build)")
    ids = tf.constant(np.random.default_rng(7).integers(0, min(rows, 50), 500), index_dtype)
    distinct, position = fused_ops.distinct_ids(ids, rows)
    expected = tf.unique(ids)
    assert distinct.dtype == index_dtype and position.dtype == tf.int32
    np.testing.assert_array_equal(distinct.numpy(), expected.y.numpy())
    np.testing.assert_array_equal(position.numpy(), expected.idx.numpy())
    np.testing.assert_array_equal(tf.gather(distinct, position).numpy(), ids.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"id {rows} at 2 outside"):
        fused_ops.distinct_ids(tf.constant([1, 2, rows], index_dtype), rows)


def test_a_sequence_op_names_a_misshapen_input():
    """The recurrence ops read time-major [steps, batch, k * units] tensors: a batch-major
    keep, a kernel of the wrong width or a projection of rank 2 is refused with the input
    and the shape expected."""
    require_or_skip(fused_ops.is_current("recurrent_cells"), "build/recurrent_cells.so is not "
                    "built (tools/setup_env.sh builds it)")
    cells = fused_ops.library("recurrent_cells")
    steps, batch, units = 5, 4, 3
    projected = tf.zeros([steps, batch, 3 * units])
    gate, candidate = tf.zeros([units, 2 * units]), tf.zeros([units, units])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 1 has shape \[4,5\], expected \[5, 4\]"):
        cells.augru_sequence(projected, tf.zeros([batch, steps]), gate, candidate)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 1 has shape \[3,6\], expected \[3, 9\]"):
        cells.gru_sequence(projected, gate, tf.zeros([3 * units]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input 0 must be \[steps, batch"):
        cells.gru_sequence(projected[0], tf.zeros([units, 3 * units]), tf.zeros([3 * units]))
    states, *_ = cells.augru_sequence(projected, tf.ones([steps, batch]), gate, candidate)
    assert states.shape == (steps, batch, units)  # the right shapes pass
