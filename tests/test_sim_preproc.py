"""SIM preprocessing (Spark) against an independent pandas computation, on generated reviews
and on the real Amazon Books sample rows."""
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import require_or_skip

REAL = "/work/shared/data/amazon_books"
HISTORY = 4


@pytest.fixture(scope="module")
def spark():
    require_or_skip(shutil.which("java") is not None, "Spark needs a Java runtime")
    from core.spark import start_spark, stop_spark
    from sim.preproc.prepare_dataset import spark_conf
    session = start_spark(spark_conf("local[2]", shuffle_partitions=2))
    yield session
    stop_spark(session)


def generated_raw(directory):
    """12 users with 1..12 reviews (time ties included), 15 items; categories for 10 items
    (one path list per item in meta, one line in the 2014 single-quoted style)."""
    rng = np.random.default_rng(7)
    reviews = []
    for u in range(12):
        for _ in range(u + 1):
            reviews.append({"reviewerID": f"U{u:02d}", "asin": f"B{rng.integers(0, 15):03d}",
                            "unixReviewTime": int(rng.integers(0, 6)) * 86400, "overall": 5.0,
                            "summary": "x"})
    with open(os.path.join(directory, "reviews_Books.json"), "w") as f:
        for r in rng.permutation(reviews):
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(directory, "meta_Books.json"), "w") as f:
        for i in range(10):
            paths = [["Books", f"Genre{i % 4}"], ["Books", "Sub", f"Leaf{i % 3}"]]
            line = json.dumps({"asin": f"B{i:03d}", "categories": paths, "title": "t"})
            f.write((line.replace('"', "'") if i == 3 else line) + "\n")
    return pd.DataFrame(reviews), {f"B{i:03d}": f"Leaf{i % 3}" for i in range(10)}


def pandas_reference(reviews, category_of_asin, min_interactions):
    """Kept users, id maps and per-user item sequences, computed without Spark. Ids run
    1..cardinality (0 is padding); the unknown category is the last one; item_cat is
    indexed by item id (entry 0 unused)."""
    counts = reviews.groupby("reviewerID").size()
    kept = reviews[reviews.reviewerID.isin(counts[counts >= min_interactions].index)]
    user_id = {u: i + 1 for i, u in enumerate(sorted(kept.reviewerID.unique()))}
    item_id = {a: i + 1 for i, a in enumerate(sorted(kept.asin.unique()))}
    names = sorted({category_of_asin[a] for a in item_id if a in category_of_asin})
    cat_id = {c: i + 1 for i, c in enumerate(names)}
    unknown = len(names) + 1
    item_cat = np.array([0] + [cat_id.get(category_of_asin.get(a), unknown)
                               for a in sorted(item_id)])
    sequences = {}
    for user, group in kept.groupby("reviewerID"):
        ordered = group.sort_values(["unixReviewTime", "asin"])
        sequences[user_id[user]] = [item_id[a] for a in ordered.asin]
    return sequences, item_cat, len(names) + 1


def check_against_reference(rows, sequences, item_cat):
    rows = list(rows)
    keys = [(r[0], r[1], r[2]) for _, r in rows]
    expected_keys = [(u, k, label) for u in sorted(sequences)
                     for k in range(len(sequences[u])) for label in (1, 0)]
    assert keys == expected_keys
    for split, (user, k, label, item, cat, hist, hist_cat, neg, neg_cat) in rows:
        seq = sequences[user]
        assert split == ("test" if k == len(seq) - 1 else "train")
        assert hist == seq[max(0, k - HISTORY):k]
        assert hist_cat == [item_cat[i] for i in hist] and cat == item_cat[item]
        if label == 1:
            assert item == seq[k]
        else:
            assert item != seq[k] and 1 <= item < len(item_cat)
        assert len(neg) == len(hist) and all(n != h for n, h in zip(neg, hist))
        assert neg_cat == [item_cat[i] for i in neg]
    return rows


def test_generated_reviews_match_pandas(spark, tmp_path):
    from sim.preproc.prepare_dataset import build
    reviews, categories = generated_raw(str(tmp_path))
    spec, rows = build(spark, str(tmp_path / "reviews_Books.json"),
                       str(tmp_path / "meta_Books.json"), 5, HISTORY, seed=3)
    sequences, item_cat, num_categories = pandas_reference(reviews, categories, 5)
    assert len(sequences) == 8  # users with 5..12 reviews
    assert spec.cardinality("user_id") == 8
    assert spec.cardinality("item_id") == len(item_cat) - 1
    assert spec.cardinality("cat_id") == num_categories == 4  # unknown + Leaf0..2
    check_against_reference(rows.cache().collect(), sequences, item_cat)
    check_written_dataset(spec, rows, str(tmp_path / "out"), sequences, item_cat)


def check_written_dataset(spec, rows, out, sequences, item_cat):
    """What the writer makes of the rows is a SIM dataset: spec valid for the SIM contract,
    test rows = each kept user's last interaction (positive then negative), histories as in
    pandas, left-padded with 0 to the spec's length (NVIDIA's layout)."""
    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    from sim.preproc.prepare_dataset import write
    write(spec, rows, out)
    spec = load_spec(out, SIM_CONTRACT)
    assert spec.metadata["rows"] == {
        "train": 2 * sum(len(s) - 1 for s in sequences.values()), "test": 2 * len(sequences)}
    test = open_reader(spec, "test", 1000).get(0)
    users = sorted(sequences)
    assert list(test["user_id"]) == [u for u in users for _ in (1, 0)]
    assert list(test["label"]) == [1, 0] * len(users)
    for row, user in enumerate(users):
        seq = sequences[user]
        history = seq[-1 - HISTORY:-1]
        assert test["item_id"][2 * row] == seq[-1]
        padding = [0] * (HISTORY - len(history))
        assert list(test["hist_item_id"][2 * row]) == padding + history
        assert list(test["hist_cat_id"][2 * row]) == padding + list(item_cat[history])


def test_negatives_follow_the_seed():
    """Negatives come from a generator seeded by (seed, user) alone, so Spark's partitioning
    cannot change them."""
    from sim.preproc.examples import user_examples
    categories = np.arange(51) % 7 + 1
    draws = {seed: [row[3] for _, row in user_examples(1, range(1, 31), categories, 5, seed)]
             for seed in (0, 0, 1)}
    assert draws[0] == [row[3] for _, row in user_examples(1, range(1, 31), categories, 5, 0)]
    assert draws[0] != draws[1]


def test_real_rows_and_thresholds(spark, tmp_path):
    from sim.preproc.prepare_dataset import PreprocError, build
    reviews_file = os.path.join(REAL, "reviews_Books_sample.json")
    table = os.path.join(REAL, "item_category.tsv")
    with pytest.raises(PreprocError, match="no user has --min_interactions 20"):
        build(spark, reviews_file, table, 20, HISTORY, seed=0)
    spec, rows = build(spark, reviews_file, table, 1, HISTORY, seed=0)
    reviews = pd.read_json(reviews_file, lines=True, dtype={"asin": str})
    tsv = pd.read_csv(table, sep="\t", names=["asin", "category"], dtype=str)
    categories = tsv.groupby("asin").category.min().to_dict()
    sequences, item_cat, num_categories = pandas_reference(reviews, categories, 1)
    assert spec.cardinality("user_id") == reviews.reviewerID.nunique() == len(sequences)
    assert spec.cardinality("cat_id") == num_categories
    known = item_cat[1:] < num_categories  # unknown-category items are kept, the last id
    assert 0 < known.sum() < len(item_cat) - 1
    check_against_reference(rows.collect(), sequences, item_cat)

