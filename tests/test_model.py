"""Model math against numpy: dot interaction layout, cross layers, MLP shapes, optimizers,
learning-rate schedule, metrics."""
import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import log_loss as sk_log_loss, roc_auc_score

from core.parallel.placement import make_plan
from interaction import CrossInteraction, dot_interact_tf, dot_output_width
from core.optimizers import LearningRateSchedule
from training.metrics import log_loss, roc_auc
from model import DLRM, ModelConfig
from core.optimizers import Adam, SGD


def numpy_dot_interaction(x, bottom):
    """Independent reference: explicit loops over i > j."""
    batch, rows, dim = x.shape
    pairs = [np.einsum("bc,bc->b", x[:, i], x[:, j]) for i in range(rows) for j in range(i)]
    out = np.concatenate([bottom, np.stack(pairs, axis=1)], axis=1) if pairs else bottom
    width = -(-(dim + len(pairs)) // 8) * 8
    return np.pad(out, [(0, 0), (0, width - out.shape[1])])


@pytest.mark.parametrize("batch,rows,dim", [(4, 27, 128), (3, 2, 3), (5, 9, 16), (2, 33, 7),
                                            (1, 1, 8)])
def test_dot_interaction_matches_numpy(batch, rows, dim):
    rng = np.random.default_rng(rows * 100 + dim)
    x = rng.standard_normal((batch, rows, dim)).astype(np.float32)
    out = dot_interact_tf(tf.constant(x), tf.constant(x[:, 0])).numpy()
    ref = numpy_dot_interaction(x.astype(np.float64), x[:, 0].astype(np.float64))
    assert out.shape == (batch, dot_output_width(rows, dim)) == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("batch,rows,dim", [(3, 27, 16), (2, 2, 3), (2, 1, 8)])
def test_dot_interaction_gradient_matches_numpy(batch, rows, dim):
    """The hand-written gradient of the pairs (interaction.pair_products) against the
    derivative written out in numpy: d<x_i, x_j>/dx_i = x_j."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((batch, rows, dim)).astype(np.float32)
    bottom = rng.standard_normal((batch, dim)).astype(np.float32)
    width = dot_output_width(rows, dim)
    w = rng.standard_normal((batch, width)).astype(np.float32)
    x_t, bottom_t = tf.constant(x), tf.constant(bottom)
    with tf.GradientTape() as tape:
        tape.watch([x_t, bottom_t])
        loss = tf.reduce_sum(dot_interact_tf(x_t, bottom_t) * w)
    got_x, got_bottom = tape.gradient(loss, [x_t, bottom_t])
    ref = np.zeros((batch, rows, dim))
    k = dim
    for i in range(rows):
        for j in range(i):
            ref[:, i] += w[:, k, None] * x[:, j]
            ref[:, j] += w[:, k, None] * x[:, i]
            k += 1
    np.testing.assert_allclose(got_x.numpy(), ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got_bottom.numpy(), w[:, :dim])


def test_dot_interaction_width_for_criteo():
    assert dot_output_width(27, 128) == 480  # 128 + 351 = 479, padded to 480


def test_cross_layers_match_numpy():
    rng = np.random.default_rng(3)
    bottom = rng.standard_normal((6, 4)).astype(np.float32)
    emb = rng.standard_normal((6, 3, 4)).astype(np.float32)
    cross = CrossInteraction(16, num_layers=2, projection_dim=5, seed=1)
    out = cross(tf.constant(bottom), tf.unstack(tf.constant(emb), axis=1)).numpy()
    x0 = np.concatenate([bottom, emb.reshape(6, 12)], axis=1).astype(np.float64)
    x = x0
    for u, v, b in cross.layers:
        x = x0 * ((x @ u.numpy()) @ v.numpy() + b.numpy()) + x
    np.testing.assert_allclose(out, x, rtol=1e-4, atol=1e-4)


def small_model(interaction="dot", seed=0, cardinalities=(50, 70, 9)):
    config = ModelConfig(num_numerical=3, cardinalities=cardinalities, embedding_dim=4,
                         bottom_mlp_dims=(8, 4), top_mlp_dims=(6, 1), interaction=interaction,
                         num_cross_layers=2, cross_layer_projection_dim=3, seed=seed)
    return DLRM(config, make_plan(cardinalities, 4))


def numpy_forward(model, numerical, categorical):
    """The whole DLRM forward pass in numpy from the model's weights."""
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    x = np.pad(numerical, [(0, 0), (0, model.padded_numerical - numerical.shape[1])])
    for kernel, bias in model.bottom_mlp.layers:
        x = relu(x @ kernel.numpy() + bias.numpy())
    tables = [v.numpy() for v in model.embeddings.piece_variables]
    emb = np.stack([t[c] for t, c in zip(tables, categorical)], axis=1)
    y = numpy_dot_interaction(np.concatenate([x[:, None], emb], axis=1), x)
    for i, (kernel, bias) in enumerate(model.top_mlp.layers):
        y = y @ kernel.numpy() + bias.numpy()
        if i < len(model.top_mlp.layers) - 1:
            y = relu(y)
    return y[:, 0]


def test_dlrm_forward_matches_numpy():
    model = small_model()
    rng = np.random.default_rng(0)
    numerical = rng.standard_normal((10, 3)).astype(np.float32)
    categorical = [rng.integers(0, c, 10).astype(np.int32) for c in (50, 70, 9)]
    logits = model(tf.constant(numerical), [tf.constant(c) for c in categorical], 10)
    np.testing.assert_allclose(logits.numpy(), numpy_forward(model, numerical, categorical),
                               rtol=1e-4, atol=1e-5)


def test_initialisation_statistics():
    config = ModelConfig(num_numerical=13, cardinalities=(4000,), embedding_dim=64,
                         bottom_mlp_dims=(512, 64), top_mlp_dims=(256, 1), seed=5)
    model = DLRM(config, make_plan(config.cardinalities, 64))
    table = model.embeddings.piece_variables[0].numpy()
    bound = np.sqrt(1 / 4000)
    assert table.min() >= -bound and table.max() <= bound
    assert abs(table.std() - bound / np.sqrt(3)) < 0.02 * bound  # uniform's std
    kernel, bias = model.bottom_mlp.layers[0]
    assert abs(kernel.numpy().std() - np.sqrt(2 / (16 + 512))) < 0.05 * np.sqrt(2 / 528)
    assert abs(bias.numpy().std() - np.sqrt(1 / 512)) < 0.15 * np.sqrt(1 / 512)


def test_config_errors_name_the_flag():
    with pytest.raises(ValueError, match="bottom_mlp_dims.*embedding_dim"):
        ModelConfig(3, (5,), embedding_dim=8, bottom_mlp_dims=(16, 4)).validate()
    with pytest.raises(ValueError, match="top_mlp_dims must end with 1"):
        ModelConfig(3, (5,), embedding_dim=4, bottom_mlp_dims=(4,), top_mlp_dims=(8, 2)).validate()


def test_schedule_values():
    s = LearningRateSchedule(10.0, warmup_steps=4, decay_start_step=10, decay_steps=5)
    expected = {0: 0.0, 1: 2.5, 3: 7.5, 4: 10.0, 9: 10.0, 10: 10.0, 11: 10 * (4 / 5) ** 2,
                13: 10 * (2 / 5) ** 2, 14: 10 * (1 / 5) ** 2, 15: 0.0, 100: 0.0}
    for step, lr in expected.items():
        assert s(step) == pytest.approx(lr), step
    assert LearningRateSchedule(1.0, 0, 0, 0)(12345) == 1.0
    with pytest.raises(ValueError, match="decay_start_step"):
        LearningRateSchedule(1.0, warmup_steps=10, decay_start_step=5, decay_steps=3)


def test_sgd_sparse_update_sums_duplicates():
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    grad = tf.IndexedSlices(tf.ones([3, 3]), tf.constant([1, 3, 1]))
    SGD().apply_sparse(table, grad, 0.5)
    expected = np.arange(12, dtype=np.float32).reshape(4, 3)
    expected[1] -= 1.0
    expected[3] -= 0.5
    np.testing.assert_allclose(table.numpy(), expected)


def numpy_adam(param, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    m = np.zeros_like(param)
    v = np.zeros_like(param)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        param = param - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
    return param


def test_adam_dense_and_lazy_sparse_match_numpy():
    rng = np.random.default_rng(1)
    dense0 = rng.standard_normal((3, 2)).astype(np.float32)
    table0 = rng.standard_normal((5, 2)).astype(np.float32)
    dense, table = tf.Variable(dense0), tf.Variable(table0)
    adam = Adam({"d": dense, "t": table})
    dense_grads = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(3)]
    # row 4 is never looked up; row 2 only in the first step; row 0 twice in one batch
    indices = [np.array([0, 0, 2]), np.array([0, 1]), np.array([1, 3])]
    values = [rng.standard_normal((len(i), 2)).astype(np.float32) for i in indices]
    for g, i, v in zip(dense_grads, indices, values):
        adam.apply_dense(dense, tf.constant(g), 0.01)
        adam.apply_sparse(table, tf.IndexedSlices(tf.constant(v), tf.constant(i)), 0.01)
        adam.finish_step()
    np.testing.assert_allclose(dense.numpy(), numpy_adam(dense0, dense_grads, 0.01), rtol=1e-5)
    # lazy Adam: each row follows Adam over the steps where it appeared, with the global
    # step count in the bias correction
    expected = table0.copy()
    for row in range(5):
        m = v = np.zeros(2)
        for t, (i, val) in enumerate(zip(indices, values), start=1):
            if row not in i:
                continue
            g = val[i == row].sum(axis=0)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            expected[row] -= 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(table.numpy()[4], table0[4])


def test_auc_and_log_loss_match_sklearn():
    rng = np.random.default_rng(7)
    labels = rng.random(5000) < 0.3
    scores = np.round(rng.random(5000) * 0.5 + labels * 0.2, 2)  # many ties
    assert abs(roc_auc(labels, scores) - roc_auc_score(labels, scores)) < 1e-6
    p = np.clip(scores, 0.01, 0.99)
    assert log_loss(labels, p) == pytest.approx(sk_log_loss(labels, p), abs=1e-9)
    with pytest.raises(ValueError, match="undefined"):
        roc_auc(np.zeros(5), np.arange(5))
