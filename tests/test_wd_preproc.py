"""Outbrain preprocessing (Spark) on the real sample rows plus small generated metadata
tables, every output column checked against an independent pandas computation."""
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import require_or_skip

REAL = "/work/shared/data/outbrain"
SEED, THRESHOLD, MIN_VIEWS = 3, 2, 2


def write_metadata(raw, rng):
    events = pd.read_csv(os.path.join(REAL, "events.csv"))
    promo = pd.read_csv(os.path.join(REAL, "promoted_content.csv"))
    docs = np.unique(np.r_[events.document_id.to_numpy()[::3], promo.document_id.to_numpy()[::2]])
    pd.DataFrame({"document_id": docs, "source_id": rng.integers(1, 30, docs.size),
                  "publisher_id": rng.integers(1, 20, docs.size),
                  "publish_time": "2016-01-01 00:00:00"}).to_csv(
        os.path.join(raw, "documents_meta.csv"), index=False)
    for table, col, n_ids in (("categories", "category_id", 12), ("topics", "topic_id", 25),
                              ("entities", "entity_id", 15)):
        picked = rng.choice(docs, docs.size // 2, replace=False)
        rows = [(d, i, round(float(rng.random()), 3)) for d in picked
                for i in rng.choice(n_ids, rng.integers(1, 5), replace=False)]
        df = pd.DataFrame(rows, columns=["document_id", col, "confidence_level"])
        if col == "entity_id":
            df[col] = "e" + df[col].astype(str)
        df.to_csv(os.path.join(raw, f"documents_{table}.csv"), index=False)


def as_text(series):
    return series.map(lambda v: None if pd.isna(v) else str(int(v)) if not isinstance(v, str)
                      else v)


def vocab_ids(train_values, values):
    counts = pd.Series([v for v in train_values if v is not None]).value_counts()
    counts = counts[counts >= THRESHOLD]
    order = sorted(counts.index, key=lambda v: (-counts[v], v))
    ids = {v: i + 1 for i, v in enumerate(order)}
    return [ids.get(v, 0) for v in values], len(ids) + 1


def expected(raw):
    read = lambda n: pd.read_csv(os.path.join(raw, f"{n}.csv"))  # noqa: E731
    ev, promo, meta = read("events"), read("promoted_content"), read("documents_meta")
    df = read("clicks_train").merge(ev.drop(columns="uuid"), on="display_id", how="left")
    df = df.merge(promo.rename(columns={"document_id": "document_id_promo"}), on="ad_id",
                  how="left")
    df = df.merge(meta[["document_id", "source_id", "publisher_id"]], on="document_id",
                  how="left")
    df = df.merge(meta.rename(columns={"document_id": "document_id_promo",
                                       "source_id": "source_id_promo",
                                       "publisher_id": "publisher_id_promo"})
                  [["document_id_promo", "source_id_promo", "publisher_id_promo"]],
                  on="document_id_promo", how="left")
    df = df.sort_values(["display_id", "ad_id"]).reset_index(drop=True)
    mixed = ((df.display_id + SEED * 1000003) * 2654435761) % 2 ** 32
    day = df.timestamp.fillna(0) // 86400000
    df["is_train"] = (day < 10) & (mixed < int(0.8 * 2 ** 32))
    parts = df.geo_location.fillna("").str.split(">")
    df["geo_location_country"] = df.geo_location.str.split(">").str[0]
    df["geo_location_state"] = [">".join(p[:2]) if len(p) >= 2 else None for p in parts]
    df["platform"] = df.platform.where(df.platform.isin([1, 2, 3]))
    train = df[df.is_train]
    for key in ["ad_id", "advertiser_id", "campaign_id", "document_id_promo",
                "publisher_id_promo", "source_id_promo"]:
        stats = train.groupby(key).clicked.agg(["size", "sum"])
        ctr = (stats["sum"] / stats["size"]).where(stats["size"] >= MIN_VIEWS, 0.0)
        df[f"{key}_ctr"] = df[key].map(ctr).fillna(0.0)
        if key in ("ad_id", "document_id_promo", "publisher_id_promo", "source_id_promo"):
            count = np.log1p(stats["size"]) / np.log1p(stats["size"].max())
            df[f"{key}_count"] = df[key].map(count).fillna(0.0)
    for name, table, col in (("categories", "documents_categories", "category_id"),
                             ("topics", "documents_topics", "topic_id"),
                             ("entities", "documents_entities", "entity_id")):
        t = read(table).groupby(["document_id", col]).confidence_level.max().reset_index()
        vec = {d: dict(zip(g[col], g.confidence_level)) for d, g in t.groupby("document_id")}

        def cos(a, b):
            if a not in vec or b not in vec:
                return 0.0
            dot = sum(c * vec[b].get(k, 0.0) for k, c in vec[a].items())
            norm = np.linalg.norm(list(vec[a].values())) * np.linalg.norm(list(vec[b].values()))
            return dot / norm if norm > 0 else 0.0
        df[f"sim_{name}"] = [cos(a, b) for a, b in zip(df.document_id, df.document_id_promo)]
        top = {d: [str(v) for v in g.sort_values(["confidence_level", col],
                                                 ascending=[False, True])[col][:3]]
               for d, g in t.groupby("document_id")}
        df[f"{col.replace('_id', '')}_id_list"] = [top.get(d, []) for d in df.document_id]
    train = df[df.is_train]
    cards = {}
    for name in ["topic_id_list", "entity_id_list", "category_id_list"]:
        flat = [v for lst in train[name] for v in lst]
        ids = dict(zip(flat, vocab_ids(flat, flat)[0]))
        cards[name] = vocab_ids(flat, [])[1]
        df[name] = [[ids.get(v, 0) for v in lst] for lst in df[name]]
    for name in ["document_id", "platform", "document_id_promo", "source_id", "publisher_id",
                 "geo_location", "geo_location_country", "geo_location_state", "ad_id",
                 "advertiser_id", "source_id_promo", "publisher_id_promo", "campaign_id"]:
        text = as_text(df[name])
        df[name], cards[name] = vocab_ids(text[df.is_train].tolist(), text.tolist())
    return df, cards


def prepare(raw, out, master="local[2]", partitions=2):
    """The job in this process: each run starts its Spark session and stops it, on the JVM
    that pyspark keeps for the process (its start-up and warm-up paid once)."""
    from pyspark.sql import SparkSession

    from wide_and_deep.preproc import prepare_dataset
    # a session left active would be reused by the job, with its master, not `master`
    assert SparkSession.getActiveSession() is None
    assert prepare_dataset.main(
        ["--outbrain_path", str(raw), "--output_path", str(out), "--seed", str(SEED),
         "--frequency_threshold", str(THRESHOLD), "--ctr_min_views", str(MIN_VIEWS),
         "--shuffle_partitions", str(partitions), "--master", master]) == 0
    return str(out)


def copy_required_tables(raw):
    raw.mkdir()
    for name in ("clicks_train", "events", "promoted_content"):
        shutil.copy(os.path.join(REAL, f"{name}.csv"), raw)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    require_or_skip(shutil.which("java") is not None, "Java (for Spark) not installed")
    root = tmp_path_factory.mktemp("ob")
    raw = root / "raw"
    copy_required_tables(raw)
    write_metadata(str(raw), np.random.default_rng(0))
    return str(raw), prepare(raw, root / "out")


def read_output(out):
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml"))
    return spec, {m: pd.read_parquet(os.path.join(out, m)).reset_index(drop=True)
                  for m in ("train", "test")}


def test_every_column_matches_pandas(prepared):
    from core.feature_spec import FeatureSpec
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    raw, out = prepared
    want, cards = expected(raw)
    spec = FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml")).validate(
        WIDE_DEEP_CONTRACT)
    for mapping, rows in (("train", want[want.is_train]), ("test", want[~want.is_train])):
        got = pd.read_parquet(os.path.join(out, mapping)).reset_index(drop=True)
        rows = rows.reset_index(drop=True)
        assert len(got) == len(rows) and spec.metadata["rows"][mapping] == len(rows)
        for col in got.columns:
            if col.endswith("_list"):
                assert [list(v) for v in got[col]] == rows[col].tolist(), col
            elif got[col].dtype.kind == "f":
                np.testing.assert_allclose(got[col], rows[col].astype(float), rtol=1e-5,
                                           atol=1e-6, err_msg=col)
            else:
                np.testing.assert_array_equal(got[col], rows[col].astype(np.int64),
                                              err_msg=col)
    assert {f: spec.cardinality(f) for f in cards} == {f: max(2, c) for f, c in cards.items()}
    # the split keeps displays whole: no test display has a training row
    train_displays = set(want[want.is_train].display_id)
    assert not train_displays & set(pd.read_parquet(os.path.join(out, "test")).display_id)


