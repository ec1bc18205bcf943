"""A trained encoder as a SavedModel that retrieves: `serving_default` takes a batch of
histories and returns the best `k` items of the whole catalogue for each.

Inputs: `item_ids` int64 [batch, any length], oldest first, 0 = padding (on either side or in
between: each row's ids are compacted, most recent last); a history longer than the model's
keeps its most recent items; `timestamps` int64 of the same shape when the model reads them.
Outputs: `top_k_ids` int64 [batch, k] and `top_k_scores` float32 [batch, k], best first; the
padding id is never returned; `unknown_ids` int64 [batch]: how many of a history's non-zero ids
the table does not hold (left out of the history, as an evaluation leaves them). With a dynamic
item table the ids are raw ids (any int64 but 0, negative included), and only rows that hold
an id are candidates (a table holding fewer than k fills the rest with id 0 at score -inf). A second signature, `encode`, gives the history vectors
(`query`, as scored) for an external nearest-neighbour index over `item_embeddings.npz`
(written beside the SavedModel's variables: `ids` int64 [N], `embeddings` float32 [N, d], the
catalogue as scored). `--index faiss` also writes an approximate nearest-neighbour index of
it there (retrieval/index.py), which `retrieval.serve` answers from.
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from core.files import StagedDirectory, write_error
from retrieval import index
from training.export import export_error

EMBEDDINGS_FILE = "item_embeddings.npz"


def held_rows(model, ids):
    """Table rows of a request's ids: 0 for the padding and for every id the table does not
    hold (a static table holds 1..N; a dynamic one the ids it mapped)."""
    if model.dynamic is not None:
        return model.rows(ids)
    return tf.where((ids > 0) & (ids <= model.config.items), ids, tf.zeros_like(ids))


def most_recent(ids, length: int, values=None):
    """Each row's non-zero ids (and the matching `values`), most recent last, left-padded or
    cut to `length` columns. Dense ops only (a stable sort moves the kept ids right), so XLA
    compiles it with the encoder."""
    keep = ids > 0
    order = tf.argsort(tf.cast(keep, tf.int32), axis=1, stable=True)
    kept = tf.gather(keep, order, batch_dims=1)
    pad = [[0, 0], [tf.maximum(length - tf.shape(ids)[1], 0), 0]]
    out = [tf.pad(tf.where(kept, tf.gather(x, order, batch_dims=1), tf.zeros_like(x)),
                  pad)[:, -length:]
           for x in ((ids, values) if values is not None else (ids,))]
    return out if values is not None else out[0]


class Retriever(tf.Module):
    def __init__(self, model, k: int):
        super().__init__(name="retriever")
        self.model, self.k = model, min(int(k), model.config.items)
        # the catalogue as scored, computed once here rather than at every request
        # (normalisation and attribute means over every item: most of a request's time)
        self.scored = tf.Variable(model.catalogue(), trainable=False, name="scored_catalogue")
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
        """(query vectors, unknown ids per history): the ids looked up first, so an id the
        table lacks never takes a position of the model's window."""
        rows = held_rows(self.model, item_ids)
        unknown = tf.reduce_sum(tf.cast((item_ids != 0) & (rows == 0), tf.int64), 1)
        return self._history_vectors(rows, timestamps), unknown

    @tf.function(jit_compile=True, autograph=False)
    def _history_vectors(self, rows, timestamps=None):
        """The encoder over each row's most recent rows, compiled by XLA: one history's
        query costs a third of the op-by-op graph's (many small ops)."""
        length = self.model.config.length
        if timestamps is None:
            rows, times = most_recent(rows, length), None
        else:
            rows, times = most_recent(rows, length, timestamps)
        return self.model.encode(rows, times, short_attention=False)[:, -1]

    @tf.function(jit_compile=True, autograph=False)
    def _static_query(self, item_ids, timestamps=None):
        """The query of a static table's model in one XLA cluster, ids to the vector as
        scored: a request of one history costs mostly its ops' launches (0.7 ms at 1 id)."""
        rows = held_rows(self.model, item_ids)
        return self.model.queries(self._history_vectors(rows, timestamps))

    def _encode(self, *inputs):
        if self.model.dynamic is None:
            return {"query": self._static_query(*inputs)}
        return {"query": self.model.queries(self._query(*inputs)[0])}

    def _top_k(self, *inputs):
        vectors, unknown = self._query(*inputs)
        scores, at = tf.math.top_k(self.model.scores(vectors, catalogue=self.scored), self.k)
        return {"top_k_ids": self.model.item_ids(tf.cast(at, tf.int64) + 1),
                "top_k_scores": scores, "unknown_ids": unknown}


def export(model, output_path: str, k: int, index_queries=None):
    """Writes through a staged directory: a failed write leaves the previous export. Returns
    (the k served (at most the catalogue), the index's meta or None). index_queries: query
    vectors [q, d] (as `encode` gives them) to build and check an approximate index with
    (retrieval/index.py), or None: no index."""
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
            embeddings = tf.gather(retriever.scored, rows - 1).numpy()
            np.savez(os.path.join(staged.tmp_dir, EMBEDDINGS_FILE),
                     ids=model.item_ids(tf.constant(rows, tf.int64)).numpy(),
                     embeddings=embeddings)
            meta = None
            if index_queries is not None:
                built, meta = index.build(embeddings, index_queries, retriever.k)
                index.write(built, meta, staged.tmp_dir)
    except tf.errors.OpError as e:
        raise export_error(output_path, e.message) from None
    except OSError as e:  # the embeddings file on a full disk
        raise write_error(output_path, e) from None
    return retriever.k, meta
