"""The SIM family's data: the channels SIM, DIN and DIEN read from a FeatureSpec (TFRecord
data), and the layout sim.synthetic and sim.preproc write (feature names, the spec, the column
arrays the core ColumnarWriter takes).

NVIDIA's SIM convention, which its tools read and write: ids run 1..cardinality and 0 is
padding (tables have cardinality + 1 rows, masks are id > 0); every history has the spec's
fixed length, left-padded with 0, most recent behaviour last. Feature i of the target item,
the positive history and the negative history share an embedding table (item id, then
category id).
"""
from __future__ import annotations

import numpy as np

from core.feature_spec import (LABEL_CHANNEL, TFRECORD, ChannelContract, ChannelRule,
                               FeatureSpec, FeatureSpecError)

USER_CHANNEL = "user_features"
TARGET_CHANNEL = "target_item_features"
POSITIVE_CHANNEL = "positive_history"
NEGATIVE_CHANNEL = "negative_history"


def _check_item_channels(spec) -> None:
    """Target item and both histories describe the same item features in the same order:
    feature i of each looks up table i, so counts and cardinalities must agree, and the two
    histories must be equally long."""
    target = spec.channel(TARGET_CHANNEL)
    for channel in (POSITIVE_CHANNEL, NEGATIVE_CHANNEL):
        history = spec.channel(channel)
        if len(history) != len(target):
            raise FeatureSpecError(f"channel_spec: '{channel}' lists {len(history)} features "
                                   f"{history} but '{TARGET_CHANNEL}' lists {len(target)} "
                                   f"{target}; they must match one to one (shared tables)")
        for item_feature, history_feature in zip(target, history):
            if spec.cardinality(item_feature) != spec.cardinality(history_feature):
                raise FeatureSpecError(
                    f"feature '{history_feature}' of '{channel}' has cardinality "
                    f"{spec.cardinality(history_feature)} but shares its table with "
                    f"'{item_feature}' of cardinality {spec.cardinality(item_feature)}")
    lengths = {f: spec.dimension(f)
               for f in spec.channel(POSITIVE_CHANNEL) + spec.channel(NEGATIVE_CHANNEL)}
    if len(set(lengths.values())) > 1:
        raise FeatureSpecError(f"history features must share one length (dimensions), found "
                               f"{lengths}")


SIM_CONTRACT = ChannelContract(
    model="SIM", chunk_types=(TFRECORD,),
    channels={USER_CHANNEL: ChannelRule("categorical"),
              TARGET_CHANNEL: ChannelRule("categorical", 1),
              POSITIVE_CHANNEL: ChannelRule("categorical", 1, shape="multi"),
              NEGATIVE_CHANNEL: ChannelRule("categorical", 1, shape="multi"),
              LABEL_CHANNEL: ChannelRule("label", 1, 1)},
    required_channels=(LABEL_CHANNEL, TARGET_CHANNEL, POSITIVE_CHANNEL, NEGATIVE_CHANNEL),
    check_spec=_check_item_channels, ids_from_one=True)


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


def left_padded(histories, width: int) -> np.ndarray:
    """Histories (oldest first) -> [n, width] left-padded with 0, most recent last. Accepts
    per-row sequences or a (left-aligned values [n, d], lengths [n]) pair."""
    if isinstance(histories, tuple):
        values, lengths = np.asarray(histories[0], np.int64), np.asarray(histories[1], np.int64)
    else:
        lengths = np.array([len(h) for h in histories], np.int64)
        values = np.zeros((lengths.size, width), np.int64)
        values[np.arange(width)[None, :] < lengths[:, None]] = np.concatenate(
            [np.asarray(h, np.int64).reshape(-1) for h in histories] + [np.zeros(0, np.int64)])
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a history has {lengths.max()} behaviours, more than {width}")
    # position p of the output holds behaviour p - (width - length) of the row
    source = np.arange(width)[None, :] - (width - lengths)[:, None]
    out = np.take_along_axis(values, np.maximum(source, 0), axis=1) if values.size else \
        np.zeros((lengths.size, width), np.int64)
    return np.where(source >= 0, out, 0)


def columns(user, item, category, hist_item, hist_cat, neg_item, neg_cat, label,
            history_length: int) -> dict:
    """Column dict for ColumnarWriter.write (ids 1..cardinality): scalars [n]; histories
    as per-row sequences or (left-aligned values, lengths), written left-padded to
    history_length."""
    def seq(histories):
        padded = left_padded(histories, history_length)
        return padded, np.full(padded.shape[0], history_length, np.int64)

    return {USER: np.asarray(user, np.int64), ITEM: np.asarray(item, np.int64),
            CATEGORY: np.asarray(category, np.int64),
            POSITIVE[0]: seq(hist_item), POSITIVE[1]: seq(hist_cat),
            NEGATIVE[0]: seq(neg_item), NEGATIVE[1]: seq(neg_cat),
            LABEL: np.asarray(label, np.int8)}
