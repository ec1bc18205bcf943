"""The two-stage recommender (recommend/): training prefixes and final-list ranks against
pure-Python readings, the rankers' one pass against one candidate at a time, and the CLI end to
end on a learnable pattern: its retrieval figures are the retrieval run's own, it resumes
exactly, two processes give one's figures, and the SavedModel's list is the two models run by
hand."""
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip
from recommend.ranker import Ranker, RankerConfig
from recommend.stages import final_ranks, training_pairs
from test_retrieval_training import ITEMS, TINY, prepare, results, retrieval, successor_lines

RANKING = ["--candidates", "10", "--batch_size", "32", "--eval_batch_size", "64", "--cpu",
           "--print_freq", "5", "--lr", "0.003"]


def test_training_pairs_are_every_prefix_and_its_next_item():
    rows = np.array([[0, 0, 0, 4, 7, 9], [0, 0, 0, 0, 0, 3], [1, 2, 3, 4, 5, 6]], np.int64)
    histories, targets = training_pairs(rows, 4)
    want = []
    for row in rows:
        items = [int(i) for i in row if i > 0]
        for j in range(1, len(items)):
            prefix = items[:j][-4:]
            want.append(([0] * (4 - len(prefix)) + prefix, items[j]))
    assert histories.tolist() == [h for h, _ in want]
    assert targets.tolist() == [t for _, t in want]


def test_final_ranks_read_the_reordered_candidates_then_retrieval():
    candidates = np.array([[5, 2, 9], [5, 2, 9], [5, 2, 9], [1, 3, 4]], np.int64)
    logits = np.array([[0.1, 0.9, 0.5], [0.1, 0.9, 0.5], [0.3, 0.3, 0.3], [1.0, 2.0, 3.0]],
                      np.float32)
    targets = np.array([9, 2, 5, 8], np.int64)
    retrieval_ranks = np.array([2, 1, 0, 17], np.int32)
    ranks = final_ranks(tf.constant(candidates), tf.constant(logits), tf.constant(targets),
                        tf.constant(retrieval_ranks)).numpy()
    # the reordered lists: [2, 9, 5] twice; a three-way tie counts against the target; the
    # fourth target is no candidate and keeps its retrieval rank
    assert ranks.tolist() == [1, 0, 2, 17]
    # a target outside the candidates ranked above K by a tie still misses the K
    assert final_ranks(tf.constant(candidates[3:]), tf.constant(logits[3:]),
                       tf.constant([8], tf.int64), tf.constant([1], tf.int32)).numpy() == [3]


@pytest.mark.parametrize("kind", ["hstu", "din"])
def test_a_pass_over_k_candidates_gives_each_its_own_logit(kind):
    rng = np.random.default_rng(0)
    ranker = Ranker(RankerConfig(ranker=kind, items=40, length=6, width=8, seed=3),
                    rng.standard_normal((41, 8)).astype(np.float32))
    for variable in ranker.head.layers[-1]:  # the zero start would hide the head
        variable.assign(rng.standard_normal(variable.shape).astype(np.float32))
    ranker.dot_weight.assign(0.5)
    ranker.seen_weight.assign(-0.7)
    history = tf.constant([[0, 0, 3, 7, 1, 2], [4, 5, 6, 7, 8, 9]], tf.int64)
    candidates = tf.constant(rng.integers(1, 41, (2, 5)), tf.int64)
    scores = tf.constant(rng.standard_normal((2, 5)), tf.float32)
    together = ranker(history, candidates, scores).numpy()
    alone = np.concatenate([ranker(history, candidates[:, c:c + 1], scores[:, c:c + 1]).numpy()
                            for c in range(5)], 1)
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)
    assert np.ptp(together - scores.numpy()) > 1e-3  # the head matters


def test_an_untrained_ranker_orders_as_retrieval():
    rng = np.random.default_rng(1)
    ranker = Ranker(RankerConfig(items=20, length=4, width=8),
                    rng.standard_normal((21, 8)).astype(np.float32))
    scores = rng.standard_normal((3, 6)).astype(np.float32)
    logits = ranker(tf.constant(rng.integers(0, 21, (3, 4)), tf.int64),
                    tf.constant(rng.integers(1, 21, (3, 6)), tf.int64), tf.constant(scores))
    np.testing.assert_allclose(logits.numpy(), scores, rtol=1e-6)


