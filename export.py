"""--mode deploy: a SavedModel whose serving signature takes raw features (numerical [n, k]
float32, categorical [n, tables] int64) and returns click probabilities (training/export.py
writes it)."""
from __future__ import annotations

import tensorflow as tf

from dataloader import id_dtype


def serving(model, spec) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""
    if model.comm.size != 1:
        raise ValueError("export needs the whole model in one process")
    # a dynamic table maps any int64 id itself
    id_dtypes = [tf.int64 if d else id_dtype(c)
                 for c, d in zip(model.config.cardinalities, model.config.dynamic or
                                 [None] * len(model.config.cardinalities))]

    def probabilities(numerical, categorical):
        ids = [tf.cast(categorical[:, t], dt) for t, dt in enumerate(id_dtypes)]
        return tf.sigmoid(model(numerical, ids, tf.shape(categorical)[0]))

    signature = [tf.TensorSpec([None, len(spec.numerical_features)], tf.float32,
                               name="numerical"),
                 tf.TensorSpec([None, len(id_dtypes)], tf.int64, name="categorical")]
    return probabilities, signature
