"""A trained encoder as a SavedModel that retrieves: `serving_default` takes a batch of
histories and returns the best `k` items of the whole catalogue for each.

Inputs: `item_ids` int64 [batch, any length], oldest first, 0 = padding (on either side or in
between: each row's ids are compacted, most recent last); a history longer than the model's
keeps its most recent items; `timestamps` int64 of the same shape when the model reads them.
Outputs: `top_k_ids` int64 [batch, k] and `top_k_scores` float32 [batch, k], best first; the
padding id is never returned. With a dynamic item table the ids are raw ids, an unknown id in
a history is skipped, and only rows that hold an id are candidates (a table holding fewer than
k fills the rest with id 0 at score -inf). A second signature, `encode`, gives the history vectors
(`query`, as scored) for an external nearest-neighbour index over `item_embeddings.npz`
(written beside the SavedModel's variables: `ids` int64 [N], `embeddings` float32 [N, d], the
catalogue as scored).
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from core.files import StagedDirectory
from training.export import export_error

EMBEDDINGS_FILE = "item_embeddings.npz"


def most_recent(ids, length: int, values=None):
    """Each row's non-zero ids (and the matching `values`), most recent last, left-padded or
    cut to `length` columns."""
    keep = ids > 0
    out = []
    for x in (ids, values) if values is not None else (ids,):
        newest_first = tf.reverse(tf.ragged.boolean_mask(x, keep), axis=[1])
        dense = newest_first.to_tensor(default_value=0, shape=[None, length])
        out.append(tf.reverse(dense, axis=[1]))
    return out if values is not None else out[0]


class Retriever(tf.Module):
    def __init__(self, model, k: int):
        super().__init__(name="retriever")
        self.model, self.k = model, min(int(k), model.config.items)
        spec = tf.TensorSpec([None, None], tf.int64)
        # the signatures' input names are the functions' argument names
        if model.config.timestamps:
            inputs = [spec, spec]
            top_k = lambda item_ids, timestamps: self._top_k(item_ids, timestamps)  # noqa
            encode = lambda item_ids, timestamps: self._encode(item_ids, timestamps)  # noqa
        else:
            inputs = [spec]
            top_k = lambda item_ids: self._top_k(item_ids)  # noqa: E731
            encode = lambda item_ids: self._encode(item_ids)  # noqa: E731
        self.top_k = tf.function(top_k, input_signature=inputs, autograph=False)
        self.encode = tf.function(encode, input_signature=inputs, autograph=False)

    def _query(self, item_ids, timestamps=None):
        length = self.model.config.length
        if timestamps is None:
            ids, times = most_recent(item_ids, length), None
        else:
            ids, times = most_recent(item_ids, length, timestamps)
        return self.model.encode(self.model.rows(ids), times)[:, -1]

    def _encode(self, *inputs):
        return {"query": self.model.queries(self._query(*inputs))}

    def _top_k(self, *inputs):
        scores, at = tf.math.top_k(self.model.scores(self._query(*inputs)), self.k)
        return {"top_k_ids": self.model.item_ids(tf.cast(at, tf.int64) + 1),
                "top_k_scores": scores}


def export(model, output_path: str, k: int) -> None:
    """Writes through a staged directory: a failed write leaves the previous export."""
    if model.dynamic is not None:  # the id -> row map travels with the model
        model.dynamic.freeze()
    retriever = Retriever(model, k)
    candidates = model.candidates()
    rows = np.arange(1, model.config.items + 1) if candidates is None else \
        np.flatnonzero(candidates.numpy()) + 1
    try:
        with StagedDirectory(output_path, overwrite=True) as staged:
            tf.saved_model.save(retriever, staged.tmp_dir,
                                signatures={"serving_default": retriever.top_k,
                                            "encode": retriever.encode})
            np.savez(os.path.join(staged.tmp_dir, EMBEDDINGS_FILE),
                     ids=model.item_ids(tf.constant(rows, tf.int64)).numpy(),
                     embeddings=tf.gather(model.catalogue(), rows - 1).numpy())
    except tf.errors.OpError as e:
        raise export_error(output_path, e.message) from None
