"""Spark transforms from the raw Outbrain tables to Wide & Deep rows (see
wide_and_deep/README.md, "Preprocessing", for the feature list and the exact rules)."""
from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

DAY_MS = 86_400_000
TRAIN_DAYS = 10
TRAIN_FRACTION = 0.8
HOTNESS = 3
HASH_MULTIPLIER = 2654435761
SEED_MULTIPLIER = 1_000_003
RAW_AD_ID = "_raw_ad_id"  # output rows are ordered by (display, ad) before categorify

L, D, S = T.LongType(), T.DoubleType(), T.StringType()
SCHEMAS = {
    "clicks_train": [("display_id", L), ("ad_id", L), ("clicked", T.IntegerType())],
    "events": [("display_id", L), ("uuid", S), ("document_id", L), ("timestamp", L),
               ("platform", S), ("geo_location", S)],
    "promoted_content": [("ad_id", L), ("document_id", L), ("campaign_id", L),
                         ("advertiser_id", L)],
    "documents_meta": [("document_id", L), ("source_id", L), ("publisher_id", L),
                       ("publish_time", S)],
    "documents_categories": [("document_id", L), ("category_id", L), ("confidence_level", D)],
    "documents_topics": [("document_id", L), ("topic_id", L), ("confidence_level", D)],
    "documents_entities": [("document_id", L), ("entity_id", S), ("confidence_level", D)],
}
REQUIRED_TABLES = ("clicks_train", "events", "promoted_content")
# (multi-hot feature, metadata table, id column)
DOCUMENT_LISTS = [("topic_id_list", "documents_topics", "topic_id"),
                  ("entity_id_list", "documents_entities", "entity_id"),
                  ("category_id_list", "documents_categories", "category_id")]
SIMILARITIES = [("sim_categories", "documents_categories", "category_id"),
                ("sim_topics", "documents_topics", "topic_id"),
                ("sim_entities", "documents_entities", "entity_id")]
CTR_KEYS = ["ad_id", "advertiser_id", "campaign_id", "document_id_promo", "publisher_id_promo",
            "source_id_promo"]
COUNT_KEYS = ["ad_id", "document_id_promo", "publisher_id_promo", "source_id_promo"]


def schema(table: str) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in SCHEMAS[table]])


def joined_rows(t: dict) -> DataFrame:
    """One row per (display, ad) with the event's and the ad's attributes; attributes of
    missing events, ads or documents stay null ("missing")."""
    events = t["events"].select("display_id", "document_id", "timestamp", "platform",
                                "geo_location")
    promo = t["promoted_content"].select(
        "ad_id", F.col("document_id").alias("document_id_promo"), "campaign_id",
        "advertiser_id")
    meta = t["documents_meta"].select("document_id", "source_id", "publisher_id") \
        .dropDuplicates(["document_id"])
    promo_meta = meta.select(F.col("document_id").alias("document_id_promo"),
                             F.col("source_id").alias("source_id_promo"),
                             F.col("publisher_id").alias("publisher_id_promo"))
    geo = F.split(F.col("geo_location"), ">")
    return (t["clicks_train"].withColumn(RAW_AD_ID, F.col("ad_id"))
            .join(events, "display_id", "left")
            .join(promo, "ad_id", "left").join(meta, "document_id", "left")
            .join(promo_meta, "document_id_promo", "left")
            .withColumn("platform", F.when(F.col("platform").isin("1", "2", "3"),
                                           F.col("platform")))
            .withColumn("geo_location_country", geo.getItem(0))
            .withColumn("geo_location_state",
                        F.when(F.size(geo) >= 2, F.concat_ws(">", geo.getItem(0),
                                                             geo.getItem(1)))))


