"""SavedModel for serving: raw features in (one-hot ids [n], multi-hot ids [n, d] with
`<name>__length` [n], numerical [n]), click probabilities out (training/export.py writes it)."""
from __future__ import annotations

import tensorflow as tf

from core.sources import length_key


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


def serving(model) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""
    return (lambda features: tf.sigmoid(model(features))), [serving_signature(model.config)]
