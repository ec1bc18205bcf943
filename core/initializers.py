"""Deterministic weight initialisers (numpy, seeded per variable).

Every variable draws from its own generator keyed by (seed, variable id), so the initial
model is the same whatever the world size or placement of the tables.
"""
from __future__ import annotations

import numpy as np

TABLE_INIT_CHUNK_ROWS = 65536


def glorot_normal(fan_in: int, fan_out: int, seed: int, key: int) -> np.ndarray:
    rng = np.random.default_rng([seed, key])
    std = np.sqrt(2.0 / (fan_in + fan_out))
    return (rng.standard_normal((fan_in, fan_out)) * std).astype(np.float32)


def bias_normal(units: int, seed: int, key: int) -> np.ndarray:
    rng = np.random.default_rng([seed, key])
    return (rng.standard_normal(units) * np.sqrt(1.0 / units)).astype(np.float32)


def embedding_uniform_chunks(rows: int, dim: int, seed: int, table: int, col_start: int = 0,
                             col_stop: int = None, row_start: int = 0, row_stop: int = None):
    """Rows [row_start, row_stop) and columns [col_start, col_stop) of table `table`, uniform
    in +-sqrt(1/rows), as (first row relative to row_start, block) pairs of at most
    TABLE_INIT_CHUNK_ROWS rows.

    One generator per chunk of the whole table, so a slice of rows or columns equals the same
    part of the whole table and no caller ever needs the whole table in numpy."""
    col_stop = dim if col_stop is None else col_stop
    row_stop = rows if row_stop is None else row_stop
    bound = np.float32(np.sqrt(1.0 / rows))
    first_chunk = row_start // TABLE_INIT_CHUNK_ROWS
    for chunk, start in enumerate(range(0, rows, TABLE_INIT_CHUNK_ROWS)):
        stop = min(start + TABLE_INIT_CHUNK_ROWS, rows)
        if chunk < first_chunk or start >= row_stop:
            continue
        rng = np.random.default_rng([seed, 1_000_000 + table, chunk])
        block = rng.random((stop - start, dim), dtype=np.float32)
        a, b = max(row_start, start), min(row_stop, stop)
        yield a - row_start, (block[a - start:b - start, col_start:col_stop] * 2 - 1) * bound
