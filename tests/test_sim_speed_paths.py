"""The speed paths of SIM/DIN/DIEN compute what the plain ones do: the shared-table lookup
(one gather of the distinct ids) gives the per-position gradient summed per row, checked
against numpy; the in-memory cache of step batches gives the batches the reader gives, in
each epoch's order, reading each once; the BYO parquet writer's rows come back through the parquet -> TFRecord tool."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from sim.model import SimConfig, SimModel  # noqa: E402


@pytest.mark.parametrize("model_type", ["din", "dien", "sim"])
def test_shared_lookup_gradient_is_the_per_position_sum(model_type):
    rng = np.random.default_rng(0)
    B, D, L, items, cats = 4, 7, 4, 6, 3
    config = SimConfig((5,), (items, cats), D, model_type, long_seq_length=L, embedding_dim=2)
    model = SimModel(config)

    def ids(n, shape):  # 0 (padding) included: it is a row of the table like any other
        return tf.constant(rng.integers(0, n + 1, shape), tf.int64)

    inputs = {"user": [ids(5, [B])], "target": [ids(items, [B]), ids(cats, [B])],
              "positive": [ids(items, [B, D]), ids(cats, [B, D])],
              "negative": [ids(items, [B, D]), ids(cats, [B, D])]}
    tables = model.item_tables
    with tf.GradientTape() as tape:
        out = model.lookup(inputs)
        embedded = {k: v for k, v in out.items() if "mask" not in k and k != "user"}
        weights = {k: tf.constant(rng.normal(size=v.shape), tf.float32)
                   for k, v in embedded.items()}
        total = tf.add_n([tf.reduce_sum(v * weights[k]) for k, v in embedded.items()])
    grads = tape.gradient(total, tables)
    # numpy: every position adds its weight row to the row of its id
    where = {"target": lambda x: x, "history": lambda x: x,
             "long": lambda x: x[:, :L], "short": lambda x: x[:, L:],
             "short_negative": lambda x: x[:, L:]}
    for t, (table, grad) in enumerate(zip(tables, grads)):
        expected = np.zeros(table.shape, np.float32)
        used = set()
        for name, w in weights.items():
            source = inputs["target" if name == "target" else
                            "negative" if name == "short_negative" else "positive"][t]
            rows = where[name](source.numpy()).reshape(-1)
            np.add.at(expected, rows, w.numpy()[..., 2 * t:2 * t + 2].reshape(-1, 2))
            used.update(rows.tolist())
        assert isinstance(grad, tf.IndexedSlices)
        assert sorted(grad.indices.numpy().tolist()) == sorted(used)  # one row per id
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected, rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("model_type", ["din", "dien", "sim"])
def test_prediction_lookup_gathers_plainly_and_predicts_the_same(model_type):
    """lookup(training=False): each part is the features' table rows side by side (numpy
    indexing), without the negative history; the logit is the training path's."""
    rng = np.random.default_rng(1)
    B, D, L, items, cats = 5, 8, 5, 9, 4
    model = SimModel(SimConfig((6,), (items, cats), D, model_type, long_seq_length=L,
                               embedding_dim=3, seed=2))
    ids = lambda n, shape: tf.constant(rng.integers(0, n + 1, shape), tf.int64)  # noqa: E731
    inputs = {"user": [ids(6, [B])], "target": [ids(items, [B]), ids(cats, [B])],
              "positive": [ids(items, [B, D]), ids(cats, [B, D])],
              "negative": [ids(items, [B, D]), ids(cats, [B, D])]}
    plain, shared = model.lookup(inputs, training=False), model.lookup(inputs)
    assert "short_negative" not in plain and (model_type == "din") != ("short_negative" in shared)
    tables = [t.numpy() for t in model.item_tables]
    history = np.concatenate([t[i.numpy()] for t, i in zip(tables, inputs["positive"])], -1)
    expected = {"target": np.concatenate([t[i.numpy()] for t, i in
                                          zip(tables, inputs["target"])], -1),
                "history": history, "long": history[:, :L], "short": history[:, L:],
                "user": model.user_tables[0].numpy()[inputs["user"][0].numpy()]}
    for name, value in plain.items():
        if "mask" not in name:
            np.testing.assert_array_equal(value.numpy(), expected[name])
    logit, _, aux = model.forward(plain)
    assert aux is None
    np.testing.assert_allclose(logit.numpy(), model.forward(shared)[0].numpy(), rtol=1e-5,
                               atol=1e-6)  # two op orders: logits near 0 need an atol


