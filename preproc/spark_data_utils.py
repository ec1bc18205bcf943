"""Spark stages of the Criteo preprocessing: raw click-log text -> parquet ready for conversion.

Everything here uses the PySpark DataFrame API only (no Python UDFs), so executors never start
Python workers and the same code runs in local mode, on a standalone/YARN/Kubernetes cluster,
and under the RAPIDS accelerator.

Rules (also in preproc/README.md):

* A raw line is `label \t I1..I13 \t C1..C26` (40 fields). A line with another number of
  fields, or whose label is not 0 or 1, is malformed: it is dropped and counted, but it still
  counts as a line for the positions used by the test/validation split.
* Numerical feature: a field that is an integer (optional sign, digits) is read as a number x;
  an empty or non-integer field counts as x = 0. The stored value is ln(max(x, 0) + 2) (the
  seed's "add 2, natural log" after clamping negatives to 0), which is finite and >= ln 2 for
  every input (x is also capped at 1e300).
* Categorical feature: the raw string; an empty field is the value "" and is treated like any
  other value (it gets its own id when it is frequent enough). Per feature, counting only the
  training days, a value seen at least T times (T = frequency threshold; T <= 1 keeps every
  value) gets an id 1, 2, ... in the order (count descending, value ascending by bytes); every
  other value, including values never seen in training, gets the shared id 0.
  Cardinality = number of frequent values + 1.
* With day files day_0 .. day_K: days 0..K-1 are the training set; the lines of day K with
  position < floor(lines_K / 2) are the validation set and the rest the (hold-out) test set.
* Row order inside every split is (day, line position in the day file).
"""
from __future__ import annotations

import functools
import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

NUM_NUMERICAL = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_NUMERICAL + NUM_CATEGORICAL
NUMERICAL_COLUMNS = [f"I{i + 1}" for i in range(NUM_NUMERICAL)]
CATEGORICAL_COLUMNS = [f"C{i + 1}" for i in range(NUM_CATEGORICAL)]
ID_COLUMNS = [f"cat_{i}" for i in range(NUM_CATEGORICAL)]
RARE_ID = 0
MAX_CARDINALITY = 2 ** 31 - 1  # ids travel as 32-bit integers
INTEGER_PATTERN = r"^[+-]?[0-9]+$"
MAX_COUNT_VALUE = 1e300
# pos = day * 2**LINE_BITS + line: one sortable key for (day, line position).
LINE_BITS = 40

# the last day file: its first half (by line position) is the validation set, its second half
# the hold-out test set, as in the reference preprocessing
FIRST_HALF_SPLIT = "validation"
SECOND_HALF_SPLIT = "test"

SPLIT_COLUMN = "split"
POS_COLUMN = "pos"
BUCKET_COLUMN = "bucket"
LABEL_COLUMN = "label"


class PreprocError(RuntimeError):
    """A problem with the input or the configuration, explained in one line."""


# ---- stage 1: parse ---------------------------------------------------------------------
def numerical_transform(field):
    """Column expression: raw text field -> ln(max(x, 0) + 2) as float (x = 0 for
    empty/garbage)."""
    x = F.when(field.rlike(INTEGER_PATTERN), field.cast("double")).otherwise(F.lit(0.0))
    x = F.least(F.greatest(x, F.lit(0.0)), F.lit(MAX_COUNT_VALUE))
    return F.log(x + F.lit(2.0)).cast("float")


def parse_days(spark: SparkSession, day_paths: list) -> DataFrame:
    """Raw text of day_0..day_K -> one row per line with its order keys and parsed fields.

    Columns: day, blk (byte offset of the file split the line was read from), mid (a
    monotonically increasing id that orders lines inside a split), ok, label, I1..I13, C1..C26.
    """
    frames = [spark.read.text(path).select(F.lit(day).cast("int").alias("day"),
                                           F.col("_metadata.file_block_start").alias("blk"),
                                           F.col("value"))
              for day, path in enumerate(day_paths)]
    lines = functools.reduce(DataFrame.unionAll, frames)
    lines = lines.withColumn("mid", F.monotonically_increasing_id())
    parts = F.split(F.col("value"), "\t", -1)
    label = F.get(parts, 0)
    ok = (F.size(parts) == NUM_FIELDS) & label.isin("0", "1")
    columns = [F.col("day"), F.col("blk"), F.col("mid"), ok.alias("ok"),
               F.when(ok, label == "1").alias(LABEL_COLUMN)]
    for i, name in enumerate(NUMERICAL_COLUMNS):
        columns.append(F.when(ok, numerical_transform(F.get(parts, 1 + i))).alias(name))
    for i, name in enumerate(CATEGORICAL_COLUMNS):
        columns.append(F.when(ok, F.get(parts, 1 + NUM_NUMERICAL + i)).alias(name))
    return lines.select(*columns)


