"""SASRec and HSTU as a client of the training engine (training/engine.py). The item table
embeds the history and scores the next item over the whole catalogue, so its gradient is
dense: it is one of the dense variables (summed across ranks) and the family declares no
sparse table. One optimizer (Adam, or AdamW with --weight_decay) at a constant rate.

A batch is ({"item_ids": int64 [b, L + 1], "timestamps"?}, global_rows, first_row)
(retrieval/batches.py): each row's ids left-padded with 0, most recent last
(retrieval/data.py). Training reads positions 0..L-1 and
predicts positions 1..L: every (history prefix, next item) pair of the row whose history is
not empty. The loss is the cross-entropy over all items of each such pair, summed over a
row's pairs and averaged over the global batch's rows, so N ranks take one process's step.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.fused_ops import softmax_cross_entropy_rows
from core.optimizers import make_optimizer
from core.parallel.comm import Communicator
from core.parallel.rows import collective_names
from retrieval.metrics import both_protocols, full_ranks
from retrieval.model import item_read_name
from training import OptimizerGroup, Trainer, compute_dtype_for
from training.checkpoint import slot_row_ranges, with_slots
from training.engine import DEFAULT_DIVERGENCE_FACTOR, mean_share

ITEM_IDS, TIMESTAMPS = "item_ids", "timestamps"


def history_and_next(features: dict) -> tuple:
    """({item_ids, timestamps?} of [b, L + 1]) -> (history features [b, L], next ids [b, L])."""
    history = {k: v[:, :-1] for k, v in features.items()}
    return history, features[ITEM_IDS][:, 1:]


def with_rows(model, features: dict) -> dict:
    """features with their item ids as table rows (evaluation: a dynamic table admits none)."""
    return dict(features, **{ITEM_IDS: model.rows(features[ITEM_IDS])})


def evaluated(features: dict) -> tuple:
    """An evaluation row: (its history [b, L], its target: the row's last id [b])."""
    history, following = history_and_next(features)
    return history, following[:, -1]


LOSSES = ("full", "sampled")
NEGATIVES = ("uniform", "in_batch", "mixed")


def sampled_softmax(model, vectors, targets, negatives: str, count: int, seed, compute_dtype,
                    batch_targets=None):
    """Per-pair softmax cross-entropy of each target against sampled negatives, for
    catalogues too large to score whole: `uniform` draws `count` ids of 1..N shared by the
    batch; `in_batch` takes the batch's distinct targets; `mixed` both (Yang et al., 2020:
    the batch's targets follow popularity, the uniform draws reach the tail). A negative
    equal to the pair's target (an accidental hit) is dropped, and every logit (the
    target's too) is corrected by the log of its item's expected count among the negatives
    (logQ: `count` / N for a uniform draw, its count among the batch's targets for an
    in-batch one, their sum for mixed), so the sampled loss estimates the full one.
    batch_targets: the global batch's targets, whose distinct ids are the in-batch negatives
    (several processes: every process's, gathered in rank order); default `targets`."""
    items = model.config.items
    uniform_share = tf.cast(count, tf.float32) / items
    def drawn():
        return tf.random.stateless_uniform([count], seed, 1, items + 1, tf.int64)
    if negatives == "uniform":
        sampled, expected, target_expected = drawn(), tf.fill([count], uniform_share), \
            uniform_share[None]
    else:
        batch_ids, _, counts = tf.unique_with_counts(
            targets if batch_targets is None else batch_targets, out_idx=tf.int64)
        counts = tf.cast(counts, tf.float32)

        def count_of(ids):  # each id's count among the batch's targets
            return tf.reduce_sum(tf.where(tf.equal(ids[:, None], batch_ids[None, :]),
                                          counts[None, :], 0.0), 1)
        sampled, expected, target_expected = batch_ids, counts, count_of(targets)
        if negatives == "mixed":
            sampled = tf.concat([batch_ids, drawn()], 0)
            expected = uniform_share + count_of(sampled)
            target_expected += uniform_share
    queries = tf.cast(model.queries(vectors), compute_dtype)
    positive = tf.reduce_sum(
        tf.cast(queries, tf.float32) * model.scored_items(targets, "targets"), -1)
    negative = tf.cast(tf.matmul(queries, tf.cast(model.scored_items(sampled, "negatives"),
                                                  compute_dtype),
                                 transpose_b=True), tf.float32) - tf.math.log(expected)
    negative = tf.where(tf.equal(targets[:, None], sampled[None, :]), -1e9, negative)
    logits = tf.concat([(positive - tf.math.log(target_expected))[:, None], negative], 1)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.zeros_like(targets, tf.int32), logits=logits)


