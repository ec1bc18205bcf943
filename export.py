"""--mode deploy: a SavedModel whose serving signature takes raw features and returns click
probabilities. Written to a temp directory and renamed into place."""
from __future__ import annotations

import os
import shutil

import tensorflow as tf

from dataloader import id_dtype


class ServingModel(tf.Module):
    def __init__(self, model, num_numerical: int):
        super().__init__(name="serving")
        self.model = model
        cardinalities = model.config.cardinalities
        self.id_dtypes = [id_dtype(c) for c in cardinalities]
        signature = [tf.TensorSpec([None, num_numerical], tf.float32, name="numerical"),
                     tf.TensorSpec([None, len(cardinalities)], tf.int64, name="categorical")]
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, numerical, categorical):
        rows = tf.shape(categorical)[0]
        ids = [tf.cast(categorical[:, t], dt) for t, dt in enumerate(self.id_dtypes)]
        logits = self.model(numerical, ids, rows)
        return {"probabilities": tf.sigmoid(logits)}


def export_saved_model(model, spec, output_path: str) -> None:
    if model.comm.size != 1:
        raise ValueError("export needs the whole model in one process")
    output_path = os.path.abspath(output_path)
    serving = ServingModel(model, len(spec.numerical_features))
    tmp = output_path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tf.saved_model.save(serving, tmp, signatures={"serving_default": serving.serve})
    if os.path.exists(output_path):
        shutil.rmtree(output_path)
    os.rename(tmp, output_path)
