"""The SIM data layout written by sim.synthetic and sim.preproc: feature names, the spec,
and the column arrays the core ColumnarWriter takes.

Histories are stored oldest first, left-aligned; values after a row's length are padding.
Feature i of the target item, the positive history and the negative history share an
embedding table (item id, then category id).
"""
from __future__ import annotations

import numpy as np

from feature_spec import FeatureSpec
from sim.contract import (NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL)

USER = "user_id"
ITEM, CATEGORY = "item_id", "cat_id"
POSITIVE = ("hist_item_id", "hist_cat_id")
NEGATIVE = ("neg_hist_item_id", "neg_hist_cat_id")
LABEL = "label"


def sim_spec(users: int, items: int, categories: int, history_length: int,
             metadata: dict = None) -> FeatureSpec:
    """The spec (without source_spec: the writer fills it in) for these cardinalities."""
    def cat(n, dims=None):
        out = {"dtype": "int64", "cardinality": int(n)}
        if dims:
            out["dimensions"] = [int(dims)]
        return out

    features = {USER: cat(users), ITEM: cat(items), CATEGORY: cat(categories)}
    for names in (POSITIVE, NEGATIVE):
        features[names[0]] = cat(items, history_length)
        features[names[1]] = cat(categories, history_length)
    features[LABEL] = {"dtype": "int8"}
    channels = {USER_CHANNEL: [USER], TARGET_CHANNEL: [ITEM, CATEGORY],
                POSITIVE_CHANNEL: list(POSITIVE), NEGATIVE_CHANNEL: list(NEGATIVE),
                "label": [LABEL]}
    return FeatureSpec(feature_spec=features, source_spec={}, channel_spec=channels,
                       metadata=dict(metadata or {}))


def columns(user, item, category, hist_item, hist_cat, neg_item, neg_cat, lengths,
            label) -> dict:
    """Column dict for ColumnarWriter.write: scalars [n]; histories as (values [n, d],
    lengths [n]) with zeros after each length."""
    lengths = np.asarray(lengths, np.int64)
    valid = np.arange(np.shape(hist_item)[1])[None, :] < lengths[:, None]

    def seq(values):
        return np.where(valid, values, 0).astype(np.int64), lengths

    return {USER: np.asarray(user, np.int64), ITEM: np.asarray(item, np.int64),
            CATEGORY: np.asarray(category, np.int64),
            POSITIVE[0]: seq(hist_item), POSITIVE[1]: seq(hist_cat),
            NEGATIVE[0]: seq(neg_item), NEGATIVE[1]: seq(neg_cat),
            LABEL: np.asarray(label, np.int8)}
