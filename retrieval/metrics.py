"""Full-ranking metrics of next-item retrieval: every item of the catalogue is a candidate
(never a sampled list). A target's rank is the number of other items scored at least as high
(ties count against the target), 0 the best; from the ranks of every evaluated user:
HR@K (= Recall@K with one target), NDCG@K and MRR."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.fused_ops import cpu_library
from training.loop import gather_to_root

CUTOFFS = (1, 5, 10, 20, 50)
# the keys of results.json's "valid" and "test" (NDCG@1 equals HR@1)
METRIC_KEYS = tuple([f"hr@{k}" for k in CUTOFFS] + [f"ndcg@{k}" for k in CUTOFFS[1:]]
                    + ["mrr"])


def seen_mask(seen, items: int):
    """int64 [n, L] ids (0: none) -> bool [n, items]: column i marks item i + 1."""
    rows = tf.broadcast_to(tf.range(tf.shape(seen, out_type=tf.int64)[0])[:, None],
                           tf.shape(seen))
    at = tf.boolean_mask(tf.stack([rows, seen - 1], -1), seen > 0)
    counts = tf.scatter_nd(at, tf.ones(tf.shape(at)[:1], tf.int32),
                           tf.cast(tf.stack([tf.shape(seen)[0], items]), tf.int64))
    return counts > 0


def target_ranks(scores, targets, seen=None):
    """scores float [n, N] of items 1..N, targets int64 [n] in 1..N -> int32 [n] ranks.
    seen: int64 [n, L] ids whose scores drop out (already-seen filtering); the target itself
    stays a candidate even when seen."""
    items = tf.shape(scores)[1]
    target_scores = tf.gather(scores, targets - 1, batch_dims=1)
    if seen is not None:
        hidden = seen_mask(seen, items) & ~tf.cast(tf.one_hot(targets - 1, items), tf.bool)
        scores = tf.where(hidden, tf.constant(-np.inf, scores.dtype), scores)
    return tf.reduce_sum(tf.cast(scores >= target_scores[:, None], tf.int32), axis=1) - 1


def full_ranks(queries, table, targets, seen):
    """(ranks, filtered ranks) int32 [n] of targets (int64 [n] in 1..N) among the scores
    queries @ table^T (float32 [n, d] and [N, d]) of items 1..N, as target_ranks gives them
    without and with seen (int64 [n, L], 0: none). On a CPU the TiledTargetRanks op
    (ops/tiled_softmax.cc) counts a tile of items at a time, never the [n, N] scores whole."""
    lib = cpu_library("tiled_softmax")
    if lib is None:
        scores = tf.matmul(queries, table, transpose_b=True)
        return target_ranks(scores, targets), target_ranks(scores, targets, seen)
    return lib.tiled_target_ranks(queries, table, targets - 1, seen - 1)


def ranking_metrics(ranks) -> dict:
    """{hr@K, ndcg@K, mrr}: means over the users of the 0-based ranks."""
    ranks = np.asarray(ranks, np.float64)
    if ranks.size == 0:
        raise ValueError("no user to evaluate")
    out = {}
    for k in CUTOFFS:
        hit = ranks < k
        out[f"hr@{k}"] = float(hit.mean())
        if k > 1:
            out[f"ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(ranks + 2), 0.0).mean())
    out["mrr"] = float((1.0 / (ranks + 1)).mean())
    return {k: out[k] for k in METRIC_KEYS}


def both_protocols(comm, ranks: np.ndarray) -> dict:
    """ranks int [n, 2] of this rank's users (among every item, among the unseen ones) ->
    METRIC_KEYS and filtered_<key> over every rank's users, and eval_samples (rank 0 gathers
    the ranks and broadcasts the figures)."""
    plain, filtered = (gather_to_root(comm, ranks[:, i].copy()) for i in (0, 1))
    keys = list(METRIC_KEYS) + [f"filtered_{k}" for k in METRIC_KEYS]
    figures = np.zeros(len(keys) + 1)
    if comm.rank == 0:
        figures[:-1] = [m[k] for m in map(ranking_metrics, (plain, filtered))
                        for k in METRIC_KEYS]
        figures[-1] = plain.size
    figures = comm.broadcast_from_root(figures)
    return dict(zip(keys, map(float, figures[:-1])), eval_samples=int(figures[-1]))


# results.json's figure sets and the prefixes of their keys in a training run's final record
RESULT_SETS = (("valid", ""), ("test", "test_"), ("valid_filtered", "filtered_"),
               ("test_filtered", "test_filtered_"))


def results_record(final: dict, selected_on: str) -> dict:
    """results.json of a run: both protocols' validation and test figures at the kept epoch
    (final: the training loop's record, or the same keys), best_epoch, selected_on."""
    results = {name: {k: final[f"{prefix}{k}"] for k in METRIC_KEYS}
               for name, prefix in RESULT_SETS}
    results.update(best_epoch=int(final["best_epoch"]),
                   selected_on=final.get("selected_on", selected_on))
    return results
