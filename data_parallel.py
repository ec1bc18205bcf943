"""Data-parallel plumbing for families whose every rank holds the whole model (Wide & Deep,
SIM): gradient sums across ranks and gathering evaluation rows.

Convention that makes N processes take the same step as one process with the same global
batch: each rank's loss is sum(per-row loss over its rows) / rows in the global batch, so the
sum of the ranks' gradients is the gradient of the global mean loss.
"""
from __future__ import annotations

import numpy as np


def sum_gradients(comm, grads: list) -> list:
    """Sum each gradient over the ranks. Dense tensors are allreduced; tf.IndexedSlices
    (table rows) are gathered, never densified, so a table is never copied."""
    if comm.size == 1:
        return list(grads)
    return [None if g is None else comm.allreduce_sum(g) for g in grads]


def gather_to_root(comm, array: np.ndarray):
    """Every rank's rows concatenated in rank order on rank 0 (None elsewhere); only rank 0
    holds them, so evaluation memory per rank does not grow with the world size."""
    gathered = comm.gather_to_root(np.asarray(array))
    return np.asarray(gathered) if comm.rank == 0 else None
