"""The retrieval encoders against numpy implementations of their equations, the full-ranking
metrics against rankings worked out by hand, and the exported retriever's top-k against a
numpy brute force over the saved item table."""
import itertools
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from retrieval.export import EMBEDDINGS_FILE, export, most_recent
from retrieval.metrics import METRIC_KEYS, ranking_metrics, target_ranks
from retrieval import model as retrieval_model
from retrieval.model import Encoder, RetrievalConfig
from retrieval.trainer import full_softmax, sampled_softmax


def np_layer_norm(x, scale=1.0, offset=0.0):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * scale + offset


def silu(x):
    return x / (1 + np.exp(-x))


def np_encode(model, ids, timestamps=None):
    """The model's forward pass for one history at a time, written from the equations in
    retrieval/model.py's docstring with explicit loops over queries and keys."""
    c, w = model.config, {k: v.numpy() for k, v in model.named.items()}
    out = []
    for row, t in zip(ids, timestamps if timestamps is not None else [None] * len(ids)):
        x = w["item_embeddings"][row] * math.sqrt(c.width) + w["positions"]
        x *= (row > 0)[:, None]
        n = len(row)
        for b in range(c.blocks):
            p = f"block_{b}/"
            if c.model == "hstu":
                uvqk = silu(np_layer_norm(x) @ w[p + "uvqk"] + w[p + "uvqk_bias"])
                u, v, q, k = np.split(uvqk, 4, axis=-1)
                attended, e = np.zeros_like(v), c.width // c.heads
                for i, j, hd in itertools.product(range(n), range(n), range(c.heads)):
                    if j > i or (row[j] == 0 and j != i):
                        continue
                    bias = w[p + "position_bias"][j - i + c.length - 1]
                    if t is not None:
                        gap = max(abs(int(t[i]) - int(t[j])), 1)
                        bias += w[p + "time_bias"][min(int(math.log(gap) / 0.301), 127)]
                    s = slice(hd * e, (hd + 1) * e)
                    attended[i, s] += silu(q[i, s] @ k[j, s] + bias) / c.length * v[j, s]
                x = x + (u * np_layer_norm(attended)) @ w[p + "o"] + w[p + "o_bias"]
            else:
                h = np_layer_norm(x, w[p + "norm_1/scale"], w[p + "norm_1/offset"])
                q, k, v = (h @ w[p + m] for m in "qkv")
                heads, e = c.heads, c.width // c.heads
                attended = np.zeros_like(v)
                for i in range(n):
                    keys = [j for j in range(i + 1) if row[j] > 0 or j == i]
                    for hd in range(heads):
                        s = slice(hd * e, (hd + 1) * e)
                        logits = np.array([q[i, s] @ k[j, s] / math.sqrt(e) for j in keys])
                        weights = np.exp(logits - logits.max())
                        weights /= weights.sum()
                        attended[i, s] = sum(a * v[j, s] for a, j in zip(weights, keys))
                x = x + attended @ w[p + "o"]
                h = np_layer_norm(x, w[p + "norm_2/scale"], w[p + "norm_2/offset"])
                h = np.maximum(h @ w[p + "ffn_in"] + w[p + "ffn_in_bias"], 0)
                x = x + h @ w[p + "ffn_out"] + w[p + "ffn_out_bias"]
            x *= (row > 0)[:, None]
        out.append(np_layer_norm(x, w["final_norm/scale"], w["final_norm/offset"]))
    return np.stack(out)


def randomised(model, seed=3):
    """Every weight random (the zero-initialised biases too, so each term is exercised)."""
    rng = np.random.default_rng(seed)
    for v in model.named.values():
        v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32) + (
            1.0 if "scale" in v.name else 0.0))
    return model


HISTORIES = np.array([[0, 0, 0, 4, 2, 7], [3, 1, 5, 5, 2, 6], [0, 0, 0, 0, 0, 1]], np.int64)


@pytest.mark.parametrize("short", [16, 3], ids=["one group", "short and long rows"])
@pytest.mark.parametrize("kind,heads,timestamps", [("hstu", 1, False), ("hstu", 2, True),
                                                   ("sasrec", 1, False), ("sasrec", 2, False)])
