"""SavedModel for serving: raw features in (one-hot ids [n], multi-hot ids [n, d] with
`<name>__length` [n], numerical [n]), click probabilities out (training/export.py stages it)."""
from __future__ import annotations

import tensorflow as tf

from datasets import length_key
from training.export import export_saved_model as export_staged


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


def export_saved_model(model, output_path: str) -> None:
    export_staged(model, lambda features: tf.sigmoid(model(features)),
                  [serving_signature(model.config)], output_path, "wide_deep_serving")