def test_cached_step_batches_equal_read_batches_and_are_read_once(tmp_path):
    from core.pipelines import DictPipeline, MappedPipeline
    from core.parallel.comm import make_communicator
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    from sim.data import open_mapping
    from sim.synthetic import write
    write(str(tmp_path / "d"), users=60, items=30, categories=4, history_length=95, seed=1)
    spec = load_spec(str(tmp_path / "d"), SIM_CONTRACT)
    comm = make_communicator()
    plain, counted = (open_mapping(spec, "train", 16, comm) for _ in range(2))
    for reader in (plain, counted):  # a new order every epoch: the cache must follow it
        reader._reader.shuffle = True
    label = (spec.label_feature,)
    cached = MappedPipeline(DictPipeline(counted, label), dict, cache=True)
    reads, inner = [], counted._reader.get
    counted._reader.get = lambda i: reads.append(i) or inner(i)
    for epoch in range(3):
        expected = list(DictPipeline(plain, label).epoch(epoch, 1))
        got = list(cached.epoch(epoch, 1 if epoch == 0 else 0))[-len(expected):]
        for a, b in zip(expected, got):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    # epoch 0 started at batch 1, epoch 1 read only the batch it skipped, epoch 2 none
    assert sorted(reads) == list(range(len(plain)))


def test_byo_parquet_rows_come_back_through_the_tfrecord_tool(tmp_path):
    from core.parallel.comm import make_communicator
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    from sim.data import open_mapping
    from sim.preproc.parquet_to_tfrecord import main as to_tfrecord
    from sim.synthetic import generate, write_byo_parquet
    rows = write_byo_parquet(str(tmp_path / "byo"), users=50, items=40, categories=5,
                             history_length=95, seed=2)
    assert rows == 50
    assert to_tfrecord(["--amazon_dataset_path", str(tmp_path / "byo"), "--tfrecord_output_dir",
                        str(tmp_path / "tf"), "--max_seq_len", "95"]) in (0, None)
    spec = load_spec(str(tmp_path / "tf"), SIM_CONTRACT)
    expected = generate(50, 40, 5, 95, "long", 2)
    for mapping in ("train", "test"):
        reader = open_mapping(spec, mapping, 1000, make_communicator())
        got = reader.get(0)
        want = expected[mapping]
        np.testing.assert_array_equal(got["label"].astype(bool), want["label"].astype(bool))
        np.testing.assert_array_equal(got["user_feat_0"], want["user_id"])
        np.testing.assert_array_equal(got["item_feat_1_trgt"], want["cat_id"])
        np.testing.assert_array_equal(got["item_feat_0_pos"], want["hist_item_id"][0])
        np.testing.assert_array_equal(got["item_feat_1_neg"], want["neg_hist_cat_id"][0])


def test_attention_over_long_sequences_uses_per_row_kernels_with_the_same_scores():
    """S >= PER_ROW_MIN_STEPS takes the per-row-kernel path; the scores are DIN's MLP on
    [q, k, q-k, q*k] (numpy, written out) all the same."""
    from sim import blocks
    from test_sim_layers import np_scores
    rng = np.random.default_rng(5)
    B, W = 3, 4
    S = blocks.PER_ROW_MIN_STEPS + 3
    unit = blocks.AttentionUnit(W, (6, 5), seed=1, key=0, name="long_att")
    q = rng.normal(size=(B, W)).astype(np.float32)
    keys = rng.normal(size=(B, S, W)).astype(np.float32)
    got = unit(tf.constant(q), tf.constant(keys), tf.float32).numpy()
    np.testing.assert_allclose(got, np_scores(unit, q, keys), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("table_updates", ["lazy", "dense"])
def test_table_updates_lazy_or_dense(table_updates):
    """lazy: a table row moves only in a step whose batch looks it up; dense (the
    reference's): a row looked up at step 1 and not at step 2 moves at step 2 too (its
    moments), and a row never looked up never moves (zero gradient, zero moments)."""
    from core.parallel.comm import make_communicator
    from sim.trainer import SimTrainer
    model = SimModel(SimConfig((4,), (20, 3), 6, "din", long_seq_length=3, embedding_dim=2,
                               stage_two_mlp_dims=(4,)))
    trainer = SimTrainer(model, make_communicator(), table_updates=table_updates)

    def batch(item):  # every row looks up item `item`, category 1, user 1
        ids = lambda v, shape: tf.constant(np.full(shape, v), tf.int64)  # noqa: E731
        inputs = {"user": [ids(1, [2])], "target": [ids(item, [2]), ids(1, [2])],
                  "positive": [ids(item, [2, 6]), ids(1, [2, 6])],
                  "negative": [ids(item, [2, 6]), ids(1, [2, 6])]}
        return inputs, tf.constant([0.0, 1.0]), tf.constant(2)

    table = model.item_tables[0]
    trainer.train_step(batch(5), 0)
    after_one = table.numpy().copy()
    trainer.train_step(batch(7), 1)
    after_two = table.numpy()
    moved = not np.array_equal(after_two[5], after_one[5])
    assert moved == (table_updates == "dense")
    assert not np.array_equal(after_two[7], after_one[7])  # looked up at step 2
    np.testing.assert_array_equal(after_two[9], after_one[9])  # never looked up