def test_the_seen_term_moves_exactly_the_candidates_the_history_holds():
    rng = np.random.default_rng(2)
    ranker = Ranker(RankerConfig(items=9, length=4, width=8),
                    rng.standard_normal((10, 8)).astype(np.float32))
    history = [[0, 0, 3, 7], [5, 5, 1, 2]]
    candidates = [[3, 4, 7, 9], [1, 6, 5, 3]]
    args = (tf.constant(history, tf.int64), tf.constant(candidates, tf.int64),
            tf.constant(rng.standard_normal((2, 4)), tf.float32))
    before = ranker(*args).numpy()
    ranker.seen_weight.assign(-2.5)
    seen = [[float(c in h) for c in row] for h, row in zip(history, candidates)]
    np.testing.assert_allclose(ranker(*args).numpy() - before, -2.5 * np.array(seen),
                               atol=1e-6)


def recommend(*args, timeout=400, launcher=()):
    proc = bounded_run([*launcher, sys.executable, "-m", "recommend.main", *args],
                       timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def stage_one(tmp_path_factory):
    """A dataset and a retrieval run trained on it, cut short so a ranker has room to help."""
    root = tmp_path_factory.mktemp("recommend")
    data = prepare(root, "successors", successor_lines(300))
    run = str(root / "retrieval")
    retrieval("--model", "hstu", "--dataset_dir", data, "--output_dir", run, *TINY,
              "--epochs", "1", "--max_steps", "4")
    return data, run


def test_learns_above_retrieval_and_reports_retrievals_own_figures(stage_one, tmp_path):
    data, run = stage_one
    out = str(tmp_path / "two_stage")
    recommend("--dataset_dir", data, "--retrieval_dir", run, "--output_dir", out, *RANKING,
              "--epochs", "4")
    got = results(out)
    # the retrieval model on the same users: what retrieval.main says of it
    retrieval("--model", "hstu", "--dataset_dir", data, "--output_dir", run, *TINY,
              "--mode", "eval")
    own = results(run)
    for split in ("valid", "test", "valid_filtered", "test_filtered"):
        for key, value in own[split].items():
            assert got["retrieval"][split][key] == pytest.approx(value, abs=1e-9), (split, key)
        assert set(got[split]) == set(own[split])
    assert got["test"]["ndcg@10"] > got["retrieval"]["test"]["ndcg@10"] + 0.05
    # a cutoff beyond K: the final list's tail is retrieval's order
    assert got["test"]["hr@50"] == got["retrieval"]["test"]["hr@50"]
    assert 1 <= got["best_epoch"] <= 4 and got["selected_on"] == "ndcg@10"


def test_resumed_run_ends_where_an_uninterrupted_one_does(stage_one, tmp_path):
    data, run = stage_one
    common = ["--dataset_dir", data, "--retrieval_dir", run, *RANKING,
              "--early_stopping_patience", "0", "--epochs", "3", "--ranker", "din"]
    straight, cut = str(tmp_path / "straight"), str(tmp_path / "cut")
    recommend(*common, "--output_dir", straight)
    recommend(*common, "--output_dir", cut, "--max_steps", "13")
    refused = bounded_run([sys.executable, "-m", "recommend.main", *common, "--output_dir", cut],
                          timeout=200)
    assert refused.returncode != 0 and "--resume" in refused.stderr.splitlines()[-1]
    recommend(*common, "--output_dir", cut, "--resume")
    assert results(cut) == results(straight)
    with np.load(os.path.join(straight, "checkpoint", "arrays.npz")) as a, \
            np.load(os.path.join(cut, "checkpoint", "arrays.npz")) as b:
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_two_processes_give_the_figures_of_one(stage_one, tmp_path):
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    data, run = stage_one
    common = ["--dataset_dir", data, "--retrieval_dir", run, *RANKING, "--epochs", "2"]
    recommend(*common, "--output_dir", str(tmp_path / "one"))
    recommend(*common, "--output_dir", str(tmp_path / "two"), launcher=horovodrun(2),
              timeout=500)
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert one["best_epoch"] == two["best_epoch"]
    for split in ("valid", "test"):
        for key, value in one[split].items():
            # gradients summed in another order: a near tie may flip for one of 300 users
            assert two[split][key] == pytest.approx(value, abs=1.01 / 300), (split, key)


def served_and_by_hand(data: str, run: str, out: str, k: int, attributes=None,
                       filter_seen=False) -> tuple:
    """(the SavedModel's top k of two histories, the same by hand: the retrieval encoder's
    scores in numpy, its 10 best (filter_seen: of the items the history does not hold), the
    ranker's logits from OUT/checkpoint's arrays)."""
    from core.sources import load_spec
    from recommend.stages import load_retrieval
    from retrieval.contract import RETRIEVAL_CONTRACT
    from training.checkpoint import load_arrays
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures["serving_default"]
    histories = np.array([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 0, 0, 0, 0, 0, 0, 29, 30]],
                         np.int64)
    top = served(item_ids=tf.constant(histories))
    encoder = load_retrieval(run, load_spec(data, RETRIEVAL_CONTRACT))
    recent = np.array([[0] * (8 - min(8, (h > 0).sum())) + list(h[h > 0][-8:])
                       for h in histories], np.int64)
    query = encoder.queries(encoder.encode(tf.constant(recent))[:, -1]).numpy()
    scores = query @ encoder.catalogue().numpy().T
    ranked = scores.copy()
    if filter_seen:
        for row, history in enumerate(histories):
            ranked[row, history[history > 0] - 1] = -np.inf
    retrieved = np.argsort(-ranked, 1, kind="stable")[:, :10] + 1
    count = 0 if attributes is None else int(attributes.max())
    ranker = Ranker(RankerConfig(items=ITEMS, length=8, width=16, attributes=count),
                    np.zeros((ITEMS + 1, 16)), attributes)
    arrays, _ = load_arrays(os.path.join(out, "checkpoint"))
    assert set(arrays) >= set(ranker.named)
    for name, variable in ranker.named.items():
        variable.assign(arrays[name])
    logits = ranker(tf.constant(recent), tf.constant(retrieved),
                    tf.constant(np.take_along_axis(scores, retrieved - 1, 1), tf.float32)).numpy()
    want = np.take_along_axis(retrieved, np.argsort(-logits, 1, kind="stable")[:, :k], 1)
    return top, want, -np.sort(-logits, 1)[:, :k]


