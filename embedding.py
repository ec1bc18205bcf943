"""DLRM's embedding layer as the design card names it: this rank's share of the tables (as the
placement plan of core/parallel/placement.py says) and the all-to-all that brings every
table's lookups to the rank holding the batch rows.
"""
from __future__ import annotations

from types import MappingProxyType

import tensorflow as tf

from core.dynamic import DynamicTable
from core.initializers import embedding_uniform_chunks
from core.layers import table_variable
from core.parallel.comm import Communicator
from core.parallel.placement import PlacementPlan, TablePiece
from core.parallel.rows import hash_owner, range_owner, routed_lookup
from core.sources import local_row_bounds


class EmbeddingLayer(tf.Module):
    """This rank's share of the tables, and the lookup that returns, for the local batch
    rows, one [b_local, dim] tensor per table in table order (a list, not stacked: the
    interaction stacks them with the bottom MLP's output in one copy, and the gradient of
    each reaches its table's sparse update without slicing a stacked gradient)."""

    def __init__(self, plan: PlacementPlan, comm: Communicator = None, seed: int = 0,
                 trainable: bool = True, offload_threshold_bytes: int = 0, dynamic=(),
                 name="embeddings"):
        """offload_threshold_bytes: tables (pieces) larger than this live in host memory
        (matters on GPU machines only; 0 keeps every table on the default device).
        dynamic: per table a DynamicSpec (an open-vocabulary table) or None. On several
        processes a dynamic table is row-wise: each rank holds the rows of the ids its hash
        names, row 0 of every share a copy of the rare row (the trainer sums its gradient
        across ranks)."""
        super().__init__(name=name)
        self.plan, self.comm, self.seed = plan, comm or Communicator(), seed
        dynamic = {t: s for t, s in enumerate(dynamic) if s is not None}
        if self.comm.size > 1 and not set(dynamic) <= set(plan.row_wise):
            raise ValueError(f"dynamic tables {sorted(dynamic)} must be planned row-wise on "
                             f"{self.comm.size} processes (make_plan's hashed_tables)")
        # called with (table variable, rows) when a dynamic table gives rows to new ids: the
        # optimizer zeroes their slots (DlrmTrainer registers it)
        self.new_rows_hooks = []
        self.local_pieces = plan.pieces_on(self.comm.rank)
        self.read_tables = plan.tables_read_by(self.comm.rank)

        def variable(p, name):
            offload = offload_threshold_bytes and p.bytes > offload_threshold_bytes
            with tf.device("/CPU:0" if offload else None):
                return table_variable(p.rows, plan.dim, seed, p.table, p.col_start, p.col_stop,
                                      trainable, name, p.row_start, p.row_stop)

        with self.name_scope:
            if self.comm.size > 1 and not plan.exchanged_pieces_on(self.comm.rank):
                self.exchange_anchor = tf.Variable(tf.zeros([1, 0]), name="exchange_anchor")
            self.piece_variables = [
                variable(p, f"table_{p.table}_cols_{p.col_start}_rows_{p.row_start}")
                for p in self.local_pieces]
            self.replicated_variables = {
                t: variable(TablePiece(t, plan.cardinalities[t], 0, plan.dim, self.comm.rank),
                            f"table_{t}_replicated")
                for t in plan.replicated}
            # a list, saved with a SavedModel (which refuses dicts with int keys), and a
            # read-only view by table id
            self.dynamic_tables = [DynamicTable(self._share_rows(t), s, f"dynamic_{t}",
                                                plan.cardinalities[t])
                                   for t, s in dynamic.items()]
            self.dynamic = MappingProxyType(dict(zip(dynamic, self.dynamic_tables)))
        for t in self.dynamic:
            if t in plan.row_wise:  # every share's row 0 starts as the whole table's row 0
                _, row = next(embedding_uniform_chunks(plan.cardinalities[t], plan.dim, seed, t,
                                                       row_stop=1))
                self.table_variable(t).scatter_update(tf.IndexedSlices(row, [0]))

    def all_variables(self):
        """(description, variable) pairs: model-parallel pieces then replicated tables."""
        return ([(p, v) for p, v in zip(self.local_pieces, self.piece_variables)]
                + [(t, v) for t, v in self.replicated_variables.items()])

    def local_rows(self, global_rows):
        """(start, stop) of this rank's rows within a global batch of `global_rows`."""
        return local_row_bounds(global_rows, self.comm.rank, self.comm.size)

    def lookup(self, categorical, global_rows, training: bool):
        """categorical: id tensors [B_global] for self.read_tables, in that order;
        global_rows: B_global (given, since a rank may read no ids at all). Returns
        (embedded, extra gradient sources). A training step differentiates `embedded` with
        respect to the tables and the extra sources: a rank without model-parallel pieces
        must still send the backward all-to-all, so its (empty) all-to-all input is looked
        up from a zero-width variable, the extra source. Training lookups of a dynamic table
        give rows to new ids; other lookups read unknown ids from its rare row."""
        ids = dict(zip(self.read_tables, categorical))
        for t, table in self.dynamic.items():
            if t not in self.plan.row_wise:
                ids[t] = self._train_rows(t, ids[t]) if training else table.lookup(ids[t])
        vectors, sources = {}, []
        if self.comm.size == 1:
            for p, var in zip(self.local_pieces, self.piece_variables):
                vectors.setdefault(p.table, []).append(tf.nn.embedding_lookup(var, ids[p.table]))
        elif any(p.table not in self.plan.row_wise for p in self.plan.pieces):
            vectors, sources = self._exchange(ids, global_rows)
        start, stop = self.local_rows(global_rows)
        for t, var in self.replicated_variables.items():
            vectors[t] = [tf.nn.embedding_lookup(var, ids[t][start:stop])]
        for t in self.plan.row_wise:
            vectors[t] = [self._routed(t, ids[t][start:stop], training)]
        per_table = [v[0] if len(v) == 1 else tf.concat(v, axis=1)
                     for _, v in sorted(vectors.items())]
        return per_table, sources

    def _train_rows(self, t, ids):
        """Rows of a dynamic table's ids; rows given to new ids start anew (vector redrawn,
        optimizer slots zeroed) before this step reads them."""
        rows, new_rows = self.dynamic[t].train_lookup(ids)
        var = self.table_variable(t)
        self.dynamic[t].redraw(var, new_rows, self.seed * 1000 + t)
        for hook in self.new_rows_hooks:
            hook(var, new_rows)
        return rows

    def _share_rows(self, t) -> int:
        """Rows of this rank's share of a dynamic table (the whole table in one process)."""
        if t in self.replicated_variables:
            return self.plan.cardinalities[t]
        return int(self.table_variable(t).shape[0])

    def table_variable(self, t):
        """This rank's variable of table t (a one-process table or a row-wise share)."""
        if t in self.replicated_variables:
            return self.replicated_variables[t]
        return next(v for p, v in zip(self.local_pieces, self.piece_variables) if p.table == t)

    def _routed(self, t, ids, training: bool):
        """Lookups of a row-wise table's ids on this rank's batch rows, from their owners
        (a dynamic table's owners map the ids they get, and admit new ones in training)."""
        piece = next(p for p in self.local_pieces if p.table == t)

        def local_rows(asked):
            if t not in self.dynamic:
                return asked - piece.row_start
            return self._train_rows(t, asked) if training else self.dynamic[t].lookup(asked)
        owners = hash_owner(self.comm.size) if t in self.dynamic else \
            range_owner([p.row_start for p in self.plan.pieces_of(t)])
        return routed_lookup(self.comm, [self.table_variable(t)], ids, owners, local_rows,
                             name=row_wise_name(t))[0]

    def _exchange(self, ids, global_batch):
        """Model-parallel lookups for the global batch -> each rank's local rows (all-to-all);
        also the extra gradient sources of lookup()."""
        plan, comm = self.plan, self.comm
        bounds = [local_row_bounds(global_batch, r, comm.size)[0] for r in range(comm.size + 1)]
        local = [tf.nn.embedding_lookup(var, ids[p.table])
                 for p, var in zip(self.local_pieces, self.piece_variables)
                 if p.table not in plan.row_wise]
        my_width = sum(p.width for p in plan.exchanged_pieces_on(comm.rank))
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
            pieces = plan.exchanged_pieces_on(source)
            width = sum(p.width for p in pieces)
            block = tf.reshape(received[offset:offset + my_rows * width], [my_rows, width])
            offset += my_rows * width
            col = 0
            for p in pieces:
                vectors.setdefault(p.table, []).append((p.col_start, block[:, col:col + p.width]))
                col += p.width
        return {t: [v for _, v in sorted(parts, key=lambda x: x[0])]
                for t, parts in vectors.items()}, sources


def row_wise_name(table: int) -> str:
    """The collectives of a row-wise table's lookup are named after it (core/parallel/rows.py)."""
    return f"row_wise_table_{table}"
