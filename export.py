"""--mode deploy: a SavedModel whose serving signature takes raw features (numerical [n, k]
float32, categorical [n, tables] int64) and returns click probabilities and
`out_of_range_ids`, the batch's count of ids outside their static table (negative or >= its
cardinality), which read row 0 instead of failing the batch; a dynamic table's unknown ids
read its rare row 0 and are not counted (training/export.py writes it)."""
from __future__ import annotations

import tensorflow as tf

from dataloader import id_dtype
from training.export import ids_in_range


def serving(model, spec) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""
    if model.comm.size != 1:
        raise ValueError("export needs the whole model in one process")
    cardinalities = list(model.config.cardinalities)
    dynamic = model.config.dynamic or [None] * len(cardinalities)
    # a dynamic table maps any int64 id itself (an unknown one reads its rare row)
    id_dtypes = [tf.int64 if d else id_dtype(c) for c, d in zip(cardinalities, dynamic)]

    def probabilities(numerical, categorical):
        checked = [(categorical[:, t], tf.constant(0, tf.int64)) if dynamic[t] else
                   ids_in_range(categorical[:, t], card - 1)
                   for t, card in enumerate(cardinalities)]
        ids = [tf.cast(c[0], dt) for c, dt in zip(checked, id_dtypes)]
        return {"probabilities": tf.sigmoid(model(numerical, ids, tf.shape(categorical)[0])),
                "out_of_range_ids": tf.add_n([c[1] for c in checked])}

    signature = [tf.TensorSpec([None, len(spec.numerical_features)], tf.float32,
                               name="numerical"),
                 tf.TensorSpec([None, len(id_dtypes)], tf.int64, name="categorical")]
    return probabilities, signature
