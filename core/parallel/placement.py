"""The placement plan: which rank holds which tables or column slices, its types and the
planner that makes it. The plan is a value computed by a pure function of the table shapes
and the world size; the dataloader reads it (which categorical files a rank opens) and the
embedding layer reads it (which tables or column slices a rank holds). One process is a plan
of world size 1.

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

import math
from dataclasses import dataclass

BYTES_PER_ELEMENT = 4  # tables are stored in float32, also under mixed precision


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