def test_saved_model_serves_the_two_models_run_by_hand(stage_one, tmp_path):
    data, run = stage_one
    out = str(tmp_path / "two_stage")
    common = ["--dataset_dir", data, "--retrieval_dir", run, "--output_dir", out, *RANKING]
    recommend(*common, "--epochs", "2")
    recommend(*common, "--mode", "export", "--top_k", "4")
    top, ids, logits = served_and_by_hand(data, run, out, 4)
    np.testing.assert_array_equal(top["top_k_ids"].numpy(), ids)
    np.testing.assert_allclose(top["top_k_scores"].numpy(), logits, rtol=1e-4, atol=1e-4)


def test_a_recommender_of_unseen_items_trains_selects_and_serves_without_them(stage_one,
                                                                               tmp_path):
    data, run = stage_one
    out = str(tmp_path / "unseen")
    common = ["--dataset_dir", data, "--retrieval_dir", run, "--output_dir", out, *RANKING,
              "--filter_seen"]
    recommend(*common, "--epochs", "2")
    assert results(out)["selected_on"] == "filtered_ndcg@10"
    recommend(*common, "--mode", "export", "--top_k", "4")
    top, ids, logits = served_and_by_hand(data, run, out, 4, filter_seen=True)
    np.testing.assert_array_equal(top["top_k_ids"].numpy(), ids)
    np.testing.assert_allclose(top["top_k_scores"].numpy(), logits, rtol=1e-4, atol=1e-4)


