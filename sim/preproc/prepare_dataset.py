"""Amazon reviews (JSON lines) + item categories -> SIM TFRecord dataset, on Spark.

  python -m sim.preproc.prepare_dataset --amazon_dataset_path RAW --output_path OUT
      [--min_interactions 20] [--history_length 100] [--master URL] [--seed 0]

RAW holds reviews_Books.json (reviewerID, asin, unixReviewTime per line) and meta_Books.json
(asin, categories; an item's category is the last entry of its last category path), or name
the files with --reviews_file / --metadata_file; the metadata may also be an
`asin<TAB>category` table. Spark filters users with fewer than --min_interactions reviews,
orders each user's reviews by (time, asin), maps ids to 1..cardinality (NVIDIA's convention,
0 is padding: users, items by sorted key; categories by name, then one "unknown" category
for items without one) and builds the examples (sim.preproc.examples), histories left-padded
to --history_length. The driver then streams them, in (user, interaction,
positive first) order, into the core ColumnarWriter (TFRecord `train`, `test`, feature_spec.yaml).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from core import runtime
from core.cli import run_cli
from core.spark import local_conf, start_spark, stop_spark
from sim import contract

ROWS_PER_FILE = 200_000


class PreprocError(ValueError):
    pass


def read_reviews(spark, path: str):
    from pyspark.sql import functions as fn
    if not os.path.isfile(path):
        raise PreprocError(f"reviews file not found: {path}")
    raw = spark.read.json(path)
    missing = [c for c in ("reviewerID", "asin", "unixReviewTime") if c not in raw.columns]
    if missing:
        raise PreprocError(f"{path}: reviews lack field(s) {missing}")
    return raw.select(fn.col("reviewerID").cast("string").alias("user"),
                      fn.col("asin").cast("string").alias("asin"),
                      fn.col("unixReviewTime").cast("long").alias("time")).dropna()


def read_categories(spark, path: str):
    """(asin, category): meta JSON lines (last entry of the last category path; the 2014
    release's single-quoted lines parse too) or an asin<TAB>category table."""
    from pyspark.sql import functions as fn
    if not os.path.isfile(path):
        raise PreprocError(f"metadata file not found: {path}")
    with open(path) as f:
        first = next((line for line in f if line.strip()), "")
    if first.lstrip().startswith("{"):
        meta = spark.read.json(path)
        if "asin" not in meta.columns or "categories" not in meta.columns:
            raise PreprocError(f"{path}: metadata lines need 'asin' and 'categories'")
        table = meta.select("asin", fn.element_at(fn.element_at("categories", -1), -1)
                            .alias("category"))
    else:
        table = spark.read.csv(path, sep="\t", schema="asin string, category string")
    # one category per item even if the table repeats an asin
    return table.dropna().groupBy("asin").agg(fn.min("category").alias("category"))


def index(values, name: str, start: int = 0):
    """Distinct values of one column -> (value, id) with ids start.. in sorted order. (One
    window over all values: fine for the millions of users and items of Amazon Books.)"""
    from pyspark.sql import functions as fn, Window
    ranked = fn.row_number().over(Window.orderBy(name)) + (start - 1)
    return values.select(name).distinct().withColumn(f"{name}_id", ranked.cast("long"))


def build(spark, reviews_path, metadata_path, min_interactions, history_length, seed):
    """-> (spec, RDD of (split, row) sorted by (user, k, label))."""
    from pyspark.sql import functions as fn
    reviews = read_reviews(spark, reviews_path)
    counts = reviews.groupBy("user").count().where(fn.col("count") >= min_interactions)
    kept = reviews.join(counts.select("user"), "user")
    users, items = index(kept, "user", start=1), index(kept, "asin", start=1)
    num_users, num_items = users.count(), items.count()
    if num_users == 0:
        raise PreprocError(f"{reviews_path}: no user has --min_interactions "
                           f"{min_interactions} reviews")
    if num_items < 2:
        raise PreprocError(f"{reviews_path}: the kept reviews name {num_items} item(s); "
                           f"negative sampling needs at least 2")
    item_cats = items.join(read_categories(spark, metadata_path), "asin", "left")
    categories = index(item_cats.dropna(), "category", start=1)
    num_categories = categories.count() + 1  # the last one: unknown
    item_cats = item_cats.join(categories, "category", "left").fillna(
        num_categories, ["category_id"])
    category_of = np.zeros(num_items + 1, np.int64)  # by item id; row 0 unused (padding)
    for row in item_cats.select("asin_id", "category_id").collect():
        category_of[row[0]] = row[1]
    events = kept.join(users, "user").join(items, "asin")
    by_user = (events.rdd.map(lambda r: (r["user_id"], (r["time"], r["asin"], r["asin_id"])))
               .groupByKey())
    table = spark.sparkContext.broadcast(category_of)
    # Pickle the example builder by value: a cluster's Python workers need not have this
    # repository on their path (it needs only numpy).
    from pyspark import cloudpickle

    from sim.preproc import examples as example_module
    cloudpickle.register_pickle_by_value(example_module)

    def examples(pair):
        user, interactions = pair
        ordered = [item for _, _, item in sorted(interactions)]
        return example_module.user_examples(user, ordered, table.value, history_length, seed)

    rows = by_user.flatMap(examples).sortBy(lambda e: (e[1][0], e[1][1], -e[1][2]))
    spec = contract.sim_spec(num_users, num_items, num_categories, history_length,
                           {"source": os.path.basename(reviews_path),
                            "min_interactions": min_interactions, "seed": seed})
    return spec, rows


def write(spec, rows, output_path: str, overwrite: bool = False):
    """Stream (split, row) pairs into TFRecord files, ROWS_PER_FILE rows a part."""
    from core.columnar import ColumnarWriter
    writer = ColumnarWriter(output_path, spec, "tfrecord", overwrite=overwrite,
                            ids_from_one=True)
    buffers = {"train": [], "test": []}
    length = spec.dimension(contract.POSITIVE[0])
    for split, row in rows.toLocalIterator():
        buffers[split].append(row)
        if len(buffers[split]) == ROWS_PER_FILE:
            writer.write(split, _columns(buffers[split], length))
            buffers[split] = []
    for split, buffered in buffers.items():
        if buffered:
            writer.write(split, _columns(buffered, length))
    return writer.close()


def _columns(rows, history_length: int) -> dict:
    user, _, label, item, cat, hist_items, hist_cats, neg_items, neg_cats = zip(*rows)
    return contract.columns(user, item, cat, list(hist_items), list(hist_cats), list(neg_items),
                          list(neg_cats), label, history_length)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--amazon_dataset_path", required=True, help="directory of the raw files")
    p.add_argument("--output_path", required=True, help="dataset directory to write")
    p.add_argument("--reviews_file", default=None, help="default RAW/reviews_Books.json")
    p.add_argument("--metadata_file", default=None, help="default RAW/meta_Books.json")
    p.add_argument("--min_interactions", type=int, default=20)
    p.add_argument("--history_length", type=int, default=100, help="spec dimensions")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--seed", type=int, default=0, help="seed of the negative sampling")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output")
    args = p.parse_args(argv)
    raw = args.amazon_dataset_path
    args.reviews_file = args.reviews_file or os.path.join(raw, "reviews_Books.json")
    args.metadata_file = args.metadata_file or os.path.join(raw, "meta_Books.json")
    if args.min_interactions < 1 or args.history_length < 2:
        raise PreprocError(f"--min_interactions must be >= 1 and --history_length >= 2, found "
                           f"{args.min_interactions}, {args.history_length}")
    return args


def spark_conf(master, shuffle_partitions: int = 8) -> dict:
    return local_conf(master, "sim-preprocessing", shuffle_partitions)


def run(args, spark=None):
    """The job on a given session, or on its own (stopped at the end)."""
    if spark is None:
        own = start_spark(spark_conf(args.master))
        try:
            return run(args, own)
        finally:
            stop_spark(own)
    spec, rows = build(spark, args.reviews_file, args.metadata_file, args.min_interactions,
                       args.history_length, args.seed)
    return write(spec, rows, args.output_path, args.overwrite)


def main(argv=None):
    runtime.configure()  # quiet TensorFlow, which the TFRecord writer imports
    args = parse_args(argv)

    def work():
        return f"wrote {args.output_path}: rows {run(args).metadata.get('rows')}"
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
