"""The two stages as one SavedModel: `serving_default` runs retrieval and ranking in one graph.

Input: `item_ids` int64 [batch, any length], oldest first, 0 = padding (retrieval/export.py's
layout: ids the table does not hold are left out and counted). Outputs: `top_k_ids` int64
[batch, k] and `top_k_scores` float32 [batch, k], the final list best first: the retrieval
model's top `candidates` items (with filter_seen, of the items the history does not hold)
reordered by the ranker's logits (the scores); `unknown_ids` int64 [batch] as retrieval's.
"""
from __future__ import annotations

import tensorflow as tf

from core.files import StagedDirectory
from recommend.stages import unseen
from retrieval.export import held_rows, most_recent
from training.export import export_error


class TwoStage(tf.Module):
    def __init__(self, retrieval, ranker, candidates: int, k: int, filter_seen: bool = False):
        super().__init__(name="recommender")
        self.retrieval, self.ranker, self.filter_seen = retrieval, ranker, filter_seen
        self.candidates = min(int(candidates), retrieval.config.items)
        self.k = min(int(k), self.candidates)
        self.serve = tf.function(lambda item_ids: self._serve(item_ids),
                                 input_signature=[tf.TensorSpec([None, None], tf.int64)],
                                 autograph=False)

    def _serve(self, item_ids):
        rows = held_rows(self.retrieval, item_ids)
        unknown = tf.reduce_sum(tf.cast((item_ids != 0) & (rows == 0), tf.int64), 1)
        history = most_recent(rows, self.retrieval.config.length)
        vectors = self.retrieval.encode(history)[:, -1]
        scores = self.retrieval.scores(vectors)
        retrieved = tf.math.top_k(unseen(scores, rows) if self.filter_seen else scores,
                                  self.candidates)
        candidates = tf.cast(retrieved.indices, tf.int64) + 1
        logits = self.ranker(history, candidates, retrieved.values)
        best = tf.math.top_k(logits, self.k)
        return {"top_k_ids": tf.gather(candidates, best.indices, batch_dims=1),
                "top_k_scores": best.values, "unknown_ids": unknown}


def export(retrieval, ranker, output_path: str, candidates: int, k: int,
           filter_seen: bool = False) -> int:
    """Writes through a staged directory (a failed write leaves the previous export); returns
    the k served."""
    model = TwoStage(retrieval, ranker, candidates, k, filter_seen)
    try:
        with StagedDirectory(output_path, overwrite=True) as staged:
            tf.saved_model.save(model, staged.tmp_dir, signatures={"serving_default": model.serve})
    except tf.errors.OpError as e:
        raise export_error(output_path, e.message) from None
    return model.k