def test_training_lists_of_unseen_items_are_the_top_k_of_the_rest(stage_one):
    """Candidates(filter_seen=True).training against numpy: each prefix's K best items by the
    retrieval scores among those its history does not hold, the target kept; a prefix whose
    target is not among them is left out."""
    from core.sources import load_spec
    from recommend.stages import Candidates, load_retrieval
    from retrieval.contract import RETRIEVAL_CONTRACT
    data, run = stage_one
    encoder = load_retrieval(run, load_spec(data, RETRIEVAL_CONTRACT))
    rng = np.random.default_rng(5)
    histories = np.zeros((40, 8), np.int64)
    for row in histories:  # repeats included: a seen item may come back as the target
        n = rng.integers(1, 9)
        row[8 - n:] = rng.integers(1, ITEMS + 1, n)
    targets = np.where(rng.random(40) < 0.3, histories[:, -1], rng.integers(1, ITEMS + 1, 40))
    k = 6
    got = Candidates(encoder, k, batch_size=16, filter_seen=True).training(histories, targets)
    query = encoder.queries(encoder.encode(tf.constant(histories))[:, -1]).numpy()
    scores = query @ encoder.catalogue().numpy().T
    kept = []
    for i, (history, target) in enumerate(zip(histories, targets)):
        hidden = np.setdiff1d(history[history > 0], [target]) - 1
        order = np.argsort(-np.where(np.isin(np.arange(ITEMS), hidden), -np.inf, scores[i]),
                           kind="stable")[:k] + 1
        if target in order:
            kept.append((history, order, int(np.flatnonzero(order == target)[0])))
    assert 0 < len(kept) < 40
    np.testing.assert_array_equal(got["history"], [h for h, _, _ in kept])
    np.testing.assert_array_equal(got["label"], [label for _, _, label in kept])
    # near ties may order apart: the sets
    for (history, order, _), candidates in zip(kept, got["candidates"]):
        assert set(candidates) == set(order)


def test_the_rankers_items_add_the_mean_of_their_attributes():
    """Against a twin without attributes whose item table is the augmented one, built in
    plain Python: the history and the candidates both read the augmented vectors."""
    rng = np.random.default_rng(4)
    table = np.array([[0, 0], [2, 0], [0, 0], [1, 3], [3, 3], [4, 1], [0, 0]])
    ranker = Ranker(RankerConfig(items=6, length=4, width=8, attributes=4),
                    rng.standard_normal((7, 8)).astype(np.float32), table)
    for variable in ranker.head.layers[-1]:
        variable.assign(rng.standard_normal(variable.shape).astype(np.float32))
    attributes = ranker.attributes.numpy()
    assert not attributes[0].any()
    augmented = ranker.items.numpy().copy()
    for row, ids in enumerate(table.tolist()):
        ids = [a for a in ids if a]
        if ids:
            augmented[row] += sum(attributes[a] for a in ids) / len(ids)
    twin = Ranker(RankerConfig(items=6, length=4, width=8), augmented)
    for name, variable in twin.named.items():
        if name != "item_embeddings":
            variable.assign(ranker.named[name])
    args = (tf.constant([[0, 1, 3, 5], [2, 4, 4, 6]], tf.int64),
            tf.constant([[3, 4, 6], [1, 5, 2]], tf.int64),
            tf.constant(rng.standard_normal((2, 3)), tf.float32))
    np.testing.assert_allclose(ranker(*args).numpy(), twin(*args).numpy(), rtol=1e-5, atol=1e-5)


def test_item_attributes_train_and_serve(tmp_path):
    """--item_attributes on a dataset prepared with them: the SavedModel's list is the
    ranker with its attribute table run by hand."""
    from core.sources import load_spec
    from retrieval.contract import RETRIEVAL_CONTRACT
    from retrieval.data import item_attributes
    src = tmp_path / "attributes.json"
    src.write_text(json.dumps({str(i): [i % 3 + 1, 4 + i % 2] for i in range(1, ITEMS + 1)
                               if i % 4}))
    data = prepare(tmp_path, "successors", successor_lines(300), "--item_attributes", str(src))
    run = str(tmp_path / "retrieval")
    retrieval("--model", "hstu", "--dataset_dir", data, "--output_dir", run, *TINY,
              "--epochs", "1", "--max_steps", "4")
    out = str(tmp_path / "two_stage")
    common = ["--dataset_dir", data, "--retrieval_dir", run, "--output_dir", out, *RANKING,
              "--item_attributes"]
    recommend(*common, "--epochs", "1")
    recommend(*common, "--mode", "export", "--top_k", "4")
    assert results(out)["test"]["ndcg@10"] > 0
    table = item_attributes(load_spec(data, RETRIEVAL_CONTRACT)).table
    top, ids, logits = served_and_by_hand(data, run, out, 4, table)
    np.testing.assert_array_equal(top["top_k_ids"].numpy(), ids)
    np.testing.assert_allclose(top["top_k_scores"].numpy(), logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flags,culprit", [
    (["--retrieval_dir", "/nonexistent"], "/nonexistent"),
    (["--candidates", "0"], "--candidates"),
    (["--dropout_rate", "1"], "--dropout_rate"),
    (["--item_attributes"], "--item_attributes"),
    (["--num_heads", "3"], "--num_heads 3"),  # the retrieval model's width is 16
])
def test_bad_requests_end_in_one_error_line(stage_one, tmp_path, flags, culprit):
    data, run = stage_one
    proc = bounded_run([sys.executable, "-m", "recommend.main", "--dataset_dir", data,
                        "--retrieval_dir", run, "--output_dir", str(tmp_path / "out"), "--cpu",
                        *flags], timeout=200)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert culprit in proc.stderr.strip().splitlines()[-1]


