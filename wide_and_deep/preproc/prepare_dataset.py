"""Raw Outbrain CSVs -> Wide & Deep parquet dataset + feature_spec.yaml, with PySpark.

  python -m wide_and_deep.preproc.prepare_dataset --outbrain_path RAW --output_path OUT \
      [--master URL] [--seed 0] [--frequency_threshold 1] [--ctr_min_views 5]

RAW holds the competition's CSVs under their original names; the documents_* tables may be
absent (their features then get the "missing" value). Spark runs locally unless --master
(or SPARK_MASTER) names a cluster. OUT is staged in a temporary sibling directory and renamed into place.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time

from core.cli import run_cli
from core.spark import local_conf, start_spark, stop_spark
from core.files import StagedDirectory
from core.feature_spec import FeatureSpec
from wide_and_deep.contract import (DISPLAY_ID, ITEM_ONEHOT, LABEL, NUMERICAL, REQUEST_MULTIHOT,
                                    REQUEST_ONEHOT, build_spec)

ONEHOT = REQUEST_ONEHOT + ITEM_ONEHOT


class PreprocError(ValueError):
    pass


def log(message: str) -> None:
    print(f"[prepare_dataset] {message}", flush=True)


def read_tables(spark, raw: str) -> dict:
    from wide_and_deep.preproc.outbrain import REQUIRED_TABLES, SCHEMAS, schema
    tables = {}
    for name in SCHEMAS:
        path = os.path.join(raw, f"{name}.csv")
        if os.path.isfile(path):
            tables[name] = spark.read.csv(path, header=True, schema=schema(name))
        elif name in REQUIRED_TABLES:
            raise PreprocError(f"--outbrain_path {raw}: missing {name}.csv (required)")
        else:
            log(f"{name}.csv not found: its features get the missing value")
            tables[name] = spark.createDataFrame([], schema(name))
    return tables


def staged(df, work: str, name: str):
    """Written out and read back: later stages start from a short plan (a long chain of
    joins makes Spark's planner run out of driver memory)."""
    path = os.path.join(work, name)
    df.write.mode("overwrite").parquet(path)
    return df.sparkSession.read.parquet(path)


def transform(tables: dict, args, work: str):
    """-> (train rows, test rows, {feature: cardinality})"""
    from pyspark.sql import functions as F
    from wide_and_deep.preproc import outbrain as ob
    rows = staged(ob.with_split(ob.joined_rows(tables), args.seed), work, "joined")
    rows = staged(ob.with_documents(ob.with_rates(rows, args.ctr_min_views), tables), work,
                  "features")
    # every vocabulary in one pass and one staged table (a vocabulary reads only its own
    # column, which mapping the others leaves alone); a list feature's mapping shuffles its
    # lists: one stage each; the one-hot features' broadcast joins share one stage
    categorical = ([(name, cap, True) for name, _, cap in REQUEST_MULTIHOT] +
                   [(name, cap, False) for name, _, cap in ONEHOT])
    vocab = staged(ob.vocabularies(rows, categorical, args.frequency_threshold), work,
                   "vocabularies")
    sizes = dict(vocab.groupBy("_feature").count().collect())
    cardinalities = {name: max(2, sizes.get(name, 0) + 1) for name, _, _ in categorical}

    def vocab_of(name):
        return vocab.where(F.col("_feature") == name).select("_value", "_id")
    for name, _, _ in REQUEST_MULTIHOT:
        rows = staged(ob.categorify_list(rows, name, vocab_of(name)), work,
                      f"categorified_{name}")
    for name, _, _ in ONEHOT:
        rows = ob.categorify(rows, name, vocab_of(name))
    rows = staged(rows, work, "categorified_onehot")
    columns = ([F.col(n).cast("long") for n, _, _ in ONEHOT] +
               [F.col(n) for n, _, _ in REQUEST_MULTIHOT] +
               [F.coalesce(F.col(n), F.lit(0.0)).cast("float").alias(n) for n in NUMERICAL] +
               [F.col("clicked").cast("byte").alias(LABEL)])
    ordered = rows.orderBy("display_id", ob.RAW_AD_ID)
    train = ordered.where("is_train").select(*columns)
    test = ordered.where(~F.col("is_train")).select(*columns, F.col("display_id")
                                                    .cast("long").alias(DISPLAY_ID))
    return train, test, cardinalities


def output_spec(tmp: str, cardinalities: dict, rows: dict) -> FeatureSpec:
    """The reference spec's features with this data's cardinalities and files."""
    spec = build_spec([(n, d, cardinalities[n]) for n, d, _ in ONEHOT],
                      [(n, d, cardinalities[n]) for n, d, _ in REQUEST_MULTIHOT], NUMERICAL)
    for name in cardinalities:
        spec.feature_spec[name]["dtype"] = "int64"
    features = [f for f in spec.feature_spec if f != DISPLAY_ID]
    spec.source_spec = {}
    for mapping, extra in (("train", []), ("test", [DISPLAY_ID])):
        files = sorted(os.path.relpath(f, tmp)
                       for f in glob.glob(os.path.join(tmp, mapping, "part-*.parquet")))
        spec.source_spec[mapping] = [{"type": "parquet", "features": features + extra,
                                      "files": files}]
    spec.metadata["rows"] = rows
    return spec


def run(args, spark) -> dict:
    start = time.time()
    out = os.path.abspath(args.output_path)
    work = out + ".work"
    shutil.rmtree(work, ignore_errors=True)
    train, test, cardinalities = transform(read_tables(spark, args.outbrain_path), args, work)
    with StagedDirectory(out, overwrite=True) as staged:
        tmp = staged.tmp_dir
        train.write.parquet(os.path.join(tmp, "train"))
        test.write.parquet(os.path.join(tmp, "test"))
        rows = {"train": spark.read.parquet(os.path.join(tmp, "train")).count(),
                "test": spark.read.parquet(os.path.join(tmp, "test")).count()}
        output_spec(tmp, cardinalities, rows).to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out}: rows {rows}, cardinalities {cardinalities} "
        f"({time.time() - start:.1f} s)")
    return {"rows": rows, "cardinalities": cardinalities}


def spark_conf(master: str, partitions: int) -> dict:
    return local_conf(master, "outbrain-preproc", partitions, **{
        "spark.driver.memory": "2g", "spark.sql.ansi.enabled": "false"})


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outbrain_path", required=True, help="directory of the raw CSVs")
    p.add_argument("--output_path", required=True, help="dataset directory to write")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                   help="Spark master URL (default: local[*])")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/eval display split")
    p.add_argument("--frequency_threshold", type=int, default=1,
                   help="categorical values seen fewer times in training share id 0")
    p.add_argument("--ctr_min_views", type=int, default=5,
                   help="keys seen fewer times in training get CTR 0 (missing)")
    p.add_argument("--shuffle_partitions", type=int, default=8)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    def work():
        if not os.path.isdir(args.outbrain_path):
            raise PreprocError(f"--outbrain_path {args.outbrain_path}: no such directory")
        spark = start_spark(spark_conf(args.master, args.shuffle_partitions))
        try:
            run(args, spark)
        finally:
            stop_spark(spark)
    return run_cli(work, errors=(PreprocError, OSError))


if __name__ == "__main__":
    sys.exit(main())
