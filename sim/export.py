"""A SavedModel of a trained SIM/DIEN/DIN: the serving signature takes the raw features of
the spec (ids 1..cardinality; histories [n, d] left-padded with 0, most recent last) and
returns click probabilities, and `out_of_range_ids`: the batch's count of ids outside
0..cardinality, each read as the padding id 0 (a history entry becomes padding) instead of
failing the batch (training/export.py writes it)."""
from __future__ import annotations

import tensorflow as tf

from sim.contract import NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL
from training.export import ids_in_range

CHANNELS = {"user": USER_CHANNEL, "target": TARGET_CHANNEL, "positive": POSITIVE_CHANNEL,
            "negative": NEGATIVE_CHANNEL}


def serving(model, spec) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""
    signature = {f: tf.TensorSpec([None] if spec.dimension(f) is None
                                  else [None, spec.dimension(f)], tf.int64, name=f)
                 for c in CHANNELS.values() for f in spec.channel(c)}

    def probabilities(features):
        # a dynamic feature's map reads an unknown id from row 0 itself: nothing to replace
        checked = {f: (ids, tf.constant(0, tf.int64)) if spec.dynamic(f) else
                   ids_in_range(ids, spec.id_limit(f)) for f, ids in features.items()}
        inputs = {k: [checked[f][0] for f in spec.channel(c)] for k, c in CHANNELS.items()}
        logit, _, _ = model.forward(model.lookup(inputs, training=False))
        return {"probabilities": tf.sigmoid(logit),
                "out_of_range_ids": tf.add_n([count for _, count in checked.values()])}

    return probabilities, [signature]