def write_runs(root, figures: np.ndarray, retrieval_figures: np.ndarray) -> None:
    """seed_i/results.json per row of figures and retrieval_figures [seeds, 4 sets, 2 keys]."""
    sets = ("valid", "test", "valid_filtered", "test_filtered")
    for seed, (own, alone) in enumerate(zip(figures, retrieval_figures)):
        os.makedirs(root / f"seed_{seed}")
        results = {s: {"hr@10": float(f[0]), "ndcg@10": float(f[1])} for s, f in zip(sets, own)}
        results["retrieval"] = {s: {"hr@10": float(f[0]), "ndcg@10": float(f[1])}
                                for s, f in zip(sets, alone)}
        (root / f"seed_{seed}" / "results.json").write_text(json.dumps(results))


def report(*paths):
    return bounded_run([sys.executable, "-m", "recommend.report", *map(str, paths)], timeout=60)


def test_report_shows_each_protocol_beside_retrieval_alone(tmp_path):
    rng = np.random.default_rng(0)
    alone = rng.uniform(0.01, 0.1, (2, 4, 2))
    mine, other = rng.uniform(0.01, 0.1, (2, 2, 4, 2))
    write_runs(tmp_path / "mine", mine, alone)
    write_runs(tmp_path / "other", other, alone)
    proc = report(tmp_path / "mine", tmp_path / "other")
    assert proc.returncode == 0, proc.stderr
    every, removed = proc.stdout.split("**Seen items removed")
    for text, index in ((every, 1), (removed, 3)):
        rows = {line.split("|")[1].strip(): [float(c.strip().strip("*%"))
                                             for c in line.split("|")[3:6]]
                for line in text.splitlines() if line.startswith("| ") and "---" not in line
                and "list" not in line}
        want_alone = alone[:, index].mean(0)
        np.testing.assert_allclose(rows["retrieval alone"], [*want_alone, 0.0], atol=5e-5)
        for name, runs in (("mine", mine), ("other", other)):
            want = runs[:, index].mean(0)
            *figures, change = rows[f"two-stage: {name}"]
            np.testing.assert_allclose(figures, want, atol=5e-5)
            assert change == pytest.approx(100 * (want[1] / want_alone[1] - 1), abs=0.05)
    write_runs(tmp_path / "elsewhere", mine, alone[::-1] * 1.1)
    proc = report(tmp_path / "mine", tmp_path / "elsewhere")
    assert proc.returncode != 0 and proc.stderr.startswith("error: ") and \
        "elsewhere" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_the_readme_tables_are_the_report_of_the_committed_runs():
    from conftest import ROOT, bash_lines
    text = open(os.path.join(ROOT, "recommend", "README.md")).read()
    sections = [part.split("\n## ", 1)[0]
                for part in text.split("\n## Results on Amazon Beauty")[1:]]
    assert sections
    for section in sections:
        command = next(line for line in bash_lines(section) if "recommend.report" in line)
        paths = command.split("recommend.report", 1)[1].split()
        assert paths and all(p.startswith("bench/results/recommend/") for p in paths), paths
        proc = bounded_run([sys.executable, "-m", "recommend.report", *paths], timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() in section, \
            f"recommend/README.md: the tables of {paths} differ from the report"
