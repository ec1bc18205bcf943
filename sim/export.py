"""A SavedModel of a trained SIM/DIEN/DIN: the serving signature takes the raw features of
the spec (ids 1..cardinality; histories [n, d] left-padded with 0, most recent last) and
returns click probabilities. Written into a staged directory renamed into place."""
from __future__ import annotations

import tensorflow as tf

from sim.contract import NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL


class ServingModel(tf.Module):
    def __init__(self, model, spec):
        super().__init__(name="sim_serving")
        self.model, self.spec = model, spec
        signature = {f: tf.TensorSpec([None] if spec.dimension(f) is None
                                      else [None, spec.dimension(f)], tf.int64, name=f)
                     for c in (USER_CHANNEL, TARGET_CHANNEL, POSITIVE_CHANNEL, NEGATIVE_CHANNEL)
                     for f in spec.channel(c)}
        self.serve = tf.function(self._serve, input_signature=[signature])

    def _serve(self, features):
        s = self.spec
        inputs = {"user": [features[f] for f in s.channel(USER_CHANNEL)],
                  "target": [features[f] for f in s.channel(TARGET_CHANNEL)],
                  "positive": [features[f] for f in s.channel(POSITIVE_CHANNEL)],
                  "negative": [features[f] for f in s.channel(NEGATIVE_CHANNEL)]}
        logit, _, _ = self.model.forward(self.model.lookup(inputs))
        return {"probabilities": tf.sigmoid(logit)}


def export_saved_model(model, spec, output_path: str) -> None:
    from datasets import StagedDirectory
    serving = ServingModel(model, spec)
    with StagedDirectory(output_path, overwrite=True) as staged:
        tf.saved_model.save(serving, staged.tmp_dir,
                            signatures={"serving_default": serving.serve})
