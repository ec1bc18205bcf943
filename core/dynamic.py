"""Open-vocabulary (dynamic) embedding tables: any int64 id gets a row of its own as training
sees it, up to the table's capacity, with no dictionary counted in advance.

Row 0 of a dynamic table is its rare row: every id without a row of its own reads it (and
trains it, as the preprocessing's shared id of rare values is trained). Training a batch,
in this order (the semantics `tests/test_dynamic.py` checks against a pure-Python model):
  1. the batch's distinct ids, in order of first appearance, and how often each occurs;
  2. an id that holds a row reads it, and the row is marked used at this batch;
  3. any other id adds its occurrences to its pending count (0 when the id is not held in
     the pending ring, 5.); ids whose count reaches `min_count` are admitted, in order of
     first appearance: each takes the lowest row never used, or, when none is left, the
     least recently used row not used by this batch (ties: the lowest row; that row's id is
     forgotten, `eviction: lru`). An admitted row starts anew: its vector is drawn again
     from the table's initializer and the optimizer's slots of the row are zeroed (the
     caller does both, given the new rows);
  4. ids not admitted (count below `min_count`, or every row used by this batch) read row 0;
  5. (min_count > 1) the pending ring, P = `pending_per_row` x capacity slots, holds ids
     and their counts in the order they started waiting. An id held there keeps its slot
     and its count is updated in place (0 once admitted). Every other id not admitted
     starts waiting: in order of first appearance, each is written at the ring's next slot,
     overwriting the oldest id, which is forgotten (of more than P such ids in one batch,
     the last P stay).
Evaluation and serving never insert: an id with a row reads it, any other reads row 0.

Against counts kept for every id, the ring only forgets: an id that reaches min_count before
P more ids start waiting after it counts exactly as there; one whose occurrences spread
wider is admitted later or never, never earlier. Memory is fixed by capacity and P whatever
the number of distinct ids seen, and so is the checkpoint (the ring is saved oldest first and
loaded compacted, which changes no future: nothing leaves the ring but its oldest id).

The id -> row and id -> ring slot maps are TensorFlow's MutableHashTable (a compiled kernel).
Memory per row: the vector and optimizer slots, 8 bytes of row -> id, 8 bytes of last use,
and about 50 bytes of map entry; per pending slot: 16 bytes of id and count and about 50
bytes of map entry (README: "Open vocabulary: dynamic tables").
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
            # the pending ring (module doc, 5.): id -> slot, and each slot's id and count
            self.pending_slots = spec.pending_per_row * self.capacity if spec.min_count > 1 \
                else 0
            self.pending = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, NO_ROW)
            self.pending_ids = tf.Variable(tf.zeros([self.pending_slots], tf.int64),
                                           trainable=False, name="pending_ids")
            self.pending_counts = tf.Variable(tf.zeros([self.pending_slots], tf.int64),
                                              trainable=False, name="pending_counts")
            self.cursor = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor")
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
        ids that found no row) keep or start their counts in the pending ring."""
        slot = tf.reshape(self.pending.lookup(new_ids), [-1])
        held = slot != NO_ROW
        seen = tf.where(held, tf.gather(self.pending_counts, tf.maximum(slot, 0)), 0) + counts
        ready = seen >= self.spec.min_count
        admitted, new_rows = self._admit(tf.boolean_mask(new_ids, ready), now)
        ready_rank = tf.cumsum(tf.cast(ready, tf.int32)) - 1
        taken = tf.logical_and(ready, ready_rank < tf.size(admitted))
        self.pending_counts.scatter_update(tf.IndexedSlices(
            tf.boolean_mask(tf.where(taken, tf.zeros_like(seen), seen), held),
            tf.boolean_mask(slot, held)))
        waiting = ~(held | taken)
        self._start_waiting(tf.boolean_mask(new_ids, waiting), tf.boolean_mask(seen, waiting))
        return admitted, new_rows

    def _start_waiting(self, ids, counts):
        """Write ids (not held) and their counts at the ring's next slots, forgetting the ids
        held there; of more than the ring's slots, the last ones stay."""
        size = self.pending_slots
        n = tf.size(ids, tf.int64)
        kept = tf.minimum(n, size)
        ids, counts = ids[n - kept:], counts[n - kept:]
        slots = (self.cursor + n - kept + tf.range(kept)) % size
        old = tf.gather(self.pending_ids, slots)
        # a slot still written (at the start, none) names an id whose map entry is that slot
        forgotten = tf.reshape(self.pending.lookup(old), [-1]) == slots
        self.pending.remove(tf.boolean_mask(old, forgotten))
        self.pending_ids.scatter_update(tf.IndexedSlices(ids, slots))
        self.pending_counts.scatter_update(tf.IndexedSlices(counts, slots))
        self.pending.insert(ids, slots)
        self.cursor.assign((self.cursor + n) % size)

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
        """Every array that decides future lookups, for a checkpoint (the pending ring's ids
        and counts oldest first: their order decides which is forgotten next)."""
        keys, rows = self.rows.export()
        pending_keys, pending_counts = self._ring()
        return {"keys": keys.numpy(), "rows": rows.numpy(), "pending_keys": pending_keys,
                "pending_counts": pending_counts, "row_ids": self.row_ids.numpy(),
                "last_used": self.last_used.numpy(),
                "counters": np.array([self.allocated.numpy(), self.clock.numpy(),
                                      self.admissions.numpy(), self.evictions.numpy()])}

    def _ring(self) -> tuple:
        """(ids, counts) the pending ring holds, oldest first."""
        order = (int(self.cursor.numpy()) + np.arange(self.pending_slots)) % \
            max(self.pending_slots, 1)
        ids = self.pending_ids.numpy()[order]
        held = self.pending.lookup(tf.constant(ids, tf.int64)).numpy() == order
        return ids[held], self.pending_counts.numpy()[order][held]

    def load(self, state: dict) -> None:
        """Take a state (of any pending ring: of more ids than this ring's slots, the last
        ones stay)."""
        for table in (self.rows, self.pending):
            keys, _ = table.export()
            table.remove(keys)
        self.rows.insert(tf.constant(state["keys"], tf.int64),
                         tf.constant(state["rows"], tf.int64))
        self._load_ring(np.asarray(state["pending_keys"], np.int64),
                        np.asarray(state["pending_counts"], np.int64))
        self.row_ids.assign(state["row_ids"])
        self.last_used.assign(state["last_used"])
        for var, value in zip((self.allocated, self.clock, self.admissions, self.evictions),
                              state["counters"]):
            var.assign(int(value))

    def _load_ring(self, ids, counts) -> None:
        """The ring holding ids (oldest first) at slots 0, 1, ... and the next write after
        them."""
        keep = slice(max(len(ids) - self.pending_slots, 0), None)
        ids, counts = ids[keep], counts[keep]
        slots = np.arange(len(ids), dtype=np.int64)
        self.pending_ids.assign(np.pad(ids, (0, self.pending_slots - len(ids))))
        self.pending_counts.assign(np.pad(counts, (0, self.pending_slots - len(ids))))
        self.pending.insert(tf.constant(ids), tf.constant(slots))
        self.cursor.assign(len(ids) % max(self.pending_slots, 1))


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