# ---- stage 2: line positions ------------------------------------------------------------
def line_offsets(parsed: DataFrame):
    """Per (day, file split): how to turn `mid` into the line position inside the day file.

    Returns (deltas, lines_per_day, malformed) where deltas is a list of (day, blk, delta) with
    line = mid + delta, lines_per_day a dict day -> number of lines, malformed the number of
    dropped lines. Checks that every file split was read as one unbroken run of ids, which is
    what makes the positions exact.
    """
    rows = (parsed.groupBy("day", "blk")
            .agg(F.count(F.lit(1)).alias("n"), F.min("mid").alias("mid0"),
                 F.max("mid").alias("mid1"),
                 F.sum(F.when(F.col("ok"), 0).otherwise(1)).alias("bad"))
            .collect())
    rows = sorted(rows, key=lambda r: (r["day"], r["blk"]))
    deltas, lines_per_day, malformed = [], {}, 0
    for r in rows:
        if r["mid1"] - r["mid0"] + 1 != r["n"]:
            raise PreprocError(f"day {r['day']}: the file split at byte {r['blk']} was not read "
                               f"as one run of rows; cannot number its lines")
        offset = lines_per_day.get(r["day"], 0)
        deltas.append((int(r["day"]), int(r["blk"]), int(offset - r["mid0"])))
        lines_per_day[r["day"]] = offset + int(r["n"])
        malformed += int(r["bad"])
    return deltas, lines_per_day, malformed


