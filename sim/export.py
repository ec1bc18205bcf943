"""A SavedModel of a trained SIM/DIEN/DIN: the serving signature takes the raw features of
the spec (ids 1..cardinality; histories [n, d] left-padded with 0, most recent last) and
returns click probabilities (training/export.py writes it)."""
from __future__ import annotations

import tensorflow as tf

from sim.contract import NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL

CHANNELS = {"user": USER_CHANNEL, "target": TARGET_CHANNEL, "positive": POSITIVE_CHANNEL,
            "negative": NEGATIVE_CHANNEL}


def serving(model, spec) -> tuple:
    """(probabilities function, input signature) for training.export.export_saved_model."""
    signature = {f: tf.TensorSpec([None] if spec.dimension(f) is None
                                  else [None, spec.dimension(f)], tf.int64, name=f)
                 for c in CHANNELS.values() for f in spec.channel(c)}

    def probabilities(features):
        inputs = {k: [features[f] for f in spec.channel(c)] for k, c in CHANNELS.items()}
        logit, _, _ = model.forward(model.lookup(inputs, training=False))
        return tf.sigmoid(logit)

    return probabilities, [signature]