def scored(model, vectors, compute_dtype, padded: bool = False):
    """(queries [n, d], table [C, d]): what model.scores multiplies, float32, its C candidate
    items first (a dynamic table's allocated rows are rows 1..C), in compute_dtype's
    precision (bfloat16: rounded to it, the products summed in float32). padded: the table
    keeps the padding row 0 first ([1 + C, d])."""
    queries, table = model.queries(vectors), model.catalogue(padded)
    candidates = model.candidates()
    if candidates is not None:
        table = table[:tf.reduce_sum(tf.cast(candidates, tf.int32)) + int(padded)]
    if compute_dtype != tf.float32:
        queries, table = (tf.cast(tf.cast(x, compute_dtype), tf.float32) for x in (queries, table))
    return queries, table


def full_softmax(model, vectors, targets, compute_dtype):
    """Per-pair softmax cross-entropy of each target (a row 1..N) over every candidate item:
    model.scores' logits, a tile of items at a time (core/fused_ops.py), never whole; the
    padding row stays in the table, out of the softmax."""
    queries, table = scored(model, vectors, compute_dtype, padded=True)
    return softmax_cross_entropy_rows(queries, table, targets - 1, first_row=1)


class RetrievalTask:
    tables, lookup_collectives = (), ()

    def __init__(self, model, seed: int, loss: str = "full", negatives: str = "mixed",
                 num_negatives: int = 128, comm=None):
        if loss not in LOSSES or negatives not in NEGATIVES:
            raise ValueError(f"--loss must be one of {list(LOSSES)} and --negatives one of "
                             f"{list(NEGATIVES)}, found {loss!r}, {negatives!r}")
        self.model, self.seed, self.sampled = model, seed, loss == "sampled"
        self.comm = comm or Communicator()
        # a dynamic table maps the global batch's ids: they are gathered first (named, as
        # every collective, so the ranks match it)
        self.lookup_collectives = ("dynamic_item_ids",) if model.dynamic is not None else ()
        # a table split by rows: each read of a step is a routed lookup, its gradient the
        # rows this rank holds, already summed over the ranks' batches by the lookup
        self.row_split = ("item_embeddings",) if model.shards is not None else ()
        if model.shards is not None:
            reads = ("history", "targets", "negatives") if loss == "sampled" else \
                ("history", "catalogue")
            self.lookup_collectives = tuple(name for read in reads
                                            for name in collective_names(item_read_name(read)))
        self.negatives, self.num_negatives = negatives, num_negatives
        # in-batch negatives are the global batch's targets: every process's, gathered, so N
        # processes take one process's step
        self.gathers_targets = self.sampled and negatives != "uniform" and self.comm.size > 1
        self.lookup_collectives += ("batch_targets",) if self.gathers_targets else ()
        self.dense_variables = dict(model.named)
        # a sampled loss reads the item (and attribute) tables by gathers: their gradient is
        # the rows a step touched, updated lazily, so a step's cost follows the batch
        self.row_updated = ("item_embeddings", "attribute_embeddings") if self.sampled else ()
        self.new_rows_hooks = []  # (table, rows): rows a dynamic table gave to new ids

    @staticmethod
    def lookup(batch):
        return {}, None, []

    def dense_inputs(self, batch, step):
        features, global_rows, first_row = batch
        if self.model.dynamic is not None:
            features = dict(features, **{ITEM_IDS: self._dynamic_rows(features[ITEM_IDS],
                                                                      first_row)})
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])
        return features, global_rows, (seed, first_row)

    def _dynamic_rows(self, ids, first_row):
        """A dynamic table's rows of this rank's ids. Every rank maps the whole global batch
        (its ranks' ids gathered in rank order: the global batch's order), so every replica
        of the table gives the same ids the same rows, as one process would."""
        everyone = self.comm.allgather(ids, name="dynamic_item_ids")
        rows, new_rows = self.model.rows(everyone, training=True)
        for hook in self.new_rows_hooks:
            hook(self.model.items, new_rows)
        return rows[first_row:first_row + tf.shape(ids)[0]]

    def loss(self, inputs, embedded, context, compute_dtype):
        features, global_rows, seed = inputs
        history, following = history_and_next(features)
        vectors, at = self.model.encode_real(history[ITEM_IDS], history.get(TIMESTAMPS), seed,
                                             compute_dtype)
        # a pair: a position holding an item whose next position does too
        targets = tf.gather_nd(following, at)
        vectors, targets = tf.boolean_mask(vectors, targets > 0), \
            tf.boolean_mask(targets, targets > 0)
        if self.sampled:
            everyone = self.comm.allgather(targets, name="batch_targets") \
                if self.gathers_targets else None
            per_pair = sampled_softmax(self.model, vectors, targets, self.negatives,
                                       self.num_negatives, seed[0] + [0, 7], compute_dtype,
                                       everyone)
        else:
            per_pair = full_softmax(self.model, vectors, targets, compute_dtype)
        return mean_share(per_pair, global_rows)

    @property
    def loss_name(self) -> str:
        over = {"uniform": f"{self.num_negatives} uniform negatives",
                "in_batch": "in-batch negatives",
                "mixed": f"in-batch and {self.num_negatives} uniform negatives"}[
            self.negatives] if self.sampled else "all items"
        return f"cross-entropy over {over}, summed over a history's next items"

    def predict(self, batch, compute_dtype):
        """Scores [b, N] of every item after each row's history (the row's last id is the
        target and is not read)."""
        history, _ = evaluated(with_rows(self.model, batch[0]))
        vectors = self.model.encode(history[ITEM_IDS], history.get(TIMESTAMPS),
                                    compute_dtype=compute_dtype)
        return self.model.scores(vectors[:, -1], compute_dtype)

    def label(self, batch):
        return evaluated(with_rows(self.model, batch[0]))[1]

    @staticmethod
    def global_rows(batch):
        return batch[1]