def test_encoder_matches_numpy_equations(kind, heads, timestamps, short, monkeypatch):
    """short: histories of at most that many items attend over their last positions only
    (3: the rows of 1 and 3 items do, the row of 6 over all 6)."""
    monkeypatch.setattr(retrieval_model, "SHORT_ATTENTION", short)
    model = randomised(Encoder(RetrievalConfig(model=kind, items=7, length=6, width=8, blocks=2,
                                               heads=heads, timestamps=timestamps, seed=5)))
    times = np.cumsum(np.random.default_rng(0).integers(0, 10 ** 6, HISTORIES.shape), 1) \
        if timestamps else None
    got = model.encode(tf.constant(HISTORIES),
                       None if times is None else tf.constant(times, tf.int64)).numpy()
    want = np_encode(model, HISTORIES, times)
    real = HISTORIES > 0  # padded positions carry no output anyone reads
    np.testing.assert_allclose(got[real], want[real], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kind", ["hstu", "sasrec"])
def test_short_histories_attending_apart_change_no_training_value(kind, monkeypatch):
    """Training's encoder (dropout on) with the short rows' attention apart equals the one over
    the whole padded layout: values and gradients."""
    monkeypatch.setattr(retrieval_model, "SHORT_ATTENTION", 3)
    model = randomised(Encoder(RetrievalConfig(model=kind, items=7, length=6, width=8,
                                               dropout=0.3, timestamps=kind == "hstu")))
    ids = tf.constant(HISTORIES)
    times = tf.constant(np.cumsum(np.ones(HISTORIES.shape, np.int64) * 1000, 1))
    seed = (tf.constant([4, 9], tf.int64), tf.constant(2, tf.int32))
    got = []
    for short in (True, False):
        with tf.GradientTape() as tape:
            vectors, _ = model.encode_real(ids, times if kind == "hstu" else None, seed,
                                           short_attention=short)
            total = tf.reduce_sum(vectors * tf.range(1.0, 9.0))
        got.append([vectors] + [tf.convert_to_tensor(g) for g in
                                tape.gradient(total, list(model.named.values()))])
    for grouped, whole in zip(*got):
        np.testing.assert_allclose(grouped.numpy(), whole.numpy(), rtol=1e-5, atol=1e-6)


def test_hstu_time_bias_changes_the_output():
    """The time-gap bias is read: other gaps, other vectors (a guard on the test above)."""
    model = randomised(Encoder(RetrievalConfig(model="hstu", items=7, length=6, width=8,
                                               timestamps=True)))
    ids = tf.constant(HISTORIES[1:2])
    near = model.encode(ids, tf.constant([[1, 2, 3, 4, 5, 6]], tf.int64)).numpy()
    far = model.encode(ids, tf.constant([[1, 10, 10 ** 3, 10 ** 5, 10 ** 7, 10 ** 9]],
                                         tf.int64)).numpy()
    assert np.abs(near - far).max() > 1e-3


def test_ranks_count_ties_against_the_target_and_filter_seen():
    scores = tf.constant([[0.1, 0.9, 0.5, 0.5, 0.2],   # target 3 (0.5): 0.9 and 0.5 tie -> 2
                          [0.7, 0.1, 0.2, 0.3, 0.4],   # target 1: the best -> 0
                          [0.3, 0.3, 0.3, 0.3, 0.3]])  # target 5: all tie -> 4
    targets = tf.constant([3, 1, 5], tf.int64)
    assert target_ranks(scores, targets).numpy().tolist() == [2, 0, 4]
    # seen: row 0 saw items 2 and 3 (the target itself stays), row 2 saw 1, 2 and 5
    seen = tf.constant([[0, 2, 3], [0, 0, 0], [1, 2, 5]], tf.int64)
    assert target_ranks(scores, targets, seen).numpy().tolist() == [1, 0, 2]


def test_metrics_from_hand_computed_ranks():
    got = ranking_metrics([0, 2, 4, 9, 60])
    assert list(got) == list(METRIC_KEYS)
    assert got["hr@1"] == pytest.approx(1 / 5)
    assert got["hr@5"] == pytest.approx(3 / 5)
    assert got["hr@10"] == got["hr@20"] == got["hr@50"] == pytest.approx(4 / 5)
    assert got["ndcg@5"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(6)) / 5)
    assert got["ndcg@10"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(6) + 1 / math.log2(11))
                                           / 5)
    assert got["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 5 + 1 / 10 + 1 / 61) / 5)


def test_most_recent_compacts_pads_and_cuts():
    ids = tf.constant([[5, 6, 0, 0], [0, 1, 0, 2], [1, 2, 3, 4]], tf.int64)
    assert most_recent(ids, 3).numpy().tolist() == [[0, 5, 6], [0, 1, 2], [2, 3, 4]]


@pytest.mark.parametrize("kind,normalize", [("sasrec", False), ("hstu", True)])
def test_export_top_k_equals_numpy_brute_force(tmp_path, kind, normalize):
    config = RetrievalConfig(model=kind, items=40, length=5, width=8, normalize=normalize,
                             temperature=0.5 if normalize else 1.0)
    model = randomised(Encoder(config))
    out = str(tmp_path / "saved_model")
    export(model, out, k=7)
    served = tf.saved_model.load(out).signatures["serving_default"]
    histories = np.array([[0, 0, 3, 9, 27, 1, 8], [4, 0, 0, 0, 0, 0, 0], [0] * 6 + [40]])
    got = served(item_ids=tf.constant(histories, tf.int64))
    saved = np.load(os.path.join(out, EMBEDDINGS_FILE))
    np.testing.assert_array_equal(saved["ids"], np.arange(1, 41))
    # numpy: the most recent 5 ids left-padded, the last position's vector against the table
    padded = np.array([[3, 9, 27, 1, 8], [0, 0, 0, 0, 4], [0, 0, 0, 0, 40]])
    queries = np_encode(model, padded)[:, -1]
    if normalize:
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    scores = queries @ saved["embeddings"].T / config.temperature
    want = saved["ids"][np.argsort(-scores, axis=1, kind="stable")[:, :7]]
    np.testing.assert_array_equal(got["top_k_ids"].numpy(), want)
    np.testing.assert_allclose(got["top_k_scores"].numpy(),
                               np.take_along_axis(scores, want - 1, 1), rtol=1e-4, atol=1e-4)


def test_sampled_softmax_in_batch_matches_numpy():
    """In-batch negatives: the batch's distinct next items, an accidental hit (a negative
    equal to the pair's target) dropped, every logit minus log of its item's share of the
    batch's targets."""
    model = randomised(Encoder(RetrievalConfig(model="sasrec", items=9, length=4, width=8)))
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    targets = np.array([3, 5, 3, 9, 5, 3])
    got = sampled_softmax(model, tf.constant(vectors), tf.constant(targets, tf.int64),
                          "in_batch", 0, tf.constant([1, 2], tf.int64), tf.float32).numpy()
    table = model.named["item_embeddings"].numpy()
    want = []
    for v, t in zip(vectors, targets):
        share = {i: np.mean(targets == i) for i in set(targets)}
        positive = v @ table[t] - np.log(share[t])
        negatives = [v @ table[i] - np.log(share[i]) for i in share if i != t]
        logits = np.array([positive] + negatives)
        want.append(np.log(np.exp(logits).sum()) - positive)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_sampled_softmax_uniform_drops_accidental_hits():
    """Uniform draws over a catalogue of 2 items: every draw is either the target (dropped)
    or the other item, so the loss is the two-way softmax of target against the other."""
    model = randomised(Encoder(RetrievalConfig(model="hstu", items=2, length=4, width=8)))
    vectors = np.random.default_rng(2).normal(size=(3, 8)).astype(np.float32)
    targets = np.array([1, 2, 1])
    got = sampled_softmax(model, tf.constant(vectors), tf.constant(targets, tf.int64),
                          "uniform", 64, tf.constant([3, 4], tf.int64), tf.float32).numpy()
    table = model.named["item_embeddings"].numpy()
    want = []
    for v, t in zip(vectors, targets):
        positive, other = v @ table[t], v @ table[3 - t]
        # how many draws hit the other item: each adds one (equal) logit
        want.append((positive, other))
    draws = tf.random.stateless_uniform([64], tf.constant([3, 4], tf.int64) + [0, 0], 1, 3,
                                        tf.int64).numpy()
    for (positive, other), t, g in zip(want, targets, got):
        hits = int(np.sum(draws == 3 - t))
        logits = np.array([positive] + [other] * hits)
        np.testing.assert_allclose(g, np.log(np.exp(logits).sum()) - positive, rtol=1e-4)


def test_sampled_softmax_mixed_matches_numpy():
    """Mixed negatives: the batch's distinct targets, then the uniform draws; each logit minus
    the log of its item's expected count among them (its count among the targets plus
    draws / N), the target's too; every occurrence equal to the target dropped."""
    model = randomised(Encoder(RetrievalConfig(model="sasrec", items=9, length=4, width=8)))
    rng = np.random.default_rng(4)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    targets = np.array([3, 5, 3, 9, 5, 3])
    seed = tf.constant([5, 6], tf.int64)
    got = sampled_softmax(model, tf.constant(vectors), tf.constant(targets, tf.int64),
                          "mixed", 4, seed, tf.float32).numpy()
    draws = tf.random.stateless_uniform([4], seed, 1, 10, tf.int64).numpy()
    table = model.named["item_embeddings"].numpy()
    expected = {i: np.sum(targets == i) + 4 / 9 for i in range(1, 10)}
    negatives = list(dict.fromkeys(targets)) + list(draws)  # distinct targets, first seen
    want = []
    for v, t in zip(vectors, targets):
        positive = v @ table[t] - np.log(expected[t])
        logits = [positive] + [v @ table[i] - np.log(expected[i]) for i in negatives if i != t]
        want.append(np.log(np.exp(logits).sum()) - positive)
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("kind,normalize", [("sasrec", False), ("hstu", True)])
def test_full_softmax_is_the_cross_entropy_of_the_models_scores(kind, normalize):
    """The tiled loss and its gradients against TensorFlow's over model.scores (the
    normalisation and the temperature stay the model's)."""
    model = randomised(Encoder(RetrievalConfig(model=kind, items=300, length=4, width=8,
                                               normalize=normalize,
                                               temperature=0.1 if normalize else 1.0)))
    vectors = tf.constant(np.random.default_rng(4).normal(size=(11, 8)).astype(np.float32))
    targets = tf.constant(np.random.default_rng(5).integers(1, 301, 11))
    table = model.named["item_embeddings"]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(vectors)
        got = full_softmax(model, vectors, targets, tf.float32)
        want = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=targets - 1, logits=model.scores(vectors))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    for a, b in zip(tape.gradient(got, [vectors, table]), tape.gradient(want, [vectors, table])):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                   tf.convert_to_tensor(b).numpy(), rtol=1e-4, atol=1e-5)


