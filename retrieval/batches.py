"""Step batches of the retrieval family from a mapping's rows held in memory (int64 arrays,
8 bytes per id: Beauty's 22k training rows of 51 ids are 9 MB).

Training rows are reshuffled every epoch: the permutation is a function of (seed, epoch)
alone, so a resumed run sees the batches the interrupted one would have. A global batch's
rows are split over the ranks in rank order, each rank taking its slice; the global row count rides
along for the loss (engine: mean over the global batch), and the slice's first global row for
dropout (the masks one process would draw for those rows)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf


class RowBatches:
    def __init__(self, features: dict, batch_size: int, comm, shuffle_seed: int = None,
                 drop_last: bool = False):
        """features: {name: [rows, ...] array}; shuffle_seed None: the stored order."""
        self.features, self.batch_size, self.comm = features, int(batch_size), comm
        self.shuffle_seed, self.rows = shuffle_seed, len(next(iter(features.values())))
        whole, rest = divmod(self.rows, self.batch_size)
        self.batches = whole if drop_last or not rest else whole + 1

    def __len__(self):
        return self.batches

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle_seed is None:
            return np.arange(self.rows)
        return np.random.default_rng([self.shuffle_seed, epoch]).permutation(self.rows)

    def batch(self, rows: np.ndarray) -> tuple:
        """Global rows -> this rank's step batch (features, global row count, the index of
        its first row in the global batch)."""
        shares = np.array_split(rows, self.comm.size)
        first = sum(len(s) for s in shares[:self.comm.rank])
        return ({k: tf.constant(v[shares[self.comm.rank]]) for k, v in self.features.items()},
                tf.constant(len(rows), tf.int32), tf.constant(first, tf.int32))

    def epoch(self, epoch: int = 0, start_batch: int = 0):
        order = self.order(epoch)
        for b in range(start_batch, self.batches):
            yield self.batch(order[b * self.batch_size:(b + 1) * self.batch_size])