def by_length(batches):
    """The features of step batches regrouped by history length, each group cut to its
    longest history: the encoder then reads few padded positions (Beauty's median
    history is 6 of 50). Left padding is cut, so every id keeps its position."""
    features = [{k: v.numpy() for k, v in batch[0].items()} for batch in batches]
    if not features:
        return
    size = max(len(f[ITEM_IDS]) for f in features)
    rows = {k: np.concatenate([f[k] for f in features]) for k in features[0]}
    order = np.argsort((rows[ITEM_IDS][:, :-1] > 0).sum(1), kind="stable")
    for start in range(0, len(order), size):
        group = {k: v[order[start:start + size]] for k, v in rows.items()}
        real = (group[ITEM_IDS][:, :-1] > 0).any(0)
        first = int(np.argmax(real)) if real.any() else real.size - 1
        yield {k: tf.constant(v[:, first:]) for k, v in group.items()}


def batch_signature(config) -> tuple:
    """TensorSpecs of a batch (any batch size)."""
    ids = tf.TensorSpec([None, config.length + 1], tf.int64)
    features = {ITEM_IDS: ids, **({TIMESTAMPS: ids} if config.timestamps else {})}
    return features, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)


class RetrievalTrainer(Trainer):
    def __init__(self, model, comm, learning_rate, weight_decay: float = 0.0, amp: bool = False,
                 seed: int = 0, divergence_factor: float = DEFAULT_DIVERGENCE_FACTOR,
                 loss: str = "full", negatives: str = "mixed",
                 num_negatives: int = 128):
        """learning_rate: step -> float (core.optimizers.LearningRateSchedule)."""
        self.model = model
        self.optimizer = make_optimizer("adam", dict(model.named), weight_decay)
        group = OptimizerGroup(self.optimizer, learning_rate,
                               tuple(model.named.values()))
        signature = batch_signature(model.config)
        task = RetrievalTask(model, int(seed), loss, negatives, num_negatives, comm)
        task.new_rows_hooks.append(self.optimizer.reset_rows)
        super().__init__(task, comm, [group], compute_dtype_for(amp),
                         input_signature=signature, predict_signature=signature,
                         divergence_hint="Lower --lr.", divergence_factor=divergence_factor)
        # evaluation batches are cut to their longest history (any length)
        trimmed = tf.nest.map_structure(lambda x: tf.TensorSpec([None, None], x.dtype),
                                        signature[0])
        items = tf.TensorSpec([None, model.config.width], tf.float32)
        self._ranks = tf.function(self._ranks_of, input_signature=[trimmed, items],
                                  autograph=False)

    def _ranks_of(self, features, items):
        """Each row's target's rank [b, 2]: among every candidate item, and among those the
        user has not seen (the target kept); a target without a row (a dynamic table's
        unknown id) ranks last. items: the model's item_vectors()."""
        with self.model.reading(items):
            return self._read_ranks(features)

    def _read_ranks(self, features):
        history, target = evaluated(with_rows(self.model, features))
        vectors = self.model.encode(history[ITEM_IDS], history.get(TIMESTAMPS),
                                    compute_dtype=self.compute_dtype)
        queries, table = scored(self.model, vectors[:, -1], self.compute_dtype)
        ranks = tf.stack(full_ranks(queries, table, tf.maximum(target, 1), history[ITEM_IDS]),
                         1)
        return tf.where((target > 0)[:, None], ranks, self.model.config.items)

    def evaluate(self, batches) -> dict:
        """Full-ranking metrics over every row of `batches` under both protocols, from one
        pass: METRIC_KEYS over every item, filtered_<key> without the user's seen items
        (the target kept). This rank's rows; rank 0 gathers every rank's ranks and
        broadcasts the figures."""
        # once per evaluation, on every rank alike (a split table's rows gathered)
        items = self.model.item_vectors(read="evaluation")
        items = tf.convert_to_tensor(items)
        ranks = [self._ranks(rows, items).numpy() for rows in by_length(batches)]
        ranks = np.concatenate(ranks) if ranks else np.zeros((0, 2), np.int32)
        return both_protocols(self.comm, ranks)

    def named_state(self) -> dict:
        """The model's variables and the optimizer's slots, by checkpoint name."""
        return with_slots(dict(self.model.named), self.optimizer)

    def row_ranges(self) -> dict:
        """{checkpoint name: (first row, stop, rows)} of the state this rank holds rows of (a
        table split by rows: its rows and their optimizer slots; training/checkpoint.py)."""
        shards = self.model.shards
        if shards is None:
            return {}
        return slot_row_ranges({"item_embeddings": (*shards.held, shards.rows)}, self.optimizer)

    def dynamic_tables(self) -> dict:
        """{name: (its map, the named_state entries whose rows it indexes)} of a dynamic item
        table (training/checkpoint.py)."""
        if self.model.dynamic is None:
            return {}
        return {"item_ids": (self.model.dynamic, [
            n for n in self.named_state() if n.split("/")[0] == "item_embeddings"])}
