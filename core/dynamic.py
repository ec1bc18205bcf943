"""Open-vocabulary (dynamic) embedding tables: any int64 id gets a row of its own as training
sees it, up to the table's capacity, with no dictionary counted in advance.

Row 0 of a dynamic table is its rare row: every id without a row of its own reads it (and
trains it, as the preprocessing's shared id of rare values is trained). Training a batch,
in this order (the semantics `tests/test_dynamic.py` checks against a pure-Python model):
  1. the batch's distinct ids, in order of first appearance, and how often each occurs;
  2. an id that holds a row reads it, and the row is marked used at this batch;
  3. any other id adds its occurrences to its pending count; ids whose count reaches
     `min_count` are admitted, in order of first appearance: each takes the lowest row never
     used, or, when none is left, the least recently used row not used by this batch (ties:
     the lowest row; that row's id is forgotten, `eviction: lru`). An admitted row starts
     anew: its vector is drawn again from the table's initializer and the optimizer's slots
     of the row are zeroed (the caller does both, given the new rows);
  4. ids not admitted (count below `min_count`, or every row used by this batch) read row 0.
Evaluation and serving never insert: an id with a row reads it, any other reads row 0.

The id -> row map is TensorFlow's MutableHashTable (a compiled kernel); pending counts are
kept for every id seen fewer than `min_count` times (memory grows with such ids, none when
min_count is 1). Memory per row: the vector and optimizer slots, 8 bytes of row -> id,
8 bytes of last use, and about 40 bytes of map entry.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.feature_spec import DynamicSpec

RARE_ROW = 0
NO_ROW = -1


class DynamicTable(tf.Module):
    """The id -> row map of one dynamic table of `capacity` rows (row 0 the rare row)."""

    def __init__(self, capacity: int, spec: DynamicSpec = DynamicSpec(), name="dynamic",
                 table_rows: int = None):
        """table_rows: the whole table's rows when this map holds one rank's share of them
        (new rows are drawn at the whole table's initial scale); default `capacity`."""
        super().__init__(name=name)
        self.capacity, self.spec = int(capacity), spec
        self.table_rows = int(table_rows or capacity)
        with self.name_scope:
            self.rows = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, NO_ROW)
            self.pending = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, 0)
            self.row_ids = tf.Variable(tf.zeros([self.capacity], tf.int64), trainable=False,
                                       name="row_ids")
            self.last_used = tf.Variable(tf.fill([self.capacity], tf.constant(-1, tf.int64)),
                                         trainable=False, name="last_used")
            self.allocated = tf.Variable(0, dtype=tf.int64, trainable=False, name="allocated")
            self.clock = tf.Variable(0, dtype=tf.int64, trainable=False, name="clock")
            self.admissions = tf.Variable(0, dtype=tf.int64, trainable=False, name="admissions")
            self.evictions = tf.Variable(0, dtype=tf.int64, trainable=False, name="evictions")
        self.frozen = None  # the map as a StaticHashTable, once frozen for serving

    def freeze(self) -> None:
        """Serve from a read-only copy of the map (a StaticHashTable, which a SavedModel
        saves and restores with its contents, unlike a MutableHashTable)."""
        keys, rows = self.rows.export()
        with self.name_scope:
            self.frozen = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, rows), NO_ROW)

    def lookup(self, ids):
        """Rows of ids (any shape) without inserting: unknown ids read the rare row."""
        ids = tf.cast(ids, tf.int64)
        rows = tf.reshape((self.frozen or self.rows).lookup(ids), tf.shape(ids))
        return tf.where(rows == NO_ROW, tf.constant(RARE_ROW, tf.int64), rows)

    def train_lookup(self, ids):
        """(rows of ids, rows admitted by this batch): steps 1-4 of the module doc."""
        flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
        distinct, position, counts = tf.unique_with_counts(flat, out_idx=tf.int64)
        now = self.clock.assign_add(1)
        held = tf.reshape(self.rows.lookup(distinct), [-1])  # hash tables give no static shape
        known = held != NO_ROW
        self.last_used.scatter_update(tf.IndexedSlices(
            tf.fill(tf.shape(tf.boolean_mask(held, known)), now), tf.boolean_mask(held, known)))
        new_ids = tf.boolean_mask(distinct, ~known)
        if self.spec.min_count == 1:  # every new id is ready: no counts to keep
            admitted, new_rows = self._admit(new_ids, now)
        else:
            admitted, new_rows = self._admit_counted(new_ids, tf.boolean_mask(counts, ~known),
                                                     now)
        rows = self.lookup(distinct)
        return tf.reshape(tf.gather(rows, position), tf.shape(ids)), new_rows

    def _admit_counted(self, new_ids, counts, now):
        """_admit for the ids whose pending count reaches min_count; the others (and ready
        ids that found no row) keep their counts for the next batches."""
        seen = tf.reshape(self.pending.lookup(new_ids), [-1]) + counts
        ready = seen >= self.spec.min_count
        admitted, new_rows = self._admit(tf.boolean_mask(new_ids, ready), now)
        ready_rank = tf.cumsum(tf.cast(ready, tf.int32)) - 1
        waiting = ~tf.logical_and(ready, ready_rank < tf.size(admitted))
        self.pending.remove(admitted)
        self.pending.insert(tf.boolean_mask(new_ids, waiting), tf.boolean_mask(seen, waiting))
        return admitted, new_rows

    def _admit(self, candidates, now):
        """Rows for candidates in order (fresh rows first, then least recently used ones not
        used at `now`); returns (admitted ids, their rows)."""
        fresh = tf.minimum(tf.size(candidates, tf.int64),
                           self.capacity - 1 - self.allocated)
        fresh_rows = self.allocated + 1 + tf.range(fresh)
        wanted = tf.size(candidates, tf.int64) - fresh
        # only a full table looks for rows to evict (a pass over all its rows)
        evicted = tf.cond(wanted > 0, lambda: self._oldest_rows(wanted, now),
                          lambda: tf.zeros([0], tf.int64))
        self.rows.remove(tf.gather(self.row_ids, evicted))
        rows = tf.concat([fresh_rows, evicted], 0)
        admitted = candidates[:tf.size(rows)]
        self.rows.insert(admitted, rows)
        self.row_ids.scatter_update(tf.IndexedSlices(admitted, rows))
        self.last_used.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), now), rows))
        self.allocated.assign_add(fresh)
        self.admissions.assign_add(tf.size(rows, tf.int64))
        self.evictions.assign_add(tf.size(evicted, tf.int64))
        return admitted, rows

    def _oldest_rows(self, wanted, now):
        """Up to `wanted` rows among 1..allocated not used at `now`, least recently used
        first, the lowest row first among equals."""
        row = tf.range(self.capacity, dtype=tf.int64)
        evictable = (self.last_used < now) & (row >= 1) & (row <= self.allocated)
        age = tf.where(evictable, self.last_used, tf.int64.max)
        k = tf.minimum(wanted, tf.reduce_sum(tf.cast(evictable, tf.int64)))
        _, oldest = tf.math.top_k(-age, k=tf.cast(k, tf.int32))  # stable: lower index first
        return tf.cast(oldest, tf.int64)

    def redraw(self, table, rows, seed: int) -> None:
        """Draw `rows` of `table` again, uniform in +-sqrt(1/table_rows) as every table starts.
        Each row's values are a hash of (seed, batch clock, its id, column): the same whatever
        the row, the order of admission or the rank that owns the id, and again the same for
        a resumed run."""
        bound = tf.sqrt(1.0 / self.table_rows)

        def draw():
            ids = tf.gather(self.row_ids, rows)
            values = keyed_uniform(ids, tf.shape(table)[1], seed, self.clock) * 2.0 - 1.0
            table.scatter_update(tf.IndexedSlices(tf.cast(values * bound, table.dtype), rows))
            return tf.constant(True)
        tf.cond(tf.size(rows) > 0, draw, lambda: tf.constant(False))

    # ---- state (checkpoints) ------------------------------------------------------------
    def state(self) -> dict:
        """Every array that decides future lookups, for a checkpoint."""
        keys, rows = self.rows.export()
        pending_keys, pending_counts = self.pending.export()
        return {"keys": keys.numpy(), "rows": rows.numpy(), "pending_keys": pending_keys.numpy(),
                "pending_counts": pending_counts.numpy(), "row_ids": self.row_ids.numpy(),
                "last_used": self.last_used.numpy(),
                "counters": np.array([self.allocated.numpy(), self.clock.numpy(),
                                      self.admissions.numpy(), self.evictions.numpy()])}

    def load(self, state: dict) -> None:
        for table in (self.rows, self.pending):
            keys, _ = table.export()
            table.remove(keys)
        self.rows.insert(tf.constant(state["keys"], tf.int64),
                         tf.constant(state["rows"], tf.int64))
        self.pending.insert(tf.constant(state["pending_keys"], tf.int64),
                            tf.constant(state["pending_counts"], tf.int64))
        self.row_ids.assign(state["row_ids"])
        self.last_used.assign(state["last_used"])
        for var, value in zip((self.allocated, self.clock, self.admissions, self.evictions),
                              state["counters"]):
            var.assign(int(value))


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def splitmix64(z):
    """SplitMix64's finaliser on uint64 tensors (multiplications wrap modulo 2**64)."""
    z = z + tf.constant(_GOLDEN, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(30, tf.uint64)))
    z = z * tf.constant(_MIX1, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(27, tf.uint64)))
    z = z * tf.constant(_MIX2, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


def keyed_uniform(ids, width, seed: int, clock):
    """[len(ids), width] floats in [0, 1), a pure function of (seed, clock, id, column) with
    24 random bits each."""
    salt = splitmix64(tf.bitcast(tf.stack([tf.cast(seed, tf.int64),
                                            tf.cast(clock, tf.int64)]), tf.uint64))
    key = splitmix64(tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(ids, tf.int64), tf.uint64),
                                             salt[0]))
    key = splitmix64(tf.bitwise.bitwise_xor(key, salt[1]))
    columns = tf.cast(tf.range(width), tf.uint64)
    bits = splitmix64(key[:, None] + columns[None, :])
    return tf.cast(tf.bitwise.right_shift(bits, tf.constant(40, tf.uint64)), tf.float32) \
        / float(1 << 24)
