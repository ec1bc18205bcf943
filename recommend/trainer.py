"""The ranker as a client of the training engine (training/engine.py).

A training batch is ({"history" [b, L], "candidates" [b, K], "scores" [b, K], "label" [b]},
global_rows, first_row) (retrieval/batches.py's RowBatches): a training prefix, the retrieval
model's K best items with their retrieval scores, and the place of the true next item among
them. The loss is the softmax cross-entropy of the true item among the K, averaged over the
global batch. Evaluation reorders each history's retrieved lists (both protocols) by the ranker and
reads the target's rank in the final list (recommend/stages.py).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.optimizers import make_optimizer
from recommend.stages import final_ranks
from retrieval.metrics import both_protocols
from training import OptimizerGroup, Trainer
from training.checkpoint import with_slots
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share

TRAINING_FEATURES = ("history", "candidates", "scores", "label")
EVALUATION_FEATURES = ("history", "target", "candidates", "scores", "retrieval_rank",
                       "filtered_candidates", "filtered_scores", "filtered_retrieval_rank")


class RankingTask:
    tables, lookup_collectives = (), ()
    loss_name = "cross-entropy of the next item among its retrieved candidates"

    def __init__(self, ranker, seed: int):
        self.ranker, self.seed = ranker, seed
        self.dense_variables = dict(ranker.named)

    @staticmethod
    def lookup(batch):
        return {}, None, []

    def dense_inputs(self, batch, step):
        features, global_rows, first_row = batch
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
        return features, global_rows, (seed, first_row)

    def loss(self, inputs, embedded, context, compute_dtype):
        features, global_rows, seed = inputs
        logits = self.ranker(features["history"], features["candidates"], features["scores"],
                             seed, compute_dtype)
        per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=features["label"],
                                                                 logits=logits)
        return mean_share(per_row, global_rows)

    def predict(self, batch, compute_dtype):
        f = batch[0]
        return self.ranker(f["history"], f["candidates"], f["scores"],
                           compute_dtype=compute_dtype)

    @staticmethod
    def label(batch):
        return batch[0]["label"]

    @staticmethod
    def global_rows(batch):
        return batch[1]


def signature(features, widths: dict) -> tuple:
    """TensorSpecs of a batch (any batch size) of the named features."""
    dtypes = {"scores": tf.float32, "filtered_scores": tf.float32,
              "retrieval_rank": tf.int32, "filtered_retrieval_rank": tf.int32,
              "label": tf.int32}
    spec = {name: tf.TensorSpec([None] + ([widths[name]] if name in widths else []),
                                dtypes.get(name, tf.int64)) for name in features}
    return spec, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)


class RankingTrainer(Trainer):
    def __init__(self, ranker, comm, learning_rate, candidates: int, seed: int = 0,
                 divergence_factor: float = DEFAULT_DIVERGENCE_FACTOR):
        """learning_rate: step -> float; candidates: K, the retrieved items per history."""
        self.ranker = ranker
        self.optimizer = make_optimizer("adam", dict(ranker.named))
        group = OptimizerGroup(self.optimizer, learning_rate, tuple(ranker.named.values()))
        length = ranker.config.length
        train = signature(TRAINING_FEATURES, {"history": length, "candidates": candidates,
                                              "scores": candidates})
        super().__init__(RankingTask(ranker, int(seed)), comm, [group], tf.float32,
                         input_signature=train, predict_signature=train,
                         divergence_hint="Lower --lr.", divergence_factor=divergence_factor)
        lists = {"history": length, **{f"{p}{n}": candidates for p in ("", "filtered_")
                                       for n in ("candidates", "scores")}}
        self._ranks = tf.function(self._ranks_of,
                                  input_signature=[signature(EVALUATION_FEATURES, lists)[0]],
                                  autograph=False)

    def _ranks_of(self, f):
        """[b, 2] the target's rank in the final list of every item and of the unseen ones."""
        ranks = []
        for p in ("", "filtered_"):
            logits = self.ranker(f["history"], f[f"{p}candidates"], f[f"{p}scores"])
            ranks.append(final_ranks(f[f"{p}candidates"], logits, f["target"],
                                     f[f"{p}retrieval_rank"]))
        return tf.stack(ranks, 1)

    def evaluate(self, batches) -> dict:
        """METRIC_KEYS of the final lists and filtered_<key> of the seen-removed ones, over
        every row of `batches` (this rank's; rank 0 gathers and broadcasts the figures)."""
        ranks = [self._ranks(batch[0]).numpy() for batch in batches]
        ranks = np.concatenate(ranks) if ranks else np.zeros((0, 2), np.int32)
        return both_protocols(self.comm, ranks)

    def named_state(self) -> dict:
        return with_slots(dict(self.ranker.named), self.optimizer)

