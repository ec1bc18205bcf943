"""SavedModel for serving: raw features in (one-hot ids [n], multi-hot ids [n, d] with
`<name>__length` [n], numerical [n]), click probabilities out, and `out_of_range_ids`: the
batch's count of ids outside their table (negative or >= its cardinality; a multi-hot row's
first `length` values), which read row 0 instead of failing the batch. A multi-hot length
outside [0, d] fails the call with a message naming the feature (training/export.py writes
it)."""
from __future__ import annotations

import tensorflow as tf

from core.sources import length_key
from training.export import ids_in_range


def serving_signature(config) -> dict:
    spec = {}
    for t in config.tables:
        if t.hotness is None:
            spec[t.name] = tf.TensorSpec([None], tf.int64, name=t.name)
        else:
            spec[t.name] = tf.TensorSpec([None, t.hotness], tf.int64, name=t.name)
            spec[length_key(t.name)] = tf.TensorSpec([None], tf.int32, name=length_key(t.name))
    for name in config.numerical:
        spec[name] = tf.TensorSpec([None], tf.float32, name=name)
    return spec


def checked_features(config, features: dict) -> tuple:
    """(features with out-of-range ids replaced, their count); a multi-hot length above its
    hotness (or negative) is an error naming the feature."""
    features, counts = dict(features), []
    for t in config.tables:
        counted = None
        if t.hotness is not None:
            lengths = features[length_key(t.name)]
            tf.debugging.assert_less_equal(
                lengths, t.hotness, message=f"feature {t.name}: a length above its hotness "
                                            f"{t.hotness}")
            tf.debugging.assert_non_negative(
                lengths, message=f"feature {t.name}: a negative length")
            counted = tf.sequence_mask(lengths, t.hotness)
        if not t.dynamic:  # a dynamic table reads an unknown id from its rare row itself
            features[t.name], count = ids_in_range(features[t.name], t.cardinality - 1,
                                                   counted)
            counts.append(count)
    return features, tf.add_n(counts) if counts else tf.constant(0, tf.int64)


def serving(model) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""

    def probabilities(features):
        features, out_of_range = checked_features(model.config, features)
        return {"probabilities": tf.sigmoid(model(features)), "out_of_range_ids": out_of_range}

    return probabilities, [serving_signature(model.config)]
