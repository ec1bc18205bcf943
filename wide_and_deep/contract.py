"""The Wide & Deep family's data: the channels it reads from a FeatureSpec (parquet data),
the Outbrain-shaped FeatureSpec of the reference model, custom shapes, and embedding
sizes (per feature: spec metadata `embedding_sizes`, overridden by --embedding_sizes_file)."""
from __future__ import annotations

import json
import os

import yaml

from core.feature_spec import (COLUMNAR_NUMERICAL_DTYPES, LABEL_CHANNEL, NUMERICAL_CHANNEL,
                               PARQUET, TEST_MAPPING, ChannelContract, ChannelRule, FeatureSpec,
                               FeatureSpecError, narrowest_int_dtype)

ONEHOT_CHANNEL = "onehot_categorical"
MULTIHOT_CHANNEL = "multihot_categorical"
MAP_CHANNEL = "map"

WIDE_DEEP_CONTRACT = ChannelContract(
    model="Wide & Deep", chunk_types=(PARQUET,),
    channels={ONEHOT_CHANNEL: ChannelRule("categorical"),
              MULTIHOT_CHANNEL: ChannelRule("categorical", shape="multi"),
              NUMERICAL_CHANNEL: ChannelRule("numerical", dtypes=COLUMNAR_NUMERICAL_DTYPES),
              LABEL_CHANNEL: ChannelRule("label", 1, 1),
              # the display id that groups test rows for MAP@12; read from the test data only
              MAP_CHANNEL: ChannelRule("id", 0, 1, mappings=(TEST_MAPPING,))},
    required_channels=(LABEL_CHANNEL,),
    nonempty_any=(ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL))


LABEL = "clicked"
DISPLAY_ID = "display_id"
MULTIHOT_HOTNESS = 3
DEFAULT_EMBEDDING_DIM = 64
EMBEDDING_SIZES_KEY = "embedding_sizes"
# Features constant within a display (the page view), the others vary per ad; only the
# synthetic generator reads this.
REQUEST_FEATURES_KEY = "request_features"

# (name, embedding dim, cardinality) in the reference's order.
REQUEST_ONEHOT = [("document_id", 128, 300000), ("platform", 19, 4),
                  ("document_id_promo", 128, 100000), ("source_id", 64, 4000),
                  ("publisher_id", 64, 1000), ("geo_location", 64, 2500),
                  ("geo_location_country", 64, 300), ("geo_location_state", 64, 2000)]
REQUEST_MULTIHOT = [("topic_id_list", 64, 350), ("entity_id_list", 64, 10000),
                    ("category_id_list", 64, 100)]
ITEM_ONEHOT = [("ad_id", 128, 250000), ("advertiser_id", 64, 2500),
               ("source_id_promo", 64, 4000), ("publisher_id_promo", 64, 1000),
               ("campaign_id", 128, 5000)]
NUMERICAL = ["ad_id_count", "ad_id_ctr", "advertiser_id_ctr", "campaign_id_ctr",
             "document_id_promo_count", "document_id_promo_ctr", "publisher_id_promo_count",
             "publisher_id_promo_ctr", "source_id_promo_count", "source_id_promo_ctr",
             "sim_categories", "sim_topics", "sim_entities"]
# document_id_promo is listed with the request features (the reference's shape order) but
# is the ad's landing page, so it varies per ad.
PER_DISPLAY = [n for n, _, _ in REQUEST_ONEHOT if n != "document_id_promo"] + \
    [n for n, _, _ in REQUEST_MULTIHOT]


def build_spec(onehot, multihot, numerical, request_features=(), hotness=MULTIHOT_HOTNESS):
    """A spec without files: onehot/multihot are (name, dim, cardinality) lists."""
    fs, sizes = {}, {}
    for name, dim, card in onehot:
        fs[name] = {"dtype": narrowest_int_dtype(card), "cardinality": int(card)}
        sizes[name] = int(dim)
    for name, dim, card in multihot:
        fs[name] = {"dtype": narrowest_int_dtype(card), "cardinality": int(card),
                    "dimensions": [hotness]}
        sizes[name] = int(dim)
    for name in numerical:
        fs[name] = {"dtype": "float32"}
    fs[LABEL] = {"dtype": "int8"}
    fs[DISPLAY_ID] = {"dtype": "int64"}
    channels = {ONEHOT_CHANNEL: [n for n, _, _ in onehot],
                MULTIHOT_CHANNEL: [n for n, _, _ in multihot], "numerical": list(numerical),
                "label": [LABEL], MAP_CHANNEL: [DISPLAY_ID]}
    return FeatureSpec(feature_spec=fs, source_spec={}, channel_spec=channels,
                       metadata={EMBEDDING_SIZES_KEY: sizes,
                                 REQUEST_FEATURES_KEY: list(request_features)})


def reference_spec(scale: float = 1.0) -> FeatureSpec:
    """The reference shape (~92 M parameters at scale 1); cardinalities times `scale`, each
    at least 2."""
    def scaled(rows):
        return [(n, d, max(2, int(round(c * scale)))) for n, d, c in rows]
    return build_spec(scaled(REQUEST_ONEHOT + ITEM_ONEHOT), scaled(REQUEST_MULTIHOT), NUMERICAL,
                      PER_DISPLAY)


def embedding_dims(spec: FeatureSpec, sizes_file: str = None) -> dict:
    """name -> embedding dim for every categorical feature: the file's entry, else the spec's
    metadata, else DEFAULT_EMBEDDING_DIM."""
    sizes = dict(spec.metadata.get(EMBEDDING_SIZES_KEY) or {})
    if sizes_file:
        sizes.update(read_sizes_file(sizes_file))
    out = {}
    for name in spec.channel(ONEHOT_CHANNEL) + spec.channel(MULTIHOT_CHANNEL):
        dim = sizes.get(name, DEFAULT_EMBEDDING_DIM)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise FeatureSpecError(f"embedding size of '{name}' must be a positive integer, "
                                   f"found {dim!r}")
        out[name] = dim
    return out


def read_sizes_file(path: str) -> dict:
    if not os.path.isfile(path):
        raise FeatureSpecError(f"--embedding_sizes_file {path}: no such file")
    with open(path) as f:
        sizes = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    if not isinstance(sizes, dict):
        raise FeatureSpecError(f"--embedding_sizes_file {path}: expected a mapping "
                               f"feature name -> dimension, found {type(sizes).__name__}")
    return sizes
