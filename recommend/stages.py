"""The retrieval stage as the ranker sees it: a retrieval run's kept model, its top-K candidates
for a history, and the final list over the whole catalogue.

A history's final list is the retrieval model's top-K reordered by the ranker, then every other
item in the retrieval model's order: a target outside the K candidates keeps its retrieval rank
(at least K), so at every cutoff up to K it is a miss, and the two-stage figures compare
directly with retrieval's. Ranks are 0-based and ties count against the target, as
retrieval/metrics.py counts them.

Rows are item table rows 1..N (0: padding), histories left-padded with the most recent last
(retrieval/contract.py).
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from core.dllog import logged_parameters
from retrieval.data import catalogue, item_attributes
from retrieval.metrics import seen_mask, target_ranks
from retrieval.model import CHECKPOINT_DEFAULTS, Encoder, RetrievalConfig
from training import checkpoint


class RetrievalRunError(ValueError):
    pass


def retrieval_parameters(directory: str) -> dict:
    """The flags a retrieval.main training run logged (OUT/log.json's PARAMETER record)."""
    log = os.path.join(directory, "log.json")
    try:
        parameters = logged_parameters(log)
    except (OSError, ValueError) as e:
        raise RetrievalRunError(f"--retrieval_dir {directory}: cannot read {log} "
                                f"({getattr(e, 'strerror', None) or e}): is it a "
                                f"retrieval.main output dir?") from None
    if "model" not in parameters:
        raise RetrievalRunError(f"--retrieval_dir {directory}: {log} holds no retrieval.main "
                                f"parameters")
    return parameters


def load_retrieval(directory: str, spec) -> Encoder:
    """The kept model of a retrieval.main run (directory/checkpoint), built for the catalogue
    of `spec` (the run's dataset: a checkpoint of another catalogue is refused)."""
    items = catalogue(spec)
    if items.dynamic is not None or items.timestamps:
        raise RetrievalRunError("recommend.main reads datasets of dense item ids without "
                                "timestamps (retrieval.prepare_dataset --ids dense or map)")
    p = retrieval_parameters(directory)
    attributes = item_attributes(spec) if p.get("item_attributes") else None
    if p.get("item_attributes") and attributes is None:
        raise RetrievalRunError(f"--retrieval_dir {directory} was trained with "
                                f"--item_attributes: its dataset's attributes are missing")
    config = RetrievalConfig(
        model=p["model"], items=items.items, length=p["max_sequence_length"],
        width=p["embedding_dim"], blocks=p["num_blocks"], heads=p["num_heads"],
        normalize=p["normalize"], temperature=p["temperature"],
        attributes=attributes.count if attributes else 0, seed=p["seed"])
    model = Encoder(config, attributes=attributes.table if attributes else None)
    checkpoint.restore_replica(os.path.join(directory, "checkpoint"), model.named,
                               model.named, config.checkpoint_shape(),
                               model_defaults=CHECKPOINT_DEFAULTS)
    return model


def training_pairs(item_ids: np.ndarray, length: int) -> tuple:
    """Training rows [n, length + 1] (every column's next id its target) -> (histories
    [P, length], targets [P]): every (prefix, next item) pair whose prefix is not empty, each
    prefix left-padded as an evaluation history is."""
    padded = np.concatenate([np.zeros((len(item_ids), length), np.int64), item_ids], 1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, length, axis=1)
    # window j ends at column j - 1 of the row: the prefix before column j
    pairs = (item_ids[:, 1:] > 0) & (item_ids[:, :-1] > 0)
    return windows[:, 1:item_ids.shape[1]][pairs], item_ids[:, 1:][pairs]


def unseen(scores, history, targets=None):
    """scores [n, N] with the history's items at -inf (the target, when given, kept)."""
    hidden = seen_mask(history, tf.shape(scores)[1])
    if targets is not None:
        hidden &= ~(tf.one_hot(targets - 1, tf.shape(scores)[1]) > 0)
    return tf.where(hidden, -np.inf, scores)


class Candidates:
    """The retrieval model's scoring of histories, in batches of histories of similar length
    (each cut to its longest: few padded positions are encoded)."""

    def __init__(self, model: Encoder, k: int, batch_size: int, filter_seen: bool = False):
        """filter_seen: training lists are the top K of the unseen items (the target kept),
        as the seen-removed protocol's final lists are."""
        self.model, self.k, self.batch_size = model, min(int(k), model.config.items), batch_size
        self.filter_seen = filter_seen
        spec = [tf.TensorSpec([None, None], tf.int64), tf.TensorSpec([None], tf.int64)]
        self._for_training = tf.function(self._retrieved, input_signature=spec,
                                         autograph=False)
        self._for_evaluation = tf.function(self._lists, input_signature=spec, autograph=False)

    def _scores(self, history):
        return self.model.scores(self.model.encode(history)[:, -1])

    def _retrieved(self, history, targets):
        """The top K rows and scores, and the target's place among them (K: not there)."""
        scores = self._scores(history)
        top = tf.math.top_k(unseen(scores, history, targets) if self.filter_seen else scores,
                            self.k)
        rows = tf.cast(top.indices, tf.int64) + 1
        at = tf.equal(rows, targets[:, None])
        place = tf.where(tf.reduce_any(at, 1), tf.argmax(tf.cast(at, tf.int32), 1,
                                                         output_type=tf.int32), self.k)
        return rows, top.values, place

    def _lists(self, history, targets):
        """Top-K rows and scores among every item and among the unseen ones (the target
        kept), and the target's retrieval rank under each."""
        scores = self._scores(history)
        out = {}
        for name, s in (("", scores), ("filtered_", unseen(scores, history, targets))):
            top = tf.math.top_k(s, self.k)
            out.update({f"{name}candidates": tf.cast(top.indices, tf.int64) + 1,
                        f"{name}scores": top.values,
                        f"{name}retrieval_rank": target_ranks(s, targets)})
        return out

    def _batched(self, function, histories, targets) -> dict:
        order = np.argsort((histories > 0).sum(1), kind="stable")
        parts = []
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            history = histories[rows]
            first = min(int(np.argmax((history > 0).any(0))), history.shape[1] - 1)
            parts.append({k: v.numpy() for k, v in
                          function(tf.constant(history[:, first:]),
                                   tf.constant(targets[rows])).items()})
        inverse = np.argsort(order, kind="stable")
        return {k: np.concatenate([p[k] for p in parts])[inverse] for k in parts[0]}

    def training(self, histories: np.ndarray, targets: np.ndarray) -> dict:
        """{candidates [P, K], scores, label}: the top K and the target's place among them,
        of the prefixes whose target is retrieved (label < K)."""
        lists = self._batched(lambda h, t: dict(zip(("candidates", "scores", "label"),
                                                    self._for_training(h, t))),
                              histories, targets)
        kept = lists["label"] < self.k
        return {"history": histories[kept], **{k: v[kept] for k, v in lists.items()}}

    def evaluation(self, histories: np.ndarray, targets: np.ndarray) -> dict:
        """Both protocols' candidates, scores and retrieval ranks (_lists)."""
        return self._batched(self._for_evaluation, histories, targets)


def final_ranks(candidates, logits, targets, retrieval_ranks):
    """candidates int64 [n, K] (distinct rows), the ranker's logits [n, K], targets [n],
    their retrieval ranks [n] -> int32 [n]: the target's rank in the final list (module doc)."""
    at = tf.equal(candidates, targets[:, None])
    found = tf.reduce_any(at, 1)
    target_logit = tf.reduce_max(tf.where(at, logits, -np.inf), 1)
    reranked = tf.reduce_sum(tf.cast(logits >= target_logit[:, None], tf.int32), 1) - 1
    outside = tf.maximum(tf.cast(retrieval_ranks, tf.int32), tf.shape(candidates)[1])
    return tf.where(found, reranked, outside)