def with_positions(spark: SparkSession, parsed: DataFrame, deltas: list, lines_per_day: dict,
                   test_day: int, buckets: int) -> DataFrame:
    """Add `line`, `pos`, `split` (train / test / validation) and `bucket` to the well-formed
    rows. `bucket` cuts the (day, line) order into
    `buckets` consecutive ranges of about equal numbers of lines: the output is partitioned
    by it, which needs no sampling pass."""
    days = sorted(lines_per_day)
    test_lines = lines_per_day.get(test_day, 0)
    total = max(sum(lines_per_day.values()), 1)
    base, before = {}, 0
    for day in days:
        base[day] = before
        before += lines_per_day[day]
    schema = T.StructType([T.StructField("day", T.IntegerType()),
                           T.StructField("blk", T.LongType()),
                           T.StructField("delta", T.LongType()),
                           T.StructField("base", T.LongType())])
    delta_df = spark.createDataFrame([(d, b, delta, base[d]) for d, b, delta in deltas], schema)
    rows = parsed.filter(F.col("ok")).join(F.broadcast(delta_df), ["day", "blk"])
    line = F.col("mid") + F.col("delta")
    split = (F.when(F.col("day") < test_day, F.lit("train"))
             .when(line < F.lit(test_lines // 2), F.lit(FIRST_HALF_SPLIT))
             .otherwise(F.lit(SECOND_HALF_SPLIT)))
    bucket = F.floor((F.col("base") + line) * F.lit(max(1, buckets)) / F.lit(total))
    return rows.select(
        "day", line.alias("line"),
        (F.col("day").cast("long") * F.lit(1 << LINE_BITS) + line).alias(POS_COLUMN),
        split.alias(SPLIT_COLUMN), bucket.cast("int").alias(BUCKET_COLUMN), LABEL_COLUMN,
        *NUMERICAL_COLUMNS, *CATEGORICAL_COLUMNS)


# ---- stage 3: dictionaries --------------------------------------------------------------
def value_counts(train: DataFrame, frequency_threshold: int) -> DataFrame:
    """(feature, value, count) for every value seen >= threshold times in the training rows."""
    pairs = F.explode(F.array(*[F.struct(F.lit(i).alias("feature"), F.col(c).alias("value"))
                                for i, c in enumerate(CATEGORICAL_COLUMNS)]))
    counts = (train.select(pairs.alias("p"))
              .select("p.feature", "p.value")
              .groupBy("feature", "value").agg(F.count(F.lit(1)).alias("count")))
    if frequency_threshold > 1:
        counts = counts.filter(F.col("count") >= frequency_threshold)
    return counts


def build_dictionaries(spark: SparkSession, train: DataFrame, frequency_threshold: int,
                       models_dir: str, scratch_dir: str) -> list:
    """Write models_dir/feature=<i>/ (value, id, count) and return the 26 cardinalities.

    Ids are consecutive per feature in the order (count desc, value asc), starting at 1 (0 is
    the shared id of rare and unseen values). The global sort runs distributed; consecutive
    ids come from the per-partition row counts of the sorted result (no single-partition
    window).
    """
    counts = value_counts(train, frequency_threshold)
    ordered = (counts.orderBy(F.col("feature").asc(), F.col("count").desc(),
                              F.col("value").asc())
               .select("feature", "value", "count",
                       F.spark_partition_id().alias("pid"),
                       F.monotonically_increasing_id().alias("mid")))
    ordered.write.mode("overwrite").parquet(scratch_dir)
    ordered = spark.read.parquet(scratch_dir)
    runs = (ordered.groupBy("feature", "pid")
            .agg(F.count(F.lit(1)).alias("n"), F.min("mid").alias("mid0"),
                 F.max("mid").alias("mid1"))
            .collect())
    runs = sorted(runs, key=lambda r: (r["feature"], r["pid"]))
    sizes = [0] * NUM_CATEGORICAL
    deltas = []
    for r in runs:
        if r["mid1"] - r["mid0"] + 1 != r["n"]:
            raise PreprocError(f"dictionary of feature {r['feature']}: partition {r['pid']} "
                               f"is not one run of rows; cannot number its values")
        first_id = sizes[r["feature"]] + 1
        deltas.append((int(r["feature"]), int(r["pid"]), int(first_id - r["mid0"])))
        sizes[r["feature"]] += int(r["n"])
    too_big = [i for i, size in enumerate(sizes) if size + 1 > MAX_CARDINALITY]
    if too_big:
        raise PreprocError(f"feature(s) {too_big} have more than {MAX_CARDINALITY} ids; raise "
                           f"the frequency threshold")
    schema = T.StructType([T.StructField("feature", T.IntegerType()),
                           T.StructField("pid", T.IntegerType()),
                           T.StructField("delta", T.LongType())])
    delta_df = spark.createDataFrame(deltas, schema)
    (ordered.join(F.broadcast(delta_df), ["feature", "pid"])
     .select("feature", "value", (F.col("mid") + F.col("delta")).cast("int").alias("id"),
             "count")
     .sortWithinPartitions("feature", "id")
     .write.mode("overwrite").partitionBy("feature").parquet(models_dir))
    return [size + 1 for size in sizes]


def read_dictionary(spark: SparkSession, models_dir: str, feature: int):
    """The (value, id) table of one feature, or None when it has no frequent value."""
    path = os.path.join(models_dir, f"feature={feature}")
    if not os.path.isdir(path):
        return None
    return spark.read.parquet(path).select("value", "id")


# ---- stage 4: apply ---------------------------------------------------------------------
# Features whose dictionaries together hold at most this many values are looked up in one
# combined table, broadcast once and reused by every join (keyed "<feature>:<value>" so the
# table is the same for all of them); every other feature gets its own join, broadcast or
# sort-merge as Spark decides.
COMBINED_DICTIONARY_MAX = 1 << 22


def combined_features(cardinalities: list, budget: int = COMBINED_DICTIONARY_MAX) -> list:
    """Features (smallest dictionaries first) that share the combined lookup table."""
    chosen, total = [], 0
    for i in sorted(range(len(cardinalities)), key=lambda i: (cardinalities[i], i)):
        size = cardinalities[i] - 1
        if size == 0:
            continue
        if total + size > budget:
            break
        chosen.append(i)
        total += size
    return sorted(chosen)


def apply_dictionaries(spark: SparkSession, rows: DataFrame, models_dir: str,
                       cardinalities: list, budget: int = COMBINED_DICTIONARY_MAX) -> DataFrame:
    """Replace C1..C26 by cat_0..cat_25 ids (0 for values not in the dictionary)."""
    combined = combined_features(cardinalities, budget)
    table = None
    if combined:
        table = F.broadcast(
            spark.read.parquet(models_dir).filter(F.col("feature").isin(combined))
            .select(F.concat(F.col("feature").cast("string"), F.lit(":"),
                             F.col("value")).alias("_key"), F.col("id").alias("_id")))
    out = rows
    for i, column in enumerate(CATEGORICAL_COLUMNS):
        target = ID_COLUMNS[i]
        if cardinalities[i] <= 1:
            out = out.withColumn(target, F.lit(RARE_ID)).drop(column)
            continue
        if i in combined:
            key = f"_key{i}"
            lookup = table.withColumnRenamed("_key", key).withColumnRenamed("_id", target)
            out = (out.withColumn(key, F.concat(F.lit(f"{i}:"), F.col(column)))
                   .join(lookup, key, "left").drop(key))
        else:
            lookup = (read_dictionary(spark, models_dir, i)
                      .withColumnRenamed("value", column).withColumnRenamed("id", target))
            out = out.join(lookup, column, "left")
        out = out.withColumn(target, F.coalesce(F.col(target), F.lit(RARE_ID))).drop(column)
    return out.select(SPLIT_COLUMN, BUCKET_COLUMN, POS_COLUMN, LABEL_COLUMN, *NUMERICAL_COLUMNS,
                      *[F.col(c).cast("int").alias(c) for c in ID_COLUMNS])


def write_transformed(rows: DataFrame, path: str, partitions: int) -> None:
    """One directory per split and bucket, each holding one contiguous run of positions, rows
    sorted by position inside every file (the converter checks both)."""
    (rows.repartition(max(1, partitions), BUCKET_COLUMN)
     .sortWithinPartitions(SPLIT_COLUMN, BUCKET_COLUMN, POS_COLUMN)
     .write.mode("overwrite").partitionBy(SPLIT_COLUMN, BUCKET_COLUMN).parquet(path))
