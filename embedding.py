"""Embedding tables: where they live (the placement plan) and how lookups reach the batch.

The placement plan is a value computed by a pure function of the table shapes and the world
size; the dataloader reads it (which categorical files a rank opens) and the embedding layer
reads it (which tables or column slices a rank holds). One process is a plan of world size 1.

Strategy (deterministic, memory balanced):
  1. tables with at most `data_parallel_threshold` elements are replicated on every rank
     (looked up on the local batch; their gradients are summed across ranks);
  2. a table with more than `column_slice_threshold` elements is split by columns into
     k = min(world_size, dim, ceil(elements / threshold)) slices of near-equal width;
  3. the remaining pieces, largest first (ties: lower table id), each go to the rank holding
     the fewest bytes so far, preferring ranks that hold no other slice of the same table
     (ties: lowest rank).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import tensorflow as tf

from datasets import local_row_bounds
from initializers import embedding_uniform_chunks

BYTES_PER_ELEMENT = 4  # tables are stored in float32, also under mixed precision
# the lookup exchange's collectives (forward, backward), fixed names on every rank
ALLTOALL_NAMES = ("embedding_alltoall", "embedding_alltoall_grad")


def table_variable(rows: int, dim: int, seed: int, table: int, col_start: int = 0,
                   col_stop: int = None, trainable: bool = True, name: str = None) -> tf.Variable:
    """Columns [col_start, col_stop) of embedding table `table` as a plain tf.Variable (looked
    up with tf.nn.embedding_lookup, updated by sparse row updates), initialised uniform in
    +-sqrt(1/rows). Filled in row chunks: a whole numpy copy would double peak host memory."""
    col_stop = dim if col_stop is None else col_stop
    var = tf.Variable(tf.zeros([rows, col_stop - col_start]), trainable=trainable, name=name)
    for start, block in embedding_uniform_chunks(rows, dim, seed, table, col_start, col_stop):
        # the raw op writes in place; var[a:b].assign() first reads the variable, and that
        # shared buffer makes the write copy the whole table
        tf.raw_ops.ResourceStridedSliceAssign(ref=var.handle, begin=[start],
                                              end=[start + block.shape[0]], strides=[1],
                                              value=block)
    return var


@dataclass(frozen=True)
class TablePiece:
    table: int
    rows: int
    col_start: int
    col_stop: int
    rank: int

    @property
    def width(self) -> int:
        return self.col_stop - self.col_start

    @property
    def bytes(self) -> int:
        return self.rows * self.width * BYTES_PER_ELEMENT


@dataclass(frozen=True)
class PlacementPlan:
    world_size: int
    dim: int
    cardinalities: tuple
    pieces: tuple          # model-parallel pieces, sorted by (rank, table, col_start)
    replicated: tuple      # table ids held whole by every rank

    @property
    def num_tables(self) -> int:
        return len(self.cardinalities)

    def pieces_on(self, rank: int) -> list:
        return [p for p in self.pieces if p.rank == rank]

    def pieces_of(self, table: int) -> list:
        return sorted((p for p in self.pieces if p.table == table), key=lambda p: p.col_start)

    def tables_read_by(self, rank: int) -> list:
        """Categorical features whose ids this rank reads (for the whole global batch)."""
        return sorted({p.table for p in self.pieces_on(rank)} | set(self.replicated))

    def bytes_on(self, rank: int) -> int:
        replicated = sum(self.cardinalities[t] * self.dim for t in self.replicated)
        return sum(p.bytes for p in self.pieces_on(rank)) + replicated * BYTES_PER_ELEMENT

    def describe(self) -> str:
        lines = [f"placement plan: {self.num_tables} tables, dim {self.dim}, "
                 f"world size {self.world_size}"]
        for t, rows in enumerate(self.cardinalities):
            if t in self.replicated:
                where = "replicated on every rank"
            else:
                where = ", ".join(f"rank {p.rank} cols {p.col_start}:{p.col_stop}"
                                  if len(self.pieces_of(t)) > 1 else f"rank {p.rank}"
                                  for p in self.pieces_of(t))
            lines.append(f"  table {t:3d}  {rows:>12,d} rows  -> {where}")
        for r in range(self.world_size):
            lines.append(f"  rank {r}: {self.bytes_on(r) / 2**20:,.1f} MiB of tables")
        return "\n".join(lines)


def make_plan(cardinalities, dim: int, world_size: int = 1, column_slice_threshold: int = 0,
              data_parallel_threshold: int = 0) -> PlacementPlan:
    """Placement of tables on ranks (see the module docstring). Thresholds count elements
    (rows x dim); 0 turns slicing / replication off."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, found {world_size}")
    cardinalities = tuple(int(c) for c in cardinalities)
    replicated, candidates = [], []
    for table, rows in enumerate(cardinalities):
        elements = rows * dim
        if data_parallel_threshold and elements <= data_parallel_threshold:
            replicated.append(table)
            continue
        slices = 1
        if column_slice_threshold and elements > column_slice_threshold:
            slices = min(world_size, dim, math.ceil(elements / column_slice_threshold))
        bounds = [dim * i // slices for i in range(slices + 1)]
        candidates += [(table, rows, bounds[i], bounds[i + 1]) for i in range(slices)]
    candidates.sort(key=lambda c: (-c[1] * (c[3] - c[2]), c[0], c[2]))
    load = [0] * world_size
    holders = {}
    pieces = []
    for table, rows, c0, c1 in candidates:
        taken = holders.setdefault(table, set())
        rank = min(range(world_size), key=lambda r: (r in taken, load[r], r))
        taken.add(rank)
        load[rank] += rows * (c1 - c0) * BYTES_PER_ELEMENT
        pieces.append(TablePiece(table, rows, c0, c1, rank))
    pieces.sort(key=lambda p: (p.rank, p.table, p.col_start))
    return PlacementPlan(world_size, dim, cardinalities, tuple(pieces), tuple(replicated))


class Communicator:
    """Collectives used by the embedding layer and the training loop; this one is a single
    process (world size 1), where every collective is the identity."""

    rank = 0
    size = 1

    def alltoall(self, tensor, splits):
        return tensor

    def allreduce_sum(self, tensor, name=None):
        return tensor

    def gather_to_root(self, array):
        """Every rank's 1-D array concatenated in rank order on rank 0 (empty elsewhere)."""
        return array

    def broadcast_from_root(self, array):
        return array

    def broadcast_variables(self, variables):
        pass

    def barrier(self):
        pass

    def waiting(self, what: str, step: int):
        """Context of a wait on collectives (what, at which step): bounded by the stall
        limit in several processes; nothing to bound in one."""
        return contextlib.nullcontext()


class EmbeddingLayer(tf.Module):
    """This rank's share of the tables, and the lookup that returns, for the local batch
    rows, one [b_local, dim] vector per table in table order ([b_local, T, dim])."""

    def __init__(self, plan: PlacementPlan, comm: Communicator = None, seed: int = 0,
                 trainable: bool = True, offload_threshold_bytes: int = 0, name="embeddings"):
        """offload_threshold_bytes: tables (pieces) larger than this live in host memory
        (matters on GPU machines only; 0 keeps every table on the default device)."""
        super().__init__(name=name)
        self.plan, self.comm = plan, comm or Communicator()
        self.local_pieces = plan.pieces_on(self.comm.rank)
        self.read_tables = plan.tables_read_by(self.comm.rank)

        def variable(rows, table, c0, c1, name):
            offload = offload_threshold_bytes and rows * (c1 - c0) * BYTES_PER_ELEMENT \
                > offload_threshold_bytes
            with tf.device("/CPU:0" if offload else None):
                return table_variable(rows, plan.dim, seed, table, c0, c1, trainable, name)

        with self.name_scope:
            if self.comm.size > 1 and not self.local_pieces:
                self.exchange_anchor = tf.Variable(tf.zeros([1, 0]), name="exchange_anchor")
            self.piece_variables = [
                variable(p.rows, p.table, p.col_start, p.col_stop,
                         f"table_{p.table}_cols_{p.col_start}") for p in self.local_pieces]
            self.replicated_variables = {
                t: variable(plan.cardinalities[t], t, 0, plan.dim, f"table_{t}_replicated")
                for t in plan.replicated}

    def all_variables(self):
        """(description, variable) pairs: model-parallel pieces then replicated tables."""
        return ([(p, v) for p, v in zip(self.local_pieces, self.piece_variables)]
                + [(t, v) for t, v in self.replicated_variables.items()])

    def local_rows(self, global_rows):
        """(start, stop) of this rank's rows within a global batch of `global_rows`."""
        return local_row_bounds(global_rows, self.comm.rank, self.comm.size)

    def __call__(self, categorical, global_rows):
        """categorical: id tensors [B_global] for self.read_tables, in that order;
        global_rows: B_global (given, since a rank may read no ids at all)."""
        return self.lookup(categorical, global_rows)[0]

    def lookup(self, categorical, global_rows):
        """(embedded, extra gradient sources). A training step differentiates `embedded` with
        respect to the tables and the extra sources: a rank without model-parallel pieces
        must still send the backward all-to-all, so its (empty) all-to-all input is looked
        up from a zero-width variable, the extra source."""
        ids = dict(zip(self.read_tables, categorical))
        vectors, sources = {}, []
        if self.comm.size == 1:
            for p, var in zip(self.local_pieces, self.piece_variables):
                vectors.setdefault(p.table, []).append(tf.nn.embedding_lookup(var, ids[p.table]))
        else:
            vectors, sources = self._exchange(ids, global_rows)
        start, stop = self.local_rows(global_rows)
        for t, var in self.replicated_variables.items():
            vectors[t] = [tf.nn.embedding_lookup(var, ids[t][start:stop])]
        per_table = [v[0] if len(v) == 1 else tf.concat(v, axis=1)
                     for _, v in sorted(vectors.items())]
        if not per_table:  # a dataset without categorical features
            return tf.zeros([stop - start, 0, self.plan.dim]), sources
        return tf.stack(per_table, axis=1), sources

    def _exchange(self, ids, global_batch):
        """Model-parallel lookups for the global batch -> each rank's local rows (all-to-all);
        also the extra gradient sources of lookup()."""
        plan, comm = self.plan, self.comm
        bounds = [global_batch * r // comm.size for r in range(comm.size + 1)]
        local = [tf.nn.embedding_lookup(var, ids[p.table])
                 for p, var in zip(self.local_pieces, self.piece_variables)]
        my_width = sum(p.width for p in self.local_pieces)
        sources = []
        if local:
            send = tf.concat(local, axis=1)  # [B_global, my_width]
        else:
            # a variable, not a constant: gradients w.r.t. a watched tensor inside
            # tf.function skipped the backward all-to-all (and the other ranks waited)
            send = tf.nn.embedding_lookup(self.exchange_anchor,
                                          tf.zeros([global_batch], tf.int32))
            sources = [self.exchange_anchor]
        # rows bounds[r]:bounds[r+1] go to rank r, flattened
        send_flat = tf.reshape(send, [-1])
        splits = tf.stack([(bounds[r + 1] - bounds[r]) * my_width for r in range(comm.size)])
        received = comm.alltoall(send_flat, splits)
        my_rows = bounds[comm.rank + 1] - bounds[comm.rank]
        vectors, offset = {}, 0
        for source in range(comm.size):
            pieces = plan.pieces_on(source)
            width = sum(p.width for p in pieces)
            block = tf.reshape(received[offset:offset + my_rows * width], [my_rows, width])
            offset += my_rows * width
            col = 0
            for p in pieces:
                vectors.setdefault(p.table, []).append((p.col_start, block[:, col:col + p.width]))
                col += p.width
        return {t: [v for _, v in sorted(parts, key=lambda x: x[0])]
                for t, parts in vectors.items()}, sources
