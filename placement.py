"""Placement plan types: which rank holds which tables or column slices. A plan is computed
by a family's planner (DLRM: embedding.make_plan) and read by the dataloader (which
categorical files a rank opens) and the embedding layer (which tables a rank holds)."""
from __future__ import annotations

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