def with_split(rows: DataFrame, seed: int) -> DataFrame:
    """is_train: the display's day (missing timestamp: day 0) is among the first TRAIN_DAYS
    and a multiplicative hash of (display_id, seed) falls in the first TRAIN_FRACTION; the
    same for every row of a display."""
    mixed = F.pmod((F.col("display_id") + F.lit(seed * SEED_MULTIPLIER)) *
                   F.lit(HASH_MULTIPLIER), F.lit(2 ** 32))
    day = F.floor(F.coalesce(F.col("timestamp"), F.lit(0)) / DAY_MS)
    return rows.withColumn("is_train", (day < TRAIN_DAYS) &
                           (mixed < F.lit(int(TRAIN_FRACTION * 2 ** 32))))


def with_rates(rows: DataFrame, min_views: int) -> DataFrame:
    """<key>_ctr = clicks / views of the key over training rows (0 when seen fewer than
    min_views times or never); <key>_count = log(1 + views) / log(1 + max views of any key)."""
    train = rows.where("is_train")
    tops = most_views(train, COUNT_KEYS)
    for key in sorted(set(CTR_KEYS) | set(COUNT_KEYS)):
        stats = train.where(F.col(key).isNotNull()).groupBy(key).agg(
            F.count("*").alias("_views"), F.sum("clicked").alias("_clicks"))
        out = []
        if key in CTR_KEYS:
            out.append(F.when(F.col("_views") >= min_views, F.col("_clicks") / F.col("_views"))
                       .alias(f"{key}_ctr"))
        if key in COUNT_KEYS:
            out.append((F.log1p(F.col("_views")) / F.log1p(F.lit(float(tops.get(key, 1)))))
                       .alias(f"{key}_count"))
        rows = rows.join(F.broadcast(stats.select(key, *out)), key, "left")
    return rows


def most_views(train: DataFrame, keys: list) -> dict:
    """{key: the most training rows of any one value of it} (absent: no value), one job."""
    counts = value_counts(train, [(key, False) for key in keys])
    return dict(counts.groupBy("_feature").agg(F.max("count")).collect())


def value_counts(train: DataFrame, columns: list) -> DataFrame:
    """(_feature, _value, count) of every (name, multi) in columns, from one pass over the
    rows: a feature's values (a list's elements where multi) as strings, nulls left out."""
    def pairs(name, multi):
        values = (F.coalesce(F.col(name), F.array().cast("array<string>")) if multi
                  else F.array(F.col(name).cast("string")))
        return F.transform(values, lambda v: F.struct(F.lit(name).alias("_feature"),
                                                      v.cast("string").alias("_value")))
    every = F.flatten(F.array(*[pairs(name, multi) for name, multi in columns]))
    values = train.select(F.explode(every).alias("_p")).select("_p.*")
    return values.where(F.col("_value").isNotNull()).groupBy("_feature", "_value").count()


def top_values(table: DataFrame, id_col: str) -> DataFrame:
    """document_id -> up to HOTNESS ids by descending confidence (ties: smaller id)."""
    w = Window.partitionBy("document_id").orderBy(F.desc("confidence_level"), F.asc(id_col))
    return (table.groupBy("document_id", id_col)
            .agg(F.max("confidence_level").alias("confidence_level"))
            .withColumn("_r", F.row_number().over(w)).where(F.col("_r") <= HOTNESS)
            .groupBy("document_id")
            .agg(F.sort_array(F.collect_list(
                F.struct("_r", F.col(id_col).cast("string").alias("v")))).alias("_v"))
            .select("document_id", F.col("_v").getField("v").alias("_list")))


