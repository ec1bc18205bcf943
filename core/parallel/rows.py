"""Row-wise sharded lookups: each id goes to the rank that owns its row, the vector comes back,
and in the backward pass the vector's gradient goes to the owner, which updates its rows
sparsely. Two all-to-alls per table and step (ids, then vectors; the vectors' mirror in the
backward pass), issued by every rank in the same order whatever it holds or asks for.
"""
from __future__ import annotations

import tensorflow as tf

from core.dynamic import splitmix64


def routed_lookup(comm, variables, ids, owner_of, local_row_of, name: str):
    """Vectors [*ids.shape, width] of ids (any shape) from each table of `variables` (a list
    of this rank's rows of tables split the same way, e.g. a feature's wide and deep tables:
    the ids travel once). owner_of(ids) -> the owning rank of each id (int32);
    local_row_of(ids) -> the row of each id (owned by this rank) in the variables. An owner
    reads its ids in rank order and, within a rank, in batch order: the order one process
    would read them in, so duplicate rows' gradients are summed in the same order."""
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    owners = owner_of(flat)
    order = tf.argsort(owners, stable=True)
    counts = tf.math.bincount(owners, minlength=comm.size, maxlength=comm.size,
                              dtype=tf.int32)
    asked, asked_counts = comm.exchange(tf.gather(flat, order), counts, name=f"{name}_ids")
    rows = local_row_of(asked)
    widths = [v.shape[1] for v in variables]
    vectors = tf.concat([tf.nn.embedding_lookup(v, rows) for v in variables], axis=1)
    answered = comm.alltoall(tf.reshape(vectors, [-1]), asked_counts * sum(widths),
                             name=f"{name}_vectors")
    answered = tf.gather(tf.reshape(answered, [-1, sum(widths)]),
                         tf.math.invert_permutation(order))
    return [tf.reshape(part, tf.concat([tf.shape(ids), [width]], 0))
            for part, width in zip(tf.split(answered, widths, axis=1), widths)]


def range_owner(row_starts):
    """owner_of for contiguous row ranges: rank r owns rows row_starts[r] .. row_starts[r+1]."""
    starts = tf.constant([row_starts], tf.int64)

    def owner_of(ids):
        return tf.cast(tf.searchsorted(starts, ids[None], side="right")[0] - 1, tf.int32)
    return owner_of


def hash_owner(world_size: int):
    """owner_of for dynamic tables: an id's rank is a hash of the id, so any int64 id has an
    owner and consecutive or strided ids spread evenly."""
    def owner_of(ids):
        hashed = tf.bitwise.right_shift(splitmix64(tf.bitcast(tf.cast(ids, tf.int64), tf.uint64)),
                                        tf.constant(33, tf.uint64))
        return tf.cast(tf.math.floormod(tf.cast(hashed, tf.int64), world_size), tf.int32)
    return owner_of


def range_lookup(comm, bounds, variables, ids, name: str):
    """routed_lookup of tables split in contiguous row ranges: rank r holds rows
    bounds[r]..bounds[r+1] (a range may be empty), row bounds[rank] first in its variables."""
    start = bounds[comm.rank]
    return routed_lookup(comm, variables, ids, range_owner(bounds[:-1]),
                         lambda rows: rows - start, name)


def collective_names(name: str) -> list:
    """The collectives routed_lookup issues under `name`, in order."""
    return [f"{name}_ids", f"{name}_vectors", f"{name}_vectors_grad"]


class RowShards:
    """A table of `rows` rows split evenly over the ranks in contiguous ranges, rank r holding
    rows rows·r//W .. rows·(r+1)//W (the ranking families' row_wise), read by range_lookup:
    lookup(variable, ids, name) gives the vectors of any ids and sends their gradient to
    the owners; whole(variable, name) every row on every rank (differentiable too)."""

    def __init__(self, comm, rows: int):
        self.comm, self.rows = comm, int(rows)
        self.bounds = tuple(self.rows * r // comm.size for r in range(comm.size + 1))

    @property
    def held(self) -> tuple:
        """(start, stop) of this rank's rows."""
        return self.bounds[self.comm.rank], self.bounds[self.comm.rank + 1]

    def lookup(self, variable, ids, name: str):
        return range_lookup(self.comm, self.bounds, [variable], ids, name)[0]

    def whole(self, variable, name: str):
        return self.lookup(variable, tf.range(self.rows, dtype=tf.int64), name)
