"""SASRec and HSTU as a client of the training engine (training/engine.py). The item table
embeds the history and scores the next item over the whole catalogue, so its gradient is
dense: it is one of the dense variables (summed across ranks) and the family declares no
sparse table. One optimizer (Adam, or AdamW with --weight_decay) at a constant rate.

A batch is ({"item_ids": int64 [b, L + 1], "timestamps"?}, global_rows): each row's ids
left-padded with 0, most recent last (retrieval/data.py). Training reads positions 0..L-1 and
predicts positions 1..L: every (history prefix, next item) pair of the row whose history is
not empty. The loss is the cross-entropy over all items of each such pair, summed over a
row's pairs and averaged over the global batch's rows, so N ranks take one process's step.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.optimizers import make_optimizer
from retrieval.metrics import METRIC_KEYS, ranking_metrics, target_ranks
from training import OptimizerGroup, Trainer, compute_dtype_for
from training.checkpoint import with_slots
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share
from training.loop import gather_to_root

ITEM_IDS, TIMESTAMPS = "item_ids", "timestamps"


def history_and_next(features: dict) -> tuple:
    """({item_ids, timestamps?} of [b, L + 1]) -> (history features [b, L], next ids [b, L])."""
    history = {k: v[:, :-1] for k, v in features.items()}
    return history, features[ITEM_IDS][:, 1:]


def evaluated(features: dict) -> tuple:
    """An evaluation row: (its history [b, L], its target: the row's last id [b])."""
    history, following = history_and_next(features)
    return history, following[:, -1]


class RetrievalTask:
    tables, lookup_collectives = (), ()

    def __init__(self, model, seed: int):
        self.model, self.seed = model, seed
        self.dense_variables = dict(model.named)

    @staticmethod
    def lookup(batch):
        return {}, None, []

    def dense_inputs(self, batch, step):
        features, global_rows = batch
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
        return features, global_rows, seed

    def loss(self, inputs, embedded, context, compute_dtype):
        features, global_rows, seed = inputs
        history, following = history_and_next(features)
        vectors = self.model.encode(history[ITEM_IDS], history.get(TIMESTAMPS), seed,
                                    compute_dtype)
        pairs = (history[ITEM_IDS] > 0) & (following > 0)
        logits = self.model.scores(tf.boolean_mask(vectors, pairs), compute_dtype)
        per_pair = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.boolean_mask(following, pairs) - 1, logits=logits)
        return mean_share(per_pair, global_rows)

    loss_name = "cross-entropy over all items, summed over a history's next items"

    def predict(self, batch, compute_dtype):
        """Scores [b, N] of every item after each row's history (the row's last id is the
        target and is not read)."""
        history, _ = evaluated(batch[0])
        vectors = self.model.encode(history[ITEM_IDS], history.get(TIMESTAMPS),
                                    compute_dtype=compute_dtype)
        return self.model.scores(vectors[:, -1], compute_dtype)

    @staticmethod
    def label(batch):
        return evaluated(batch[0])[1]

    @staticmethod
    def global_rows(batch):
        return batch[1]


def batch_signature(config) -> tuple:
    """TensorSpecs of a batch (any batch size)."""
    ids = tf.TensorSpec([None, config.length + 1], tf.int64)
    features = {ITEM_IDS: ids, **({TIMESTAMPS: ids} if config.timestamps else {})}
    return features, tf.TensorSpec([], tf.int32)


class RetrievalTrainer(Trainer):
    def __init__(self, model, comm, lr: float, weight_decay: float = 0.0, amp: bool = False,
                 seed: int = 0, divergence_factor: float = DEFAULT_DIVERGENCE_FACTOR,
                 filter_seen: bool = False):
        self.model, self.lr, self.filter_seen = model, float(lr), filter_seen
        self.optimizer = make_optimizer("adam", dict(model.named), weight_decay)
        group = OptimizerGroup(self.optimizer, lambda step: self.lr,
                               tuple(model.named.values()))
        signature = batch_signature(model.config)
        super().__init__(RetrievalTask(model, int(seed)), comm, [group], compute_dtype_for(amp),
                         input_signature=signature, predict_signature=signature,
                         divergence_hint="Lower --lr.", divergence_factor=divergence_factor)
        self._ranks = tf.function(self._ranks_of, input_signature=[signature[0]],
                                  autograph=False)

    def _ranks_of(self, features):
        history, target = evaluated(features)
        vectors = self.model.encode(history[ITEM_IDS], history.get(TIMESTAMPS),
                                    compute_dtype=self.compute_dtype)
        scores = self.model.scores(vectors[:, -1], self.compute_dtype)
        return target_ranks(scores, target, history[ITEM_IDS] if self.filter_seen else None)

    def evaluate(self, batches) -> dict:
        """Full-ranking metrics over every row of `batches` (this rank's rows; rank 0
        gathers every rank's ranks and broadcasts the figures)."""
        ranks = [self._ranks(batch[0]).numpy() for batch in batches]
        ranks = gather_to_root(self.comm, np.concatenate(ranks) if ranks else np.zeros(0))
        figures = np.zeros(len(METRIC_KEYS) + 1)
        if self.comm.rank == 0:
            metrics = ranking_metrics(ranks)
            figures[:-1], figures[-1] = [metrics[k] for k in METRIC_KEYS], ranks.size
        figures = self.comm.broadcast_from_root(figures)
        return dict(zip(METRIC_KEYS, map(float, figures[:-1])), eval_samples=int(figures[-1]))

    def named_state(self) -> dict:
        """The model's variables and the optimizer's slots, by checkpoint name."""
        return with_slots(dict(self.model.named), self.optimizer)