def cosine(table: DataFrame, id_col: str, pairs: DataFrame) -> DataFrame:
    """(document_id, document_id_promo) -> cosine of their confidence vectors over id_col
    (duplicate ids: the highest confidence); null when either document has none."""
    t = table.groupBy("document_id", id_col).agg(F.max("confidence_level").alias("c"))
    norms = t.groupBy("document_id").agg(F.sqrt(F.sum(F.col("c") ** 2)).alias("n"))
    p = pairs.select(F.col("document_id").alias("d1"), F.col("document_id_promo").alias("d2"))
    side = {i: t.select(F.col("document_id").alias(f"d{i}"), F.col(id_col).alias("k"),
                        F.col("c").alias(f"c{i}")) for i in (1, 2)}
    norm = {i: norms.select(F.col("document_id").alias(f"d{i}"), F.col("n").alias(f"n{i}"))
            for i in (1, 2)}
    dots = p.join(side[1], "d1").join(side[2], ["d2", "k"]).groupBy("d1", "d2") \
        .agg(F.sum(F.col("c1") * F.col("c2")).alias("dot"))
    return (p.join(norm[1], "d1").join(norm[2], "d2").join(dots, ["d1", "d2"], "left")
            .select(F.col("d1").alias("document_id"), F.col("d2").alias("document_id_promo"),
                    (F.coalesce(F.col("dot"), F.lit(0.0)) / (F.col("n1") * F.col("n2")))
                    .alias("sim")))


def with_documents(rows: DataFrame, t: dict) -> DataFrame:
    pairs = rows.select("document_id", "document_id_promo").where(
        F.col("document_id").isNotNull() & F.col("document_id_promo").isNotNull()).distinct()
    for name, table, id_col in SIMILARITIES:
        sims = cosine(t[table], id_col, pairs).withColumnRenamed("sim", name)
        rows = rows.join(sims, ["document_id", "document_id_promo"], "left")
    for name, table, id_col in DOCUMENT_LISTS:
        lists = top_values(t[table], id_col).withColumnRenamed("_list", name)
        rows = rows.join(lists, "document_id", "left")
    return rows


def vocabularies(rows: DataFrame, columns: list, threshold: int) -> DataFrame:
    """(_feature, _value, _id) of every (name, cardinality, multi) in columns, from one pass
    over the training rows (value_counts): per feature, id 1.. by descending training count
    (ties: smaller string), for values seen >= threshold times, at most cardinality - 1 of
    them; everything else is 0."""
    counts = value_counts(rows.where("is_train"), [(name, multi) for name, _, multi in columns])
    caps = F.create_map(*[F.lit(v) for name, cap, _ in columns for v in (name, cap)])
    w = Window.partitionBy("_feature").orderBy(F.desc("count"), F.asc("_value"))
    return counts.where(F.col("count") >= threshold) \
        .withColumn("_id", F.row_number().over(w).cast("long")) \
        .where(F.col("_id") < caps[F.col("_feature")]).select("_feature", "_value", "_id")


def categorify(rows: DataFrame, column: str, vocab: DataFrame) -> DataFrame:
    key = F.col(column).cast("string")
    v = F.broadcast(vocab.withColumnRenamed("_value", "_key"))
    return rows.withColumn("_key", key).join(v, "_key", "left").drop("_key", column) \
        .withColumn(column, F.coalesce(F.col("_id"), F.lit(0)).cast("long")).drop("_id")


def categorify_list(rows: DataFrame, column: str, vocab: DataFrame) -> DataFrame:
    """Each document's list mapped element-wise (order kept); no list: an empty one."""
    docs = rows.select("document_id", column).where(F.col(column).isNotNull()) \
        .dropDuplicates(["document_id"])
    items = docs.select("document_id", F.posexplode(column).alias("_pos", "_value"))
    mapped = (items.join(F.broadcast(vocab), "_value", "left")
              .groupBy("document_id")
              .agg(F.sort_array(F.collect_list(F.struct(
                  "_pos", F.coalesce(F.col("_id"), F.lit(0)).cast("long").alias("v"))))
                  .alias("_s"))
              .select("document_id", F.col("_s").getField("v").alias(column)))
    return rows.drop(column).join(mapped, "document_id", "left").withColumn(
        column, F.coalesce(F.col(column), F.array().cast("array<bigint>")))
