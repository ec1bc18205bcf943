"""The default (reference) architecture computes NVIDIA's SIM / DIN / DIEN for TensorFlow 2
layer by layer: each model's forward pass and loss against a numpy model written here from
the reference's equations (sim/layers/*.py, sim/models/*.py of the reference, read as
documentation), its parameter counts against counts derived by hand from the reference's
layer shapes, its GRU against Keras's own GRU layer."""
import numpy as np
import pytest

from core import runtime
from conftest import require_or_skip

runtime.configure()
import tensorflow as tf  # noqa: E402

from sim.model import SimConfig, SimModel  # noqa: E402

# small shapes: 1 user feature, 2 item features, embedding 2 -> U = 2, I = 4, H = 6 * 2 = 12
B, D, L, K = 5, 9, 5, 3
USERS, ITEMS, CATS = 7, 11, 4
SMALL = dict(long_seq_length=L, embedding_dim=2, stage_one_mlp_dims=(5,),
             stage_two_mlp_dims=(6, 3), aux_mlp_dims=(4, 3), attention_mlp_dims=(5, 4),
             gsu_top_k=K)
LENGTHS = [9, 6, 3, 1, 0]  # behaviours per row (left-padded): long and short parts partly empty


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def prelu(x, alpha):
    return np.where(x > 0, x, alpha * x)


def dense(x, p, name):
    return x @ p[f"{name}/kernel"] + p[f"{name}/bias"]


def classifier(x, p, name, layers, hidden):
    """CTRClassificationMLP: Dense + activation per hidden layer, then a linear Dense."""
    for i in range(layers - 1):
        x = dense(x, p, f"{name}/{i}")
        x = prelu(x, p[f"{name}/{i}/alpha"]) if hidden == "prelu" else sigmoid(x)
    return dense(x, p, f"{name}/{layers - 1}")