def test_output_does_not_depend_on_parallelism(prepared, tmp_path):
    """One core and 3 shuffle partitions give the rows, values and spec of two cores and 2."""
    raw, out = prepared
    again = prepare(raw, tmp_path / "again", master="local[1]", partitions=3)
    (spec_a, frames_a), (spec_b, frames_b) = read_output(out), read_output(again)
    for mapping in frames_a:
        pd.testing.assert_frame_equal(frames_a[mapping], frames_b[mapping])
    assert spec_a.feature_spec == spec_b.feature_spec
    assert spec_a.metadata == spec_b.metadata


METADATA_FEATURES = ["source_id", "publisher_id", "source_id_promo", "publisher_id_promo"]


def from_metadata(col):
    base = col.removesuffix("_ctr").removesuffix("_count")
    return col.startswith("sim_") or base in METADATA_FEATURES


def test_missing_metadata_tables_give_the_missing_values(prepared, tmp_path):
    """Without the four documents_* tables every feature drawn from them is 0 (ids, rates,
    similarities) or empty (lists); every other column is the full run's."""
    _, out = prepared
    raw = tmp_path / "raw"
    copy_required_tables(raw)
    spec_bare, bare = read_output(prepare(raw, tmp_path / "bare"))
    _, full = read_output(out)
    for mapping, frame in bare.items():
        assert len(frame) == len(full[mapping])
        for col in frame.columns:
            if col.endswith("_list"):
                assert all(len(v) == 0 for v in frame[col]), col
            elif from_metadata(col):
                assert (frame[col] == 0).all(), col
            else:
                pd.testing.assert_series_equal(frame[col], full[mapping][col])
    assert all(spec_bare.cardinality(f) == 2 for f in METADATA_FEATURES)
