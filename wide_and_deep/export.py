"""SavedModel for serving: raw features in (one-hot ids [n], multi-hot ids [n, d] with
`<name>__length` [n], numerical [n]), click probabilities out. Written to a temp directory
and renamed into place."""
from __future__ import annotations

import tensorflow as tf

from datasets import StagedDirectory, length_key


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


class ServingModel(tf.Module):
    def __init__(self, model):
        super().__init__(name="wide_deep_serving")
        self.model = model
        self.serve = tf.function(self._serve, input_signature=[serving_signature(model.config)])

    def _serve(self, features):
        return {"probabilities": tf.sigmoid(self.model(features))}


def export_saved_model(model, output_path: str) -> None:
    serving = ServingModel(model)
    with StagedDirectory(output_path, overwrite=True) as staged:
        tf.saved_model.save(serving, staged.tmp_dir,
                            signatures={"serving_default": serving.serve})
