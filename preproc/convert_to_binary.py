"""Last stage of the preprocessing: the per-split parquet written by Spark -> split binary.

Runs in the driver process with pyarrow and numpy (no Spark). The parquet of one split is a
set of files (in bucket subdirectories), each one contiguous run of row positions (`pos`);
they are put in position order using the parquet statistics, and the positions are checked to
increase strictly across the whole split, so the binary rows follow (day, line) exactly
whatever the file and directory names are.
"""
from __future__ import annotations

import glob
import os
import sys

import numpy as np
import pyarrow.parquet as pq

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from datasets import SplitBinaryWriter  # noqa: E402
from core.feature_spec import (TEST_MAPPING, TRAIN_MAPPING, VALIDATION_MAPPING,  # noqa
                               DynamicSpec, FeatureSpec)

try:
    from .spark_data_utils import (ID_COLUMNS, LABEL_COLUMN, NUMERICAL_COLUMNS, POS_COLUMN,
                                   PreprocError)
except ImportError:  # run as a script from preproc/
    from spark_data_utils import (ID_COLUMNS, LABEL_COLUMN, NUMERICAL_COLUMNS,  # noqa
                                  POS_COLUMN, PreprocError)

MAPPINGS = (TRAIN_MAPPING, TEST_MAPPING, VALIDATION_MAPPING)
BATCH_ROWS = 1 << 20


def _pos_range(path: str):
    """(min pos, max pos, rows) of one parquet file from its row-group statistics."""
    meta = pq.ParquetFile(path).metadata
    column = meta.schema.names.index(POS_COLUMN)
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if meta.row_group(g).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            table = pq.read_table(path, columns=[POS_COLUMN])[POS_COLUMN].to_numpy()
            return int(table.min()), int(table.max()), meta.num_rows
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    return lo, hi, meta.num_rows


def ordered_files(split_dir: str) -> list:
    """Parquet files of one split in position order; checks that their ranges do not overlap."""
    files = sorted(glob.glob(os.path.join(split_dir, "**", "*.parquet"), recursive=True))
    ranges = [(*_pos_range(f), f) for f in files]
    ranges = sorted((r for r in ranges if r[2] > 0), key=lambda r: r[0])
    for prev, cur in zip(ranges, ranges[1:]):
        if cur[0] <= prev[1]:
            raise PreprocError(f"{split_dir}: files {os.path.basename(prev[3])} and "
                               f"{os.path.basename(cur[3])} overlap in row positions")
    return [r[3] for r in ranges]


def open_writer(output_dir: str, cardinalities: list, metadata: dict,
                dynamic: DynamicSpec = None) -> SplitBinaryWriter:
    """The writer of the split-binary dataset (train/test/validation) and its
    feature_spec.yaml. The output directory is replaced only when it is empty or already holds
    a dataset (a feature_spec.yaml). dynamic: every table dynamic (raw int64 ids; the
    cardinalities are capacities)."""
    output_dir = os.path.abspath(output_dir)
    if os.path.isdir(output_dir) and os.listdir(output_dir) and \
            not os.path.isfile(os.path.join(output_dir, "feature_spec.yaml")):
        raise PreprocError(f"final output {output_dir} is not empty and holds no "
                           f"feature_spec.yaml; refusing to replace it")
    spec = FeatureSpec.get_default(len(NUMERICAL_COLUMNS), cardinalities, mappings=MAPPINGS)
    if dynamic is not None:
        for name in spec.categorical_features:
            spec.feature_spec[name]["dtype"] = "int64"
        spec = spec.with_dynamic(["all"], dynamic)
    spec.metadata = dict(metadata)
    return SplitBinaryWriter(output_dir, spec, overwrite=True)


def convert(transformed_dir: str, output_dir: str, cardinalities: list, metadata: dict,
            progress=print) -> tuple:
    """Write the dataset from Spark's per-split parquet. Returns (FeatureSpec of the written
    dataset, {mapping: rows})."""
    writer = open_writer(output_dir, cardinalities, metadata)
    rows = {}
    try:
        for mapping in MAPPINGS:
            split_dir = os.path.join(transformed_dir, f"split={mapping}")
            files = ordered_files(split_dir) if os.path.isdir(split_dir) else []
            last_pos, count = -1, 0
            columns = [POS_COLUMN, LABEL_COLUMN, *NUMERICAL_COLUMNS, *ID_COLUMNS]
            for path in files:
                for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS,
                                                               columns=columns):
                    pos = batch.column(POS_COLUMN).to_numpy()
                    if pos[0] <= last_pos or np.any(np.diff(pos) <= 0):
                        raise PreprocError(f"{path}: row positions out of order")
                    last_pos = int(pos[-1])
                    numerical = np.column_stack(
                        [batch.column(c).to_numpy(zero_copy_only=False) for c in
                         NUMERICAL_COLUMNS]).astype(np.float32, copy=False)
                    categorical = [batch.column(c).to_numpy(zero_copy_only=False)
                                   for c in ID_COLUMNS]
                    label = batch.column(LABEL_COLUMN).to_numpy(zero_copy_only=False)
                    writer.write(mapping, numerical, categorical, label.astype(bool))
                    count += len(pos)
            rows[mapping] = count
            progress(f"  {mapping}: {count} rows from {len(files)} parquet file(s)")
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    return written, rows