def test_evaluate_gives_both_protocols_from_numpy_ranks():
    """evaluate(): the ten figures over every item and the ten without each user's seen
    items (the target kept), each from ranks worked out in numpy over the model's scores."""
    from core.parallel.comm import make_communicator
    from retrieval.batches import RowBatches
    from retrieval.trainer import RetrievalTrainer
    model = randomised(Encoder(RetrievalConfig(model="hstu", items=40, length=5, width=8)))
    trainer = RetrievalTrainer(model, make_communicator(), lambda step: 0.0)
    rng = np.random.default_rng(6)
    rows = rng.integers(1, 41, (70, 6))
    rows[:, :2] = np.where(rng.random((70, 2)) < 0.5, 0, rows[:, :2])  # some padding
    rows[::7, -1] = rows[::7, -2]  # targets seen just before (kept when filtering)
    got = trainer.evaluate(RowBatches({"item_ids": rows}, 16, trainer.comm).epoch())
    history, targets = rows[:, :-1], rows[:, -1]
    scores = (model.scores(model.encode(tf.constant(history))[:, -1])).numpy()
    bar = scores[np.arange(70), targets - 1][:, None]
    plain = (scores >= bar).sum(1) - 1
    seen = np.zeros_like(scores, bool)
    for r, ids in enumerate(history):
        seen[r, ids[(ids > 0) & (ids != targets[r])] - 1] = True
    filtered = (np.where(seen, -np.inf, scores) >= bar).sum(1) - 1
    assert (filtered < plain).any()
    assert got["eval_samples"] == 70
    for key, want in ranking_metrics(plain).items():
        assert got[key] == pytest.approx(want, abs=1.01 / 70), key
    for key, want in ranking_metrics(filtered).items():
        assert got[f"filtered_{key}"] == pytest.approx(want, abs=1.01 / 70), key


@pytest.mark.parametrize("kind", ["sasrec", "hstu"])
def test_encoding_without_the_left_padding_gives_the_same_vectors(kind):
    """Evaluation cuts padding columns no history of the batch uses: each real position
    keeps its position and its vector."""
    model = randomised(Encoder(RetrievalConfig(model=kind, items=7, length=6, width=8,
                                               timestamps=kind == "hstu")))
    ids = np.array([[0, 0, 0, 4, 2, 7], [0, 0, 3, 1, 5, 5], [0, 0, 0, 0, 0, 1]], np.int64)
    times = np.cumsum(np.random.default_rng(1).integers(0, 10 ** 6, ids.shape), 1) \
        if kind == "hstu" else None
    whole = model.encode(tf.constant(ids), None if times is None else tf.constant(times))
    cut = model.encode(tf.constant(ids[:, 2:]),
                       None if times is None else tf.constant(times[:, 2:]))
    real = ids[:, 2:] > 0
    np.testing.assert_allclose(cut.numpy()[real], whole.numpy()[:, 2:][real], rtol=1e-5,
                               atol=1e-5)
