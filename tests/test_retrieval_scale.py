"""Retrieval at catalogue scale: the synthetic catalogue with its planted signal (its law
against numpy, its layout as retrieval.prepare_dataset writes it, the signal beating
popularity in a pure-Python reading and in a trained model), and the sampled loss's sparse
row updates against a numpy lazy Adam."""
import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, bash_lines, bounded_run
from retrieval import data as retrieval_data
from retrieval.synthetic import TOPICS_FILE, generate, log_uniform


def synthetic(dst, *flags):
    proc = bounded_run([sys.executable, "-m", "retrieval.synthetic", "--dst", str(dst),
                        *flags], timeout=120)
    return proc


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    dst = tmp_path_factory.mktemp("synthetic") / "small"
    proc = synthetic(dst, "--users", "3000", "--items", "2000", "--topic_size", "40",
                     "--mean_length", "12", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    return str(dst)


def test_log_uniform_draws_follow_their_law():
    n, draws = 20, 400_000
    got = np.bincount(log_uniform(np.random.default_rng(0), np.full(draws, n)), minlength=n)
    k = np.arange(n)
    want = np.log((k + 2) / (k + 1)) / np.log(n + 1)
    np.testing.assert_allclose(got / draws, want, atol=0.003)


def test_the_dataset_is_prepare_datasets_layout_of_the_generated_sequences(small):
    spec = retrieval_data.load(small)
    meta = spec.metadata
    assert retrieval_data.catalogue(spec).items == meta["items"] == 2000
    sequences, topic = generate(3000, 2000, 40, 12, 0.1, 5)
    assert meta["interactions"] == sequences.items.size
    np.testing.assert_array_equal(np.load(os.path.join(small, TOPICS_FILE))["topic"], topic)
    test = retrieval_data.read_sequences(spec, "test")
    # leave-one-out: a test row is the user's whole sequence (its last max_length + 1 items)
    for row, user in zip(test["item_ids"][:50], test["user_id"][:50]):
        start, count = sequences.starts[user - 1], sequences.counts[user - 1]
        whole = sequences.items[start:start + count][-row.size:]
        np.testing.assert_array_equal(row[row.size - whole.size:], whole)
    validation = retrieval_data.read_sequences(spec, "validation")
    np.testing.assert_array_equal(validation["item_ids"][:, -1], test["item_ids"][:, -2])


def test_the_last_items_topic_predicts_the_next_far_above_popularity(small):
    """A pure-Python reading of the rule: the next item shares the last one's topic about
    1 - switch of the time, and that topic's ten most popular training items hit the test
    target several times as often as the catalogue's ten most popular (both hit rates as
    the generator records them)."""
    spec = retrieval_data.load(small)
    topic = np.load(os.path.join(small, TOPICS_FILE))["topic"]
    train = retrieval_data.read_sequences(spec, "train")["item_ids"]
    test = retrieval_data.read_sequences(spec, "test")["item_ids"]
    pairs = train[:, :-1][(train[:, :-1] > 0) & (train[:, 1:] > 0)], \
        train[:, 1:][(train[:, :-1] > 0) & (train[:, 1:] > 0)]
    assert 0.88 <= np.mean(topic[pairs[0]] == topic[pairs[1]]) <= 0.95
    counts = np.bincount(train.ravel(), minlength=topic.size)
    counts[0] = 0
    popular = set(np.argsort(-counts, kind="stable")[:10].tolist())
    by_topic = {}
    for item in np.argsort(-counts, kind="stable"):
        if item > 0 and len(by_topic.setdefault(topic[item], [])) < 10:
            by_topic[topic[item]].append(item)
    last, target = test[:, -2], test[:, -1]
    oracle = np.mean([t in by_topic[topic[lt]] for lt, t in zip(last, target)])
    popularity = np.mean([t in popular for t in target])
    assert oracle > 3 * popularity, (oracle, popularity)
    assert spec.metadata["synthetic"]["test_hr@10"] == pytest.approx(
        {"popularity": popularity, "answer_key": oracle})


@pytest.mark.parametrize("flags,culprit", [
    (["--users", "0", "--items", "10"], "--users"),
    (["--users", "10", "--items", "10", "--switch", "1.5"], "--switch"),
    (["--users", "10", "--items", str(10 ** 12)], "GiB"),
    (["--users", "10"], "--items"),
])
def test_bad_flags_are_one_error_line(tmp_path, flags, culprit):
    proc = synthetic(tmp_path / "out", *flags)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and culprit in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def trained(small, tmp_path_factory):
    """A sampled run on the small catalogue, exported with an index and without one."""
    out = tmp_path_factory.mktemp("run") / "run"
    common = ["--dataset_dir", small, "--output_dir", str(out), "--embedding_dim", "16",
              "--max_sequence_length", "10", "--cpu"]
    proc = bounded_run([sys.executable, "-m", "retrieval.main", *common, "--loss", "sampled",
                        "--num_negatives", "64", "--epochs", "12", "--batch_size", "32",
                        "--lr", "0.01", "--print_freq", "500"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, extra in (("plain", []), ("indexed", ["--index", "faiss"])):
        proc = bounded_run([sys.executable, "-m", "retrieval.main", *common, "--mode", "export",
                            *extra], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        os.replace(out / "saved_model", out / name)
    return out, proc.stdout


def test_a_sampled_run_learns_the_planted_signal(small, trained):
    hr = json.load(open(trained[0] / "results.json"))["test"]["hr@10"]
    spec = retrieval_data.load(small)
    train = retrieval_data.read_sequences(spec, "train")["item_ids"]
    test = retrieval_data.read_sequences(spec, "test")["item_ids"]
    counts = np.bincount(train.ravel(), minlength=2001)
    counts[0] = 0
    popularity = np.isin(test[:, -1], np.argsort(-counts, kind="stable")[:10]).mean()
    assert hr > 2 * popularity, (hr, popularity)


def histories_file(small, path, count=300) -> list:
    """The first test users' histories (their target left out) as `user item ...` lines."""
    test = retrieval_data.read_sequences(retrieval_data.load(small), "test")
    rows = [[int(x) for x in row[:-1] if x] for row in test["item_ids"][:count]]
    path.write_text("".join(f"u{i} {' '.join(map(str, r))}\n" for i, r in enumerate(rows)))
    return rows


def serve(model_dir, src, k, timeout=300):
    return bounded_run([sys.executable, "-m", "retrieval.serve", "--model_dir", str(model_dir),
                        "--src", str(src), "--format", "lines", "--top_k", str(k)],
                       timeout=timeout)


def test_the_index_reaches_its_recall_and_serves_the_brute_forces_neighbours(small, trained,
                                                                           tmp_path):
    """The index's recall@100 (checked at export on validation histories) reaches 0.95 and
    is printed; its top 10 for test histories overlap the SavedModel's exact top 10 (a numpy
    brute force over item_embeddings.npz with the `encode` query) by as much."""
    out, printed = trained
    meta = json.load(open(out / "indexed" / "item_index.json"))
    assert meta["recall"] >= 0.95 and meta["k"] == 100 and f"recall@100 {meta['recall']:.3f}" \
        in printed
    histories = histories_file(small, tmp_path / "histories.txt")
    proc = serve(out / "indexed", tmp_path / "histories.txt", 10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [f"u{i}" for i in range(len(histories))]
    served = np.array([[int(x) for x in line.split()[1:]] for line in lines])
    saved = tf.saved_model.load(str(out / "indexed"))
    padded = np.zeros((len(histories), 10), np.int64)
    for row, h in zip(padded, histories):
        row[10 - len(h[-10:]):] = h[-10:]
    query = saved.signatures["encode"](item_ids=tf.constant(padded))["query"].numpy()
    with np.load(out / "indexed" / "item_embeddings.npz") as a:
        scores = query @ a["embeddings"].T
        exact = a["ids"][np.argsort(-scores, 1, kind="stable")[:, :10]]
    overlap = np.mean([np.intersect1d(s, e).size / 10 for s, e in zip(served, exact)])
    assert served.shape == (len(histories), 10) and overlap >= 0.9, overlap


def test_without_an_index_serve_answers_the_saved_models_exact_top_k(small, trained,
                                                                    tmp_path):
    out, _ = trained
    histories = histories_file(small, tmp_path / "histories.txt", 50)
    proc = serve(out / "plain", tmp_path / "histories.txt", 5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = np.array([[int(x) for x in line.split()[1:]] for line in proc.stdout.splitlines()])
    saved = tf.saved_model.load(str(out / "plain"))
    width = max(len(h) for h in histories)
    padded = np.array([[0] * (width - len(h)) + h for h in histories], np.int64)
    want = saved.signatures["serving_default"](item_ids=tf.constant(padded))["top_k_ids"]
    np.testing.assert_array_equal(served, want.numpy()[:, :5])


@pytest.mark.parametrize("line,culprit", [("u1 3 x 5", "line 2"), (None, "no SavedModel")])
def test_bad_serving_input_is_one_error_line(trained, tmp_path, line, culprit):
    src = tmp_path / "histories.txt"
    src.write_text("u0 1 2\n" + (line or "u1 3") + "\n")
    model_dir = trained[0] / "indexed" if line else tmp_path
    proc = serve(model_dir, src, 3)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and culprit in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout


def lazy_adam(table, m, v, grad, rows, lr, step):
    """numpy LazyAdam: only `rows` move, their moments updated, bias-corrected rate."""
    g = grad[rows]
    m[rows] = 0.9 * m[rows] + 0.1 * g
    v[rows] = 0.999 * v[rows] + 0.001 * g ** 2
    rate = lr * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
    table[rows] -= rate * m[rows] / (np.sqrt(v[rows]) + 1e-8)


@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_the_item_table_is_updated_in_the_rows_a_sampled_step_read(loss):
    """Two steps against numpy Adam on the loss's gradient (TensorFlow's, made dense): under
    --loss sampled only the rows the step read move (lazy moments: a row read in the first
    step only stays put in the second, where dense Adam's momentum would move it); under the
    full loss every row does."""
    from core.parallel.comm import make_communicator
    from retrieval.model import Encoder, RetrievalConfig
    from retrieval.trainer import RetrievalTask, RetrievalTrainer
    config = RetrievalConfig(model="sasrec", items=200, length=5, width=8, dropout=0.0, seed=1)
    model, twin, lr = Encoder(config), Encoder(config), 0.01
    trainer = RetrievalTrainer(model, make_communicator(), lambda step: lr, loss=loss,
                               negatives="uniform", num_negatives=7, seed=3)
    task = RetrievalTask(twin, 3, loss, "uniform", 7)
    table = model.items.numpy().copy()
    lazy_m, lazy_v = np.zeros_like(table), np.zeros_like(table)
    read = []
    rng = np.random.default_rng(0)
    for step in range(2):
        ids = rng.integers(1, 41, (4, 6))
        ids[:, :2] = 0
        batch = ({"item_ids": tf.constant(ids, tf.int64)}, tf.constant(4), tf.constant(0))
        for name, var in twin.named.items():
            var.assign(model.named[name])
        with tf.GradientTape() as tape:
            loss_value = task.loss(task.dense_inputs(batch, tf.constant(step, tf.int64)), {},
                                   None, tf.float32)
        grad = tape.gradient(loss_value, twin.items)
        dense = tf.convert_to_tensor(grad).numpy()
        rows = np.unique(grad.indices.numpy()) if loss == "sampled" else np.arange(201)
        read.append(set(rows.tolist()))
        lazy_adam(table, lazy_m, lazy_v, dense, rows, lr, step + 1)
        before = model.items.numpy().copy()
        trainer.train_step(batch, step)
    np.testing.assert_allclose(model.items.numpy(), table, rtol=1e-5, atol=1e-6)
    moved = np.flatnonzero((model.items.numpy() != before).any(1))
    if loss == "sampled":
        assert set(moved.tolist()) <= read[1]
        only_first = read[0] - read[1] - {0}
        assert only_first and not (set(moved.tolist()) & only_first)
    else:
        assert moved.size > 190  # every row with a gradient (the padding row has none)


# the README section's sizes -> toy ones (flag: value), per program; flags appended
SECTION_SMOKE = {
    "retrieval.synthetic": ({"--users": "400", "--items": "1000"}, ["--topic_size", "50"]),
    "retrieval.main": ({"--eval_users": "100", "--eval_batch_size": "64", "--epochs": "1"},
                       ["--embedding_dim", "16", "--max_sequence_length", "10", "--cpu"]),
    "bench/retrieval_serving.py": ({"--requests": "20"}, []),
}


def section_line(line: str, tmp_path) -> str:
    """A README line at toy size: paths under /tmp moved into tmp_path, sizes swapped."""
    line = line.replace("/tmp/", f"{tmp_path}/")  # before the interpreter's path (may be there)
    line = re.sub(r"(^|\s)(\.venv/bin/)?python ", rf"\g<1>{sys.executable} ", line)
    line = re.sub(r"^horovodrun ", f"{os.path.dirname(sys.executable)}/horovodrun ", line)
    for program, (values, extra) in SECTION_SMOKE.items():
        if program in line:
            for flag, value in values.items():
                line = re.sub(rf"{flag} \S+", f"{flag} {value}", line)
            line += "".join(f" {x}" for x in extra)
    return line.replace("bench/", f"{ROOT}/bench/")


def test_the_readmes_catalogue_scale_lines_run_at_toy_size(tmp_path):
    """retrieval/README.md's "At catalogue scale" commands in order, at toy sizes (the scale
    benchmark is bench commands' test's)."""
    text = open(os.path.join(ROOT, "retrieval", "README.md")).read()
    section = text.split("\n## At catalogue scale", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in bash_lines(section) if "retrieval_scale.py" not in x]
    assert any("retrieval.serve" in x for x in lines) and any("--index faiss" in x for x in lines)
    for line in lines:
        proc = bounded_run(["bash", "-c", section_line(line, tmp_path)], timeout=600,
                           cwd=str(tmp_path), env={"PYTHONPATH": ROOT, "BENCH_SMOKE": "1"})
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        if "retrieval.serve" in line:
            assert re.match(r"1( \d+){10}\n2( \d+){10}\n$", proc.stdout), proc.stdout


@pytest.mark.parametrize("start, stop", [(0, 37), (0, 15), (15, 37), (9, 9), (30, 37)])
def test_a_split_tables_rows_are_those_rows_of_the_whole_draw(monkeypatch, start, stop):
    """NamedWeights.normal(rows=...) draws a few rows at a time (here 4, so the ranges cross
    blocks) and keeps its own: a process of --sharding row holds exactly its rows of the
    table one process would draw, and never the whole."""
    from core import hstu
    monkeypatch.setattr(hstu, "DRAWN_ROWS", 4)
    whole = hstu.NamedWeights(5).normal("t", [37, 3], 0.5).numpy()
    rows = hstu.NamedWeights(5).normal("t", [37, 3], 0.5, (start, stop)).numpy()
    np.testing.assert_array_equal(rows, whole[start:stop])


def test_row_shards_read_any_rows_and_send_their_gradient_to_the_table():
    """In one process RowShards' lookup is a gather (its gradient the rows read, duplicates
    summed) and whole() the table; the bounds split rows as the ranking families' row_wise."""
    from core.parallel.comm import Communicator
    from core.parallel.rows import RowShards

    class Rank1Of3(Communicator):
        rank, size = 1, 3
    assert RowShards(Rank1Of3(), 31).bounds == (0, 10, 20, 31)
    assert RowShards(Rank1Of3(), 31).held == (10, 20)
    shards = RowShards(Communicator(), 6)
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    ids = tf.constant([[4, 1], [4, 0]], tf.int64)
    with tf.GradientTape() as tape:
        read = shards.lookup(table, ids, "t")
        loss = tf.reduce_sum(read * [1.0, 2.0])
    np.testing.assert_array_equal(read.numpy(), table.numpy()[ids.numpy()])
    want = np.zeros((6, 2), np.float32)
    np.add.at(want, ids.numpy().ravel(), [1.0, 2.0])
    np.testing.assert_array_equal(tf.convert_to_tensor(tape.gradient(loss, table)).numpy(), want)
    np.testing.assert_array_equal(shards.whole(table, "w").numpy(), table.numpy())


def test_the_exact_top_k_holds_one_block_of_scores_at_a_time():
    """index.exact_top_k (the index's recall reference) against numpy's full sort, and its
    peak memory a few [chunk, N] blocks whatever the number of queries (it kept every
    block's argpartition alive: 16 GiB at 2,000 queries of 1M items)."""
    import tracemalloc
    from retrieval import index
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((50_000, 8)).astype(np.float32)
    queries = rng.standard_normal((1024, 8)).astype(np.float32)
    tracemalloc.start()
    found = index.exact_top_k(embeddings, queries, 10, chunk=128)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    block = 128 * 50_000 * 8  # one block's int64 positions
    assert peak < 3 * block, f"peak {peak / block:.1f} blocks"
    want = np.argsort(-(queries @ embeddings.T), axis=1, kind="stable")[:, :10]
    assert np.array_equal(np.sort(found, 1), np.sort(want, 1))
