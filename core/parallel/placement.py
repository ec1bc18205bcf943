"""The placement plan: which rank holds which tables, column slices or row ranges, its types
and the planner that makes it. The plan is a value computed by a pure function of the table
shapes, the world size and the planner's settings; the dataloader reads it (which
categorical files a rank opens) and the embedding layer reads it (which pieces a rank holds
and how ids and vectors travel). One process is a plan of world size 1.

Four kinds of placement (`SHARDING_KINDS`):
  table_wise     the whole table on one rank; that rank looks up the global batch's ids and
                 one all-to-all sends the vectors to the ranks holding the batch rows;
  column_wise    k slices of near-equal width on k different ranks, each as table-wise;
  row_wise       contiguous row ranges, rows·r//W .. rows·(r+1)//W on rank r; each rank
                 sends its local rows' ids to their owners (all-to-all of ids) and gets the
                 vectors back (all-to-all of vectors);
  data_parallel  replicated on every rank, looked up on the local rows, gradient rows
                 gathered from every rank.

Planner (`make_plan`), deterministic:
  1. kinds: a forced `sharding` applies to every table it can hold (row_wise needs at least
     one row per rank, column_wise at least two columns; other tables stay table_wise).
     `auto` replicates tables with at most `data_parallel_threshold` elements and splits a
     table with more than `column_slice_threshold` elements into
     k = min(world_size, dim, ceil(elements / threshold)) column slices; every other table
     is table-wise, the kind that exchanges the fewest bytes (see `exchange_bytes`:
     column and row pieces exchange as many vectors, row-wise also the ids; a replicated
     table gathers every rank's gradient rows on every rank, (W-1)/2 times a table-wise
     table's bytes, so `auto` replicates only what the threshold names);
  2. replicated tables and row ranges load every rank; the remaining pieces, largest first
     (ties: lower table id), each go to the rank holding the fewest bytes so far, preferring
     ranks that hold no other slice of the same table (ties: lowest rank);
  3. with a per-rank memory budget, a piece that does not fit there is an error, except
     under `auto`, where a whole table that does not fit the least loaded rank is split by
     columns into the fewest slices that fit the least loaded ranks (k <= min(W, dim)),
     else by rows over every rank; if that does not fit either, `PlanError` names the table
     and the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

BYTES_PER_ELEMENT = 4  # tables are stored in float32, also under mixed precision
ID_BYTES = 8           # row-wise ids travel as int64
SHARDING_KINDS = ("auto", "table_wise", "column_wise", "row_wise", "data_parallel")


class PlanError(ValueError):
    """No placement fits the per-rank memory budget (or the settings are contradictory)."""


@dataclass(frozen=True)
class TablePiece:
    """Rows [row_start, row_stop) and columns [col_start, col_stop) of a table of `rows`
    rows, held by `rank`. row_stop None means every row."""
    table: int
    rows: int
    col_start: int
    col_stop: int
    rank: int
    row_start: int = 0
    row_stop: int = field(default=None)

    def __post_init__(self):
        if self.row_stop is None:
            object.__setattr__(self, "row_stop", self.rows)

    @property
    def width(self) -> int:
        return self.col_stop - self.col_start

    @property
    def row_count(self) -> int:
        return self.row_stop - self.row_start

    @property
    def bytes(self) -> int:
        return self.row_count * self.width * BYTES_PER_ELEMENT


def local_rows(global_batch: int, rank: int, world_size: int) -> int:
    """Rows of the global batch a rank trains on (rank r: B·r//W .. B·(r+1)//W)."""
    return global_batch * (rank + 1) // world_size - global_batch * rank // world_size


@dataclass(frozen=True)
class PlacementPlan:
    world_size: int
    dim: int
    cardinalities: tuple
    pieces: tuple          # model-parallel pieces, sorted by (rank, table, col_start, row_start)
    replicated: tuple      # table ids held whole by every rank
    row_wise: tuple = ()   # table ids split by rows over every rank

    @property
    def num_tables(self) -> int:
        return len(self.cardinalities)

    def pieces_on(self, rank: int) -> list:
        return [p for p in self.pieces if p.rank == rank]

    def exchanged_pieces_on(self, rank: int) -> list:
        """The table-wise and column-wise pieces of a rank: those of the vector all-to-all."""
        return [p for p in self.pieces_on(rank) if p.table not in self.row_wise]

    def row_pieces_on(self, rank: int) -> list:
        return [p for p in self.pieces_on(rank) if p.table in self.row_wise]

    def pieces_of(self, table: int) -> list:
        return sorted((p for p in self.pieces if p.table == table),
                      key=lambda p: (p.col_start, p.row_start))

    def kind_of(self, table: int) -> str:
        if table in self.replicated:
            return "data_parallel"
        if table in self.row_wise:
            return "row_wise"
        return "column_wise" if len(self.pieces_of(table)) > 1 else "table_wise"

    def tables_read_by(self, rank: int) -> list:
        """Categorical features whose ids this rank reads (for the whole global batch): its
        table-wise and column pieces', and every replicated and row-wise table's (of which
        it uses its local rows)."""
        return sorted({p.table for p in self.pieces_on(rank)} | set(self.replicated)
                      | set(self.row_wise))

    def bytes_on(self, rank: int) -> int:
        replicated = sum(self.cardinalities[t] * self.dim for t in self.replicated)
        return sum(p.bytes for p in self.pieces_on(rank)) + replicated * BYTES_PER_ELEMENT

    def exchange_bytes(self, table: int, global_batch: int) -> int:
        """Bytes all ranks together send to other ranks per training step for this table
        (forward and backward). Table and column pieces: the holder's vectors for the other
        ranks' rows, and their gradients back. Row-wise: every id not owned by its rank
        (8 bytes) plus its vector and gradient, with ids spread uniformly over the rows
        (`row_wise_exchange_bytes` counts given ids exactly). Replicated: every rank's
        gradient rows (values and int64 indices) gathered by every other rank."""
        W, B, row_bytes = self.world_size, global_batch, self.dim * BYTES_PER_ELEMENT
        if table in self.replicated:
            return (W - 1) * B * (row_bytes + ID_BYTES)
        if table in self.row_wise:
            rows = self.cardinalities[table]
            remote = sum(local_rows(B, r, W) * (rows - p.row_count) / rows
                         for r in range(W) for p in self.pieces_of(table) if p.rank == r)
            return round(remote * (ID_BYTES + 2 * row_bytes))
        return sum(2 * (B - local_rows(B, p.rank, W)) * p.width * BYTES_PER_ELEMENT
                   for p in self.pieces_of(table))

    def row_wise_exchange_bytes(self, ids_by_table: dict, rank: int) -> int:
        """Bytes `rank` sends to other ranks in a step's row-wise exchanges, given each
        row-wise table's ids of the global batch: its local rows' ids owned elsewhere (the id
        forward, its gradient backward), and the vectors of its rows that other ranks ask for."""
        sent = 0
        for t in self.row_wise:
            ids = list(ids_by_table[t])
            start = len(ids) * rank // self.world_size
            stop = start + local_rows(len(ids), rank, self.world_size)
            piece = next(p for p in self.pieces_of(t) if p.rank == rank)
            for j, row in enumerate(ids):
                owned, local = piece.row_start <= row < piece.row_stop, start <= j < stop
                if local and not owned:
                    sent += ID_BYTES + self.dim * BYTES_PER_ELEMENT
                elif owned and not local:
                    sent += self.dim * BYTES_PER_ELEMENT
        return sent

    def alltoall_bytes_sent(self, rank: int, global_batch: int) -> int:
        """Bytes `rank` sends to other ranks per step through the vector all-to-all of table
        and column pieces (forward and backward)."""
        width = sum(p.width for p in self.exchanged_pieces_on(rank))
        return 2 * (global_batch - local_rows(global_batch, rank, self.world_size)) \
            * width * BYTES_PER_ELEMENT

    def describe(self, global_batch: int = None) -> str:
        """The plan as a table: table -> kind, ranks, bytes per rank (of this table), and with
        `global_batch` the bytes exchanged per step; then each rank's total."""
        lines = [f"placement plan: {self.num_tables} tables, dim {self.dim}, "
                 f"world size {self.world_size}"
                 + (f", global batch {global_batch}" if global_batch else "")]
        header = f"  {'table':>5}  {'rows':>13}  {'kind':<13}  {'ranks':<18}  {'MiB/rank':>10}"
        lines.append(header + ("  exchanged MiB/step" if global_batch else ""))
        total_exchange = 0
        for t, rows in enumerate(self.cardinalities):
            line = (f"  {t:>5}  {rows:>13,d}  {self.kind_of(t):<13}  {self._ranks_of(t):<18}"
                    f"  {self._table_bytes_per_rank(t) / 2**20:>10,.1f}")
            if global_batch:
                exchange = self.exchange_bytes(t, global_batch)
                total_exchange += exchange
                line += f"  {exchange / 2**20:>18,.2f}"
            lines.append(line)
        per_rank = [self.bytes_on(r) for r in range(self.world_size)]
        lines.append(f"  per rank: max {max(per_rank) / 2**30:,.3f} GiB, min "
                     f"{min(per_rank) / 2**30:,.3f} GiB, all ranks {sum(per_rank) / 2**30:,.3f} GiB")
        if self.world_size <= 16:
            lines += [f"  rank {r}: {b / 2**20:,.1f} MiB of tables" for r, b in enumerate(per_rank)]
        if global_batch:
            lines.append(f"  exchanged per step (all ranks, forward and backward): "
                         f"{total_exchange / 2**20:,.1f} MiB")
        return "\n".join(lines)

    def _ranks_of(self, table: int) -> str:
        if table in self.replicated or table in self.row_wise:
            return f"all {self.world_size}"
        return ",".join(str(p.rank) for p in self.pieces_of(table))

    def _table_bytes_per_rank(self, table: int) -> int:
        if table in self.replicated:
            return self.cardinalities[table] * self.dim * BYTES_PER_ELEMENT
        return max(p.bytes for p in self.pieces_of(table))


def make_plan(cardinalities, dim: int, world_size: int = 1, column_slice_threshold: int = 0,
              data_parallel_threshold: int = 0, sharding: str = "auto",
              memory_budget_bytes: int = 0, hashed_tables=()) -> PlacementPlan:
    """Placement of tables on ranks (see the module docstring). Thresholds count elements
    (rows x dim) and apply under `auto`; 0 turns slicing / replication / the budget off.
    hashed_tables: tables whose ids are dealt to ranks by a hash (dynamic tables, of which a
    rank holds a share of the rows, one of them its copy of the rare row): row-wise on
    several ranks whatever `sharding` says, with at least two rows per rank."""
    if world_size < 1:
        raise PlanError(f"world size must be >= 1, found {world_size}")
    if sharding not in SHARDING_KINDS:
        raise PlanError(f"--sharding must be one of {'|'.join(SHARDING_KINDS)}, found {sharding}")
    if sharding != "auto" and (column_slice_threshold or data_parallel_threshold):
        raise PlanError(f"--sharding {sharding} places every table itself: drop "
                        f"--column_slice_threshold / --data_parallel_threshold (auto only)")
    cardinalities = tuple(int(c) for c in cardinalities)
    kinds = [_kind(rows, dim, world_size, sharding, column_slice_threshold,
                   data_parallel_threshold) for rows in cardinalities]
    for table in hashed_tables if world_size > 1 else ():
        kinds[table] = (_hashed_kind(table, cardinalities[table], world_size), 0)
    placer = _Placer(cardinalities, dim, world_size, memory_budget_bytes, sharding == "auto")
    for table, (kind, _) in enumerate(kinds):
        if kind == "data_parallel":
            placer.replicate(table)
        elif kind == "row_wise":
            placer.split_rows(table)
    candidates = []
    for table, (kind, slices) in enumerate(kinds):
        if kind in ("table_wise", "column_wise"):
            bounds = [dim * i // slices for i in range(slices + 1)]
            candidates += [(table, bounds[i], bounds[i + 1]) for i in range(slices)]
    candidates.sort(key=lambda c: (-cardinalities[c[0]] * (c[2] - c[1]), c[0], c[1]))
    for table, c0, c1 in candidates:
        placer.place(table, c0, c1, whole=kinds[table][1] == 1)
    return placer.plan()


def _hashed_kind(table, rows: int, world_size: int) -> str:
    """A dynamic table on several ranks: row-wise, each rank's share holding its copy of the
    rare row and at least one row of its own."""
    if rows < 2 * world_size:
        raise PlanError(f"dynamic table {table} has {rows} rows: {world_size} ranks need at "
                        f"least 2 rows each")
    return "row_wise"


def _kind(rows: int, dim: int, world_size: int, sharding: str, column_slice_threshold: int,
          data_parallel_threshold: int) -> tuple:
    """(kind, column slices) of one table before placement."""
    if sharding == "data_parallel":
        return "data_parallel", 0
    if sharding == "row_wise" and world_size > 1 and rows >= world_size:
        return "row_wise", 0
    if sharding == "column_wise" and min(world_size, dim) > 1:
        return "column_wise", min(world_size, dim)
    if sharding != "auto":
        return "table_wise", 1
    elements = rows * dim
    if data_parallel_threshold and elements <= data_parallel_threshold:
        return "data_parallel", 0
    if column_slice_threshold and elements > column_slice_threshold:
        slices = min(world_size, dim, math.ceil(elements / column_slice_threshold))
        return ("column_wise" if slices > 1 else "table_wise"), slices
    return "table_wise", 1


class _Placer:
    """The per-rank loads while pieces are placed (step 2 and 3 of the module docstring)."""

    def __init__(self, cardinalities, dim, world_size, budget, may_split):
        self.cardinalities, self.dim, self.world_size = cardinalities, dim, world_size
        self.budget, self.may_split = budget, may_split
        self.load = [0] * world_size
        self.holders = {}
        self.pieces, self.replicated, self.row_wise = [], [], []

    def plan(self) -> PlacementPlan:
        pieces = sorted(self.pieces, key=lambda p: (p.rank, p.table, p.col_start, p.row_start))
        return PlacementPlan(self.world_size, self.dim, self.cardinalities, tuple(pieces),
                             tuple(sorted(self.replicated)), tuple(sorted(self.row_wise)))

    def _fits(self, rank: int, size: int) -> bool:
        return not self.budget or self.load[rank] + size <= self.budget

    def _add(self, piece: TablePiece) -> None:
        self.load[piece.rank] += piece.bytes
        self.holders.setdefault(piece.table, set()).add(piece.rank)
        self.pieces.append(piece)

    def replicate(self, table: int) -> None:
        size = self.cardinalities[table] * self.dim * BYTES_PER_ELEMENT
        rank = max(range(self.world_size), key=lambda r: (self.load[r], -r))
        if not self._fits(rank, size):
            self._refuse(table, "replicated", size, rank)
        self.replicated.append(table)
        self.load = [load + size for load in self.load]

    def _row_pieces(self, table: int) -> list:
        rows, W = self.cardinalities[table], self.world_size
        return [TablePiece(table, rows, 0, self.dim, r, rows * r // W, rows * (r + 1) // W)
                for r in range(W)]

    def split_rows(self, table: int) -> None:
        pieces = self._row_pieces(table)
        for p in pieces:
            if not self._fits(p.rank, p.bytes):
                self._refuse(table, "row_wise", p.bytes, p.rank)
        self.row_wise.append(table)
        for p in pieces:
            self._add(p)

    def place(self, table: int, c0: int, c1: int, whole: bool) -> None:
        rows = self.cardinalities[table]
        taken = self.holders.get(table, set())
        rank = min(range(self.world_size), key=lambda r: (r in taken, self.load[r], r))
        piece = TablePiece(table, rows, c0, c1, rank)
        if self._fits(rank, piece.bytes):
            self._add(piece)
        elif whole and self.may_split:
            self._split_to_fit(table)
        else:
            self._refuse(table, "table_wise" if whole else "column_wise", piece.bytes, rank)

    def _split_to_fit(self, table: int) -> None:
        """A whole table that fits no rank under `auto`: the fewest column slices that fit
        the least loaded ranks, else row ranges on every rank."""
        rows, dim = self.cardinalities[table], self.dim
        by_load = sorted(range(self.world_size), key=lambda r: (self.load[r], r))
        for k in range(2, min(self.world_size, dim) + 1):
            bounds = [dim * i // k for i in range(k + 1)]
            pieces = [TablePiece(table, rows, bounds[i], bounds[i + 1], by_load[i])
                      for i in range(k)]
            if all(self._fits(p.rank, p.bytes) for p in pieces):
                for p in pieces:
                    self._add(p)
                return
        if self.world_size > 1 and rows >= self.world_size:
            self.split_rows(table)
            return
        self._refuse(table, "table_wise", rows * dim * BYTES_PER_ELEMENT, by_load[0])

    def _refuse(self, table: int, kind: str, size: int, rank: int) -> None:
        raise PlanError(
            f"table {table} ({self.cardinalities[table]:,d} rows x {self.dim}) does not fit the "
            f"per-rank memory budget of {_size(self.budget)} on {self.world_size} rank(s): "
            f"{kind} needs {_size(size)} on rank {rank}, which already holds "
            f"{_size(self.load[rank])}")


def _size(n: int) -> str:
    return f"{n / 2**30:,.3f} GiB" if n >= 2**27 else f"{n:,d} bytes"


# ---- tables looked up on each rank's own batch rows (Wide & Deep, SIM) -------------------
# Their tables are read through routed lookups (core/parallel/rows.py): each rank sends its
# rows' ids to the rank owning them and gets the vectors back, whichever kind holds the rows.
# Replicating a table saves those three collectives per step, which outweigh gathering its
# gradient rows only for small tables: `auto` replicates tables of at most this many
# elements (4 MiB in float32) and splits the others by rows.
ROUTED_REPLICATED_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class RoutedTable:
    """Where one table of a routed family lives: whole on every rank (`data_parallel`), or
    split in contiguous row ranges, rank r holding rows bounds[r]..bounds[r+1] (`row_wise`:
    rows·r//W .. rows·(r+1)//W; `table_wise`: every row on one rank, none elsewhere)."""
    kind: str
    rows: int
    bounds: tuple = ()  # world_size + 1 row bounds; () when every rank holds every row

    @property
    def sharded(self) -> bool:
        return bool(self.bounds)

    def rows_on(self, rank: int) -> tuple:
        """(row_start, row_stop) of the rows `rank` holds."""
        return (self.bounds[rank], self.bounds[rank + 1]) if self.bounds else (0, self.rows)

    def ranks(self) -> list:
        return [r for r in range(len(self.bounds) - 1) if self.bounds[r] < self.bounds[r + 1]]


def plan_routed_tables(cardinalities, widths, world_size: int, sharding: str = "auto",
                       replicated_elements: int = ROUTED_REPLICATED_ELEMENTS,
                       hashed_tables=()) -> tuple:
    """A RoutedTable per table of `cardinalities` rows x `widths` columns (tables split
    alike, such as a Wide & Deep feature's wide and deep tables, count as one of their
    summed width). data_parallel, and any kind in one process: every table whole.
    row_wise: tables of at least one row per rank by rows, the rest table_wise. table_wise:
    make_plan places the tables, largest first on the least loaded rank. auto: tables of at
    most `replicated_elements` elements replicated, the others row_wise. column_wise is
    refused: a routed lookup would send each id to every slice's rank, where row_wise spreads
    the same rows over the ranks at one id each. hashed_tables: dynamic tables, split by rows
    whatever `sharding` says (as make_plan's), their ids dealt to the ranks by a hash."""
    if sharding not in SHARDING_KINDS:
        raise PlanError(f"--sharding must be one of {'|'.join(SHARDING_KINDS)}, found {sharding}")
    if sharding == "column_wise":
        raise PlanError("--sharding column_wise is not offered where each rank looks up its own "
                        "batch rows (Wide & Deep, SIM): column slices would send every id to "
                        "each slice's rank; use row_wise (rows spread over every rank), "
                        "table_wise (whole tables spread over the ranks), data_parallel or auto")
    cardinalities, widths = [int(c) for c in cardinalities], [int(w) for w in widths]
    kinds = []
    for rows, width in zip(cardinalities, widths):
        kind = sharding
        if world_size == 1 or (sharding == "auto" and rows * width <= replicated_elements):
            kind = "data_parallel"
        elif sharding == "auto":
            kind = "row_wise"
        if kind == "row_wise" and rows < world_size:
            kind = "table_wise"
        kinds.append(kind)
    for table in hashed_tables if world_size > 1 else ():
        kinds[table] = _hashed_kind(table, cardinalities[table], world_size)
    whole = [t for t, kind in enumerate(kinds) if kind == "table_wise"]
    # make_plan weighs a table by rows x dim: each table as rows·width rows of width 1
    owners = make_plan([cardinalities[t] * widths[t] for t in whole], 1, world_size,
                       sharding="table_wise") if whole else None
    tables = []
    for t, (kind, rows) in enumerate(zip(kinds, cardinalities)):
        if kind == "data_parallel":
            tables.append(RoutedTable(kind, rows))
        elif kind == "row_wise":
            tables.append(RoutedTable(kind, rows, tuple(rows * r // world_size
                                                        for r in range(world_size + 1))))
        else:
            owner = owners.pieces_of(whole.index(t))[0].rank
            tables.append(RoutedTable(kind, rows, tuple(0 if r <= owner else rows
                                                        for r in range(world_size + 1))))
    return tuple(tables)


def describe_routed_tables(names, tables, widths, world_size: int) -> str:
    """The plan of plan_routed_tables as a table: name, rows x width, kind, ranks holding
    rows, MiB on each of them."""
    lines = [f"placement plan: {len(tables)} tables, world size {world_size}",
             f"  {'table':<24}  {'rows':>11}  {'width':>5}  {'kind':<13}  {'ranks':<10}  "
             f"{'MiB/rank':>9}"]
    for name, table, width in zip(names, tables, widths):
        ranks = table.ranks() if table.sharded else list(range(world_size))
        most = max(b - a for a, b in (table.rows_on(r) for r in ranks))
        shown = f"all {world_size}" if len(ranks) == world_size else ",".join(map(str, ranks))
        lines.append(f"  {name:<24}  {table.rows:>11,d}  {width:>5}  {table.kind:<13}  "
                     f"{shown:<10}  {most * width * BYTES_PER_ELEMENT / 2**20:>9,.2f}")
    return "\n".join(lines)
