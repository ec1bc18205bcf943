"""Wide & Deep forward pass and the FTRL / RMSProp row updates against numpy."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from core.optimizers import FTRL, RMSProp  # noqa: E402
from wide_and_deep.model import Table, WideDeepConfig, WideDeepModel  # noqa: E402

TABLES = (Table("a", 7, 3), Table("b", 5, 2), Table("m", 6, 4, hotness=3))


def make_batch(rng, n=9):
    ids = rng.integers(0, 6, (n, 3))
    lengths = np.array([0, 1, 2, 3, 3, 2, 1, 0, 3][:n], np.int32)
    return {"a": tf.constant(rng.integers(0, 7, n)), "b": tf.constant(rng.integers(0, 5, n)),
            # padding slots hold real ids on purpose: they must be ignored anyway
            "m": tf.constant(ids), "m__length": tf.constant(lengths),
            "x0": tf.constant(rng.standard_normal(n), tf.float32),
            "x1": tf.constant(rng.standard_normal(n), tf.float32)}


def numpy_logits(model, batch, combiner):
    v = {k: t.numpy() for k, t in {**model.wide_variables(), **model.deep_variables()}.items()}
    m, length = batch["m"].numpy(), batch["m__length"].numpy()
    n = len(length)
    wide = v["wide/a"][batch["a"].numpy(), 0] + v["wide/b"][batch["b"].numpy(), 0] + \
        v["wide/bias"][0]
    numerical = np.stack([batch["x0"].numpy(), batch["x1"].numpy()], 1)
    wide += numerical @ v["wide/numerical"][:, 0]  # the reference's wide part is linear in them
    pooled = np.zeros((n, 4))
    for r in range(n):
        for j in range(length[r]):
            wide[r] += v["wide/m"][m[r, j], 0]
            pooled[r] += v["deep/m"][m[r, j]]
        if combiner == "mean" and length[r]:
            pooled[r] /= length[r]
    x = np.concatenate([numerical,
                        v["deep/a"][batch["a"].numpy()], v["deep/b"][batch["b"].numpy()],
                        pooled], axis=1)
    for i in range(3):
        x = x @ v[f"deep/kernel_{i}"] + v[f"deep/bias_{i}"]
        if i < 2:
            x = np.maximum(x, 0)
    return wide + x[:, 0]


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_forward_matches_numpy(combiner):
    rng = np.random.default_rng(0)
    config = WideDeepConfig(TABLES, ("x0", "x1"), hidden_units=(8, 4), dropout=0.5,
                            combiner=combiner)
    model = WideDeepModel(config, seed=3)
    for var in model.wide_variables().values():  # wide weights start at 0: make them count
        var.assign(rng.standard_normal(var.shape).astype(np.float32))
    batch = make_batch(rng)
    np.testing.assert_allclose(model(batch).numpy(), numpy_logits(model, batch, combiner),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("project_max_rows", [0, 100])
def test_bfloat16_forward_follows_numpy(project_max_rows):
    """--amp's deep part in bfloat16 (8 significant bits): the logits are numpy's within a
    few 2^-8 of their scale, as float32 logits, on the plain and the projected first layer.
    The wide weights keep their initial 0: the logits are the deep part, the bfloat16 one."""
    rng = np.random.default_rng(2)
    config = WideDeepConfig(TABLES, ("x0", "x1"), hidden_units=(64, 32), dropout=0.5,
                            project_max_rows=project_max_rows)
    model = WideDeepModel(config, seed=3)
    batch = make_batch(rng)
    half = model(batch, tf.bfloat16).numpy()
    expected = numpy_logits(model, batch, "sum")
    assert half.dtype == np.float32
    error = np.abs(half - expected).max()
    assert 0 < error < 0.03 * np.abs(expected).max()  # 0: bfloat16 was not used


@pytest.mark.parametrize("project_max_rows", [0, 100])
def test_padding_gets_no_gradient_and_bad_combiner_is_refused(project_max_rows):
    model = WideDeepModel(WideDeepConfig(TABLES, ("x0", "x1"), hidden_units=(4,),
                                         project_max_rows=project_max_rows), seed=0)
    batch = make_batch(np.random.default_rng(1))
    m, length = batch["m"].numpy(), batch["m__length"].numpy()
    padding = np.arange(3)[None, :] >= length[:, None]
    other_padding = dict(batch, m=tf.constant(np.where(padding, (m + 1) % 6, m)))

    def table_gradient(b):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(b))
        grad = tape.gradient(loss, model.deep_tables["m"])
        return grad, tf.convert_to_tensor(grad).numpy()
    grad, dense = table_gradient(batch)
    assert set(grad.indices.numpy().tolist()) == set(m[~padding].tolist())
    np.testing.assert_array_equal(table_gradient(other_padding)[1], dense)
    with pytest.raises(ValueError, match="--combiner must be one of .*found 'max'"):
        WideDeepConfig(TABLES, (), combiner="max")


@pytest.mark.parametrize("combiner,numerical", [("sum", ("x0", "x1")), ("mean", ("x0", "x1")),
                                                ("sum", ())])
def test_projected_tables_give_the_concatenated_layer_and_gradients(combiner, numerical):
    """Tables entering the first layer projected (unique rows x kernel slice, summed per
    row) give the logits and every gradient of the plain concatenation."""
    rng = np.random.default_rng(5)
    batch = make_batch(rng)
    results = []
    for project_max_rows in (0, 100):
        config = WideDeepConfig(TABLES, numerical, hidden_units=(8, 4), combiner=combiner,
                                project_max_rows=project_max_rows)
        model = WideDeepModel(config, seed=3)
        variables = list(model.tables().values()) + list(model.dense_variables().values())
        with tf.GradientTape() as tape:
            logits = model(batch)
            loss = tf.reduce_sum(logits * tf.range(9, dtype=tf.float32))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, variables)]
        results.append((logits.numpy(), grads))
    (plain_logits, plain_grads), (projected_logits, projected_grads) = results
    np.testing.assert_allclose(projected_logits, plain_logits, rtol=1e-5, atol=1e-6)
    for a, b in zip(projected_grads, plain_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def numpy_ftrl(w, acc, lin, g, lr, l1=0.0, l2=0.0):
    new_acc = acc + g * g
    lin = lin + g - (np.sqrt(new_acc) - np.sqrt(acc)) / lr * w
    quad = np.sqrt(new_acc) / lr + 2 * l2
    w = np.where(np.abs(lin) > l1, (np.sign(lin) * l1 - lin) / quad, 0.0)
    return w, new_acc, lin


def sparse_grad(rng, rows, width):
    indices = np.array([4, 1, 4, 7, 1, 4])  # duplicates: their gradients add up
    values = rng.standard_normal((len(indices), width)).astype(np.float32)
    dense = np.zeros((rows, width))
    np.add.at(dense, indices, values)
    return tf.IndexedSlices(tf.constant(values), tf.constant(indices)), dense, \
        np.unique(indices)


@pytest.mark.parametrize("l1", [0.0, 0.05])
def test_ftrl_sparse_rows_match_numpy(l1):
    rng = np.random.default_rng(2)
    var = tf.Variable(tf.zeros([10, 2]))
    opt = FTRL({"t": var}, l1=l1, l2=0.01)
    w, acc, lin = np.zeros((10, 2)), np.full((10, 2), 0.1), np.zeros((10, 2))
    for _ in range(3):
        grad, dense, touched = sparse_grad(rng, 10, 2)
        opt.apply_sparse(var, grad, tf.constant(0.3))
        nw, nacc, nlin = numpy_ftrl(w, acc, lin, dense, 0.3, l1, 0.01)
        w[touched], acc[touched], lin[touched] = nw[touched], nacc[touched], nlin[touched]
    np.testing.assert_allclose(var.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.slots("t")["accumulator"].numpy(), acc, rtol=1e-5)
    untouched = np.setdiff1d(np.arange(10), [1, 4, 7])
    assert not var.numpy()[untouched].any()
    assert np.abs(w).max() > 0.01


def test_rmsprop_sparse_rows_and_dense_match_numpy():
    rng = np.random.default_rng(3)
    init = rng.standard_normal((10, 3)).astype(np.float32)
    var, dense_var = tf.Variable(init), tf.Variable(init[0])
    opt = RMSProp({"t": var, "d": dense_var}, rho=0.5, epsilon=1e-7)
    w, ms = init.astype(np.float64), np.zeros((10, 3))
    dw, dms = init[0].astype(np.float64), np.zeros(3)
    for _ in range(3):
        grad, dense, touched = sparse_grad(rng, 10, 3)
        opt.apply_sparse(var, grad, tf.constant(0.01))
        new_ms = 0.5 * ms + 0.5 * dense ** 2
        w[touched] -= (0.01 * dense / (np.sqrt(new_ms) + 1e-7))[touched]
        ms[touched] = new_ms[touched]
        g = rng.standard_normal(3)
        opt.apply_dense(dense_var, tf.constant(g, tf.float32), tf.constant(0.01))
        dms = 0.5 * dms + 0.5 * g ** 2
        dw -= 0.01 * g / (np.sqrt(dms) + 1e-7)
    np.testing.assert_allclose(var.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense_var.numpy(), dw, rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(10), [1, 4, 7])
    np.testing.assert_array_equal(var.numpy()[untouched], init[untouched])


def test_projected_rows_summed_and_their_gradient_match_numpy():
    """The first layer's sum of projected rows (a row may go to several segments, a segment
    take several rows; segment 4 none) and its own gradient against np.add.at."""
    from wide_and_deep.model import _rows_summed
    rng = np.random.default_rng(7)
    data = rng.standard_normal((6, 5)).astype(np.float32)
    indices = np.array([0, 2, 2, 5, 1, 0, 3], np.int32)
    segments = np.array([0, 0, 1, 1, 2, 3, 5], np.int32)
    upstream = rng.standard_normal((6, 5)).astype(np.float32)
    rows = tf.constant(data)
    with tf.GradientTape() as tape:
        tape.watch(rows)
        out = _rows_summed(rows, tf.constant(indices), tf.constant(segments), 6)
        loss = tf.reduce_sum(out * upstream)
    expected = np.zeros((6, 5), np.float32)
    np.add.at(expected, segments, data[indices])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    grad = np.zeros_like(data)
    np.add.at(grad, indices, upstream[segments])
    np.testing.assert_allclose(tape.gradient(loss, rows).numpy(), grad, rtol=1e-6)