def softmax_masked(scores, mask):
    """compute_item_sequence_attention: padding scores -> the float's minimum, then a plain
    softmax (a row without behaviours: uniform)."""
    s = np.where(mask > 0, scores, np.finfo(np.float32).min).astype(np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def keras_gru(x, p):
    """tf.keras.layers.GRU(H, return_sequences=True), reset_after=True: gates z, r, h."""
    kernel, recurrent, bias = (p[f"interest_extractor/{n}"] for n in
                               ("kernel", "recurrent_kernel", "bias"))
    H = recurrent.shape[0]
    h, out = np.zeros((x.shape[0], H)), []
    for t in range(x.shape[1]):
        xw, hu = x[:, t] @ kernel + bias[0], h @ recurrent + bias[1]
        z = sigmoid(xw[:, :H] + hu[:, :H])
        r = sigmoid(xw[:, H:2 * H] + hu[:, H:2 * H])
        hh = np.tanh(xw[:, 2 * H:] + r * hu[:, 2 * H:])
        h = z * h + (1 - z) * hh
        out.append(h)
    return np.stack(out, 1)


def vec_att_gru(x, att, p):
    """keras RNN(VecAttGRUCell(H)) over (x, att), the last state."""
    H = p["interest_evolution/candidate_bias"].shape[0]
    h = np.zeros((x.shape[0], H))
    for t in range(x.shape[1]):
        gate = sigmoid(np.concatenate([x[:, t], h], -1) @ p["interest_evolution/gate_kernel"]
                       + p["interest_evolution/gate_bias"])
        r, u = gate[:, :H], gate[:, H:]
        c = np.tanh(np.concatenate([x[:, t], r * h], -1)
                    @ p["interest_evolution/candidate_kernel"]
                    + p["interest_evolution/candidate_bias"])
        u = (1 - att[:, t:t + 1]) * u
        h = u * h + (1 - u) * c
    return h


def dien_attention(target, states, mask, p):
    """DIENAttentionUnit: q' = PReLU(Dense(q)); sigmoid 80, 40 (here 5, 4) on
    [q', h, q' - h, q' * h]; linear score; then the masked softmax."""
    a = "short_attention"
    q = prelu(target @ p[f"{a}/adapt_kernel"] + p[f"{a}/adapt_bias"], p[f"{a}/adapt_alpha"])
    q = np.repeat(q[:, None], states.shape[1], 1)
    x = np.concatenate([q, states, q - states, q * states], -1)
    x = sigmoid(dense(x, p, a))
    x = sigmoid(dense(x, p, f"{a}/rest/0"))
    return softmax_masked(dense(x, p, f"{a}/rest/1")[..., 0], mask)


def din_block(target, sequence, mask):
    w = softmax_masked(np.einsum("bw,btw->bt", target, sequence), mask)
    return (w[:, :, None] * sequence).sum(1), w


def aux_loss(states, positive, negative, mask, p):
    """compute_auxiliary_probs + dien_auxiliary_loss_fn, per row (the batch mean is the
    reference's reduce_mean over rows x (T - 1))."""
    def probs(e):
        x = np.concatenate([states[:, :-1], e[:, 1:]], -1)
        return sigmoid(classifier(x, p, "aux_mlp", 3, "sigmoid"))[..., 0] + 1e-6
    terms = (-np.log(probs(positive)) - np.log(1 - probs(negative))) * mask[:, 1:]
    return terms.mean(1)


def dien_part(e, p):
    states = keras_gru(e["short"], p)
    att = dien_attention(e["target"], states, e["short_mask"], p)
    aux = aux_loss(states, e["short"], e["short_negative"], e["short_mask"], p)
    return vec_att_gru(states, att, p), aux


def numpy_model(model_type, e, p):
    """-> (logit, stage-one logit or None, aux loss per row or None)."""
    if model_type == "din":
        pooled, _ = din_block(e["target"], e["history"], e["mask"])
        x = np.concatenate([e["target"], pooled, e["user"]], -1)
        return classifier(x, p, "stage_two_mlp", 3, "prelu")[:, 0], None, None
    interest, aux = dien_part(e, p)
    if model_type == "dien":
        x = np.concatenate([e["target"], interest, e["user"]], -1)
        return classifier(x, p, "stage_two_mlp", 3, "prelu")[:, 0], None, aux
    gsu_pooled, w = din_block(e["target"], e["long"], e["long_mask"])
    stage_one = classifier(np.concatenate([e["target"], gsu_pooled, e["user"]], -1), p,
                           "gsu_head", 2, "prelu")[:, 0]
    order = np.argsort(-w, axis=1, kind="stable")[:, :K]  # tf.math.top_k, sorted
    selected = np.take_along_axis(e["long"], order[:, :, None], 1)
    top_mask = (np.take_along_axis(w, order, 1) > 0).astype(np.float64)
    att, _ = din_block(e["target"], selected, top_mask)
    mean = (selected * top_mask[:, :, None]).sum(1) / (top_mask.sum(1, keepdims=True) + 1)
    x = np.concatenate([att, mean, e["target"], interest, e["user"]], -1)
    return classifier(x, p, "stage_two_mlp", 3, "prelu")[:, 0], stage_one, aux


def inputs_and_embeddings(model, rng):
    """Model inputs (ids, left-padded histories of LENGTHS) and the reference's embedded,
    masked tensors from the model's tables."""
    valid = np.arange(D)[None, :] >= D - np.array(LENGTHS)[:, None]

    def history(n):
        return np.where(valid, rng.integers(1, n + 1, (B, D)), 0)

    ids = {"user": [rng.integers(1, USERS + 1, B)],
           "target": [rng.integers(1, ITEMS + 1, B), rng.integers(1, CATS + 1, B)],
           "positive": [history(ITEMS), history(CATS)],
           "negative": [history(ITEMS), history(CATS)]}
    tables = [t.numpy().astype(np.float64) for t in model.item_tables]

    def embed(parts):
        return np.concatenate([t[i] for t, i in zip(tables, parts)], -1)

    mask = valid.astype(np.float64)
    history_e = embed(ids["positive"]) * mask[:, :, None]  # the reference's masking
    e = {"user": model.user_tables[0].numpy().astype(np.float64)[ids["user"][0]],
         "target": embed(ids["target"]), "history": history_e, "mask": mask,
         "long": history_e[:, :L], "long_mask": mask[:, :L], "short": history_e[:, L:],
         "short_mask": mask[:, L:],
         "short_negative": embed(ids["negative"])[:, L:] * mask[:, L:, None]}
    return {k: [tf.constant(v, tf.int64) for v in vs] for k, vs in ids.items()}, e


def randomized(model, rng):
    """Every dense variable drawn at random (biases and slopes too, so that a swapped or
    missing one shows); -> {name: float64 array}."""
    out = {}
    for name, var in model.dense_variables().items():
        var.assign(rng.normal(0, 0.6, var.shape).astype(np.float32))
        out[name] = var.numpy().astype(np.float64)
    return out


@pytest.mark.parametrize("model_type", ["din", "dien", "sim"])
def test_forward_and_loss_match_a_numpy_reference_model(model_type):
    rng = np.random.default_rng({"din": 1, "dien": 2, "sim": 3}[model_type])
    model = SimModel(SimConfig((USERS,), (ITEMS, CATS), D, model_type, seed=4, **SMALL))
    params = randomized(model, rng)
    inputs, e = inputs_and_embeddings(model, rng)
    logit, stage_one, aux = model.forward(model.lookup(inputs))
    want_logit, want_stage_one, want_aux = numpy_model(model_type, e, params)
    np.testing.assert_allclose(logit.numpy(), want_logit, rtol=1e-4, atol=1e-5)
    for got, want in ((stage_one, want_stage_one), (aux, want_aux)):
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    # the training loss: DIN BCE; DIEN BCE + aux; SIM 0.5 (BCE one + BCE two) + aux
    from sim.trainer import SimTask
    label = rng.integers(0, 2, B).astype(np.float64)

    def bce(z):
        return np.maximum(z, 0) - z * label + np.log1p(np.exp(-np.abs(z)))
    want = bce(want_logit) if model_type != "sim" else 0.5 * (bce(want_logit)
                                                             + bce(want_stage_one))
    want = np.mean(want + (0 if want_aux is None else want_aux))
    looked_up = model.lookup(inputs)
    masks = {k: v for k, v in looked_up.items() if "mask" in k}
    embedded = {k: v for k, v in looked_up.items() if "mask" not in k}
    got = SimTask(model, 0).loss((tf.constant(label, tf.float32), tf.constant(B), None),
                                 embedded, masks, tf.float32)
    assert float(got) == pytest.approx(want, rel=1e-4)
    if model_type != "din":  # the row without short behaviours took the uniform weights
        assert e["short_mask"][-1].sum() == 0


def test_initial_values_are_the_reference_layers_defaults():
    """PReLU slopes 0.1 per unit, AUGRU gate bias 1, other biases 0, GRU recurrent kernel
    orthogonal per gate block (Keras's initialisers)."""
    model = SimModel(SimConfig((USERS,), (ITEMS, CATS), D, "sim", seed=1, **SMALL))
    p = {k: v.numpy() for k, v in model.dense_variables().items()}
    assert p["stage_two_mlp/0/alpha"].shape == (6,) and np.all(p["stage_two_mlp/0/alpha"] == 0.1)
    assert np.all(p["short_attention/adapt_alpha"] == np.float32(0.1))
    assert np.all(p["interest_evolution/gate_bias"] == 1)
    assert all(np.all(v == 0) for k, v in p.items()
               if "bias" in k and k != "interest_evolution/gate_bias")
    recurrent = p["interest_extractor/recurrent_kernel"]  # [H, 3H]: orthonormal rows
    assert recurrent.shape == (12, 36)
    np.testing.assert_allclose(recurrent @ recurrent.T, np.eye(12), atol=1e-5)


def test_gru_is_keras_gru():
    """ResetAfterGRU (time-major) against Keras's own GRU layer (reset_after=True, batch-major)
    with the same weights."""
    from sim import blocks
    rng = np.random.default_rng(7)
    gru = blocks.ResetAfterGRU(4, 6, seed=0, key=0, name="g")
    gru.bias.assign(rng.normal(size=(2, 18)).astype(np.float32))
    x = rng.normal(size=(3, 5, 4)).astype(np.float32)
    keras = tf.keras.layers.GRU(6, return_sequences=True)
    keras.build((None, 5, 4))
    keras.set_weights([gru.kernel.numpy(), gru.recurrent.numpy(), gru.bias.numpy()])
    ours = gru(tf.constant(x.transpose(1, 0, 2)), tf.float32).numpy().transpose(1, 0, 2)
    np.testing.assert_allclose(ours, keras(x).numpy(), rtol=1e-5, atol=1e-6)


def reference_parameter_counts(embedding_dim=16, user_features=1, item_features=2,
                               stage_one=(200,), stage_two=(200, 80), aux=(100, 50),
                               attention=(80, 40)) -> dict:
    """Dense parameters of the reference's DINModel / DIENModel / SIMModel, derived by hand
    from its layer shapes (not by building it): U, I = the user's and an item's embedding
    widths, H = 6 * embedding_dim (DIEN_ITEM_SEQ_INTERACTION_SIZE)."""
    U, I, H = user_features * embedding_dim, item_features * embedding_dim, 6 * embedding_dim

    def mlp(d, widths, slopes):  # CTRClassificationMLP: Dense (+ a PReLU slope per unit)...
        n = 0
        for w in widths:
            n += d * w + w + (w if slopes else 0)
            d = w
        return n + d + 1

    gru = I * 3 * H + H * 3 * H + 2 * 3 * H       # kernel, recurrent kernel, bias [2, 3H]
    augru = (2 * H) * (2 * H) + 2 * H + (2 * H) * H + H  # gate Dense, candidate Dense
    attention = I * H + H + H + mlp(4 * H, attention, False)  # Dense + PReLU (1, H), sigmoid MLP
    aux_net = mlp(H + I, aux, False)                 # sigmoid activations: no parameters
    dien_blocks = gru + augru + attention + aux_net
    return {"din": mlp(I + I + U, stage_two, True),
            "dien": dien_blocks + mlp(I + H + U, stage_two, True),
            "sim": dien_blocks + mlp(I + I + U, stage_one, True)
            + mlp(I + I + I + H + U, stage_two, True)}


@pytest.mark.parametrize("stage_one", [(200,), (200, 80)])
def test_parameter_counts_equal_the_references(stage_one):
    """At the reference's default flags (stage one 200) and with --stage_one_mlp_dims 200,80
    (the issue's SIM figure). The literals are the reference's Keras models built by its
    own main.py (issue 29; design notes) and agree with the hand derivation."""
    derived = reference_parameter_counts(stage_one=stage_one)
    built = {"din": 32641, "dien": 193811, "sim": 223212 if stage_one == (200,) else 239252}
    assert derived == built
    for model_type in ("din", "dien", "sim"):
        model = SimModel(SimConfig((4000,), (1000, 20), 100, model_type,
                                   stage_one_mlp_dims=stage_one))
        count = sum(int(np.prod(v.shape)) for v in model.dense_variables().values())
        assert count == built[model_type], model_type


# float64: the TensorFlow-op path; float32: the sequence ops of ops/recurrent_cells.cc, whose
# threads take blocks of 64 rows: a batch of 150 spans several blocks and both cores
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("Bn, S, H", [(3, 4, 5), (150, 3, 7)])
def test_hand_written_recurrence_gradients_match_autodiff(dtype, Bn, S, H):
    """gru_states and augru_last_state (gradients by hand) against TensorFlow's autodiff in
    float64 of the cells written out here, for every input, the attention and the kernels
    (time-major: [steps, batch, ...])."""
    from core import fused_ops
    from sim import blocks
    if dtype == "float32":
        require_or_skip(fused_ops.is_current("recurrent_cells"),
                        "build/recurrent_cells.so is not built (tools/setup_env.sh builds it)")
        assert fused_ops.recurrent_cells(tf.float32) is not None
    assert fused_ops.recurrent_cells(tf.float64) is None
    rng = np.random.default_rng(11)
    f64 = tf.float64
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (2e-5, 2e-6)

    def const(*shape):
        return tf.constant(rng.normal(0, 0.7, shape), f64)

    projected, recurrent, rbias = const(S, Bn, 3 * H), const(H, 3 * H), const(3 * H)
    keep, gate, cand = tf.constant(rng.random((S, Bn)), f64), const(H, 2 * H), const(H, H)
    upstream = const(S, Bn, H)

    def plain_gru(x, u, b):
        h, out = tf.zeros([Bn, H], f64), []
        for t in range(S):
            hu = h @ u + b
            z = tf.sigmoid(x[t, :, :H] + hu[:, :H])
            r = tf.sigmoid(x[t, :, H:2 * H] + hu[:, H:2 * H])
            n = tf.tanh(x[t, :, 2 * H:] + r * hu[:, 2 * H:])
            h = z * h + (1 - z) * n
            out.append(h)
        return tf.stack(out)

    def plain_augru(x, k, wg, wc):
        h = tf.zeros([Bn, H], f64)
        for t in range(S):
            g = tf.sigmoid(x[t, :, :2 * H] + h @ wg)
            r, u = g[:, :H], g[:, H:]
            c = tf.tanh(x[t, :, 2 * H:] + (r * h) @ wc)
            u = k[t][:, None] * u
            h = u * h + (1 - u) * c
        return h

    cases = [(blocks.gru_states, plain_gru, [projected, recurrent, rbias], upstream),
             (blocks.augru_last_state, plain_augru, [projected, keep, gate, cand],
              upstream[0])]
    for ours, plain, args, weights in cases:
        grads = []
        for fn, inputs in ((ours, [tf.cast(a, dtype) for a in args]), (plain, args)):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                out = fn(*inputs)
                loss = tf.reduce_sum(out * tf.cast(weights, out.dtype))
            grads.append((out.numpy(), tape.gradient(loss, inputs)))
        np.testing.assert_allclose(grads[0][0], grads[1][0], rtol=rtol, atol=atol)
        for got, want in zip(grads[0][1], grads[1][1]):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol)
