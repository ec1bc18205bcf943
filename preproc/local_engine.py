"""The in-process engine of the Criteo preprocessing (`--engine local`): polars on one machine.

It applies the rules of preproc/README.md (the same as preproc/spark_data_utils.py) and
writes byte-identical output, streaming every day file in blocks of lines so that memory
holds one block plus the dictionaries, never a whole day file. Two passes over the text:

  1 dictionaries  the training days' values are counted per feature (and every day's lines
                  are counted, which fixes the test/validation cut of the last day)
  2 apply         each block is parsed again, its values replaced by ids and its rows
                  appended to the split-binary writer in (day, line) order

Parsing twice costs less than writing and re-reading an intermediate copy of the data.
"""
from __future__ import annotations

import gzip
import os

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.files import StagedDirectory
from preproc.spark_data_utils import (CATEGORICAL_COLUMNS, INTEGER_PATTERN,
                                      LABEL_COLUMN, MAX_CARDINALITY, MAX_COUNT_VALUE,
                                      NUM_FIELDS, NUMERICAL_COLUMNS, RARE_ID, PreprocError,
                                      FIRST_HALF_SPLIT, SECOND_HALF_SPLIT)

BLOCK_BYTES = 64 << 20
# count tables of a feature are merged once this many blocks' tables have piled up
MERGE_EVERY = 8
# a progress line every this many blocks (1 GiB of text) inside a day file
PROGRESS_EVERY = 16
FIELD_NAMES = [LABEL_COLUMN, *NUMERICAL_COLUMNS, *CATEGORICAL_COLUMNS]


# ---- reading lines ----------------------------------------------------------------------
def _split_block(block: bytes, path: str, offset: int) -> pa.Array:
    """Complete lines (block ends with a line end) -> their text, without the line ends.
    Line ends are those of Spark's text reader: \\n, \\r\\n or \\r."""
    try:
        text = pa.array([block.decode("utf-8")])
    except UnicodeDecodeError as e:
        raise PreprocError(f"{path}: not UTF-8 text at byte {offset + e.start}") from None
    if b"\r" in block:
        parts = pc.split_pattern_regex(text, r"\r\n|\r|\n")
    else:
        parts = pc.split_pattern(text, "\n")
    lines = parts.flatten()
    return lines.slice(0, len(lines) - 1)  # the empty piece after the last line end


def read_lines(path: str, progress=None):
    """Yield the lines of a day file (plain or .gz) in order, as arrow string arrays of about
    BLOCK_BYTES of text each; progress(message) now and then, if given."""
    opener = gzip.open if path.endswith(".gz") else open
    carry, offset, blocks = b"", 0, 0
    with opener(path, "rb") as f:
        while True:
            chunk = f.read(BLOCK_BYTES)
            data = carry + chunk
            if not chunk:
                if data:  # a last line without a line end
                    yield _split_block(data if data.endswith(b"\r") else data + b"\n",
                                       path, offset)
                return
            # a final \r may be the first half of \r\n: keep it for the next block
            cut = max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
            if cut:
                yield _split_block(data[:cut], path, offset)
            carry, offset, blocks = data[cut:], offset + cut, blocks + 1
            if progress and blocks % PROGRESS_EVERY == 0:
                progress(f"    {os.path.basename(path)}: {offset >> 20} MiB of text read")


# ---- parsing ----------------------------------------------------------------------------
def well_formed(line: pl.Expr) -> pl.Expr:
    """40 fields, the first one 0 or 1."""
    return ((line.str.count_matches("\t", literal=True) == NUM_FIELDS - 1)
            & line.str.slice(0, 2).is_in(["0\t", "1\t"]))


def count_malformed(lines: pa.Array) -> int:
    return len(lines) - int(pl.Series("line", lines).to_frame()
                            .select(well_formed(pl.col("line")).sum()).item())


def parse_block(lines: pa.Array, numerical: bool = True) -> pl.DataFrame:
    """Lines -> columns `index` (line in the block), label, I1..I13 (ln(max(x,0)+2),
    float32), C1..C26 (raw strings); malformed lines are left out."""
    line = pl.col("line")
    fields = (pl.Series("line", lines).to_frame().with_row_index("index")
              .filter(well_formed(line))
              .select("index", line.str.split_exact("\t", NUM_FIELDS - 1)
                      .struct.rename_fields(FIELD_NAMES).alias("f"))
              .unnest("f"))
    columns = [pl.col("index"), (pl.col(LABEL_COLUMN) == "1").alias(LABEL_COLUMN)]
    if numerical:
        columns += [numerical_transform(pl.col(c)).alias(c) for c in NUMERICAL_COLUMNS]
    return fields.select(*columns, *CATEGORICAL_COLUMNS)


def numerical_transform(field: pl.Expr) -> pl.Expr:
    """Raw field -> ln(max(x, 0) + 2) as float32 (x = 0 for empty/non-integer fields)."""
    x = (pl.when(field.str.contains(INTEGER_PATTERN))
         .then(field.cast(pl.Float64, strict=False)).otherwise(0.0))
    return (x.clip(0.0, MAX_COUNT_VALUE) + 2.0).log().cast(pl.Float32)


# ---- pass 1: dictionaries ---------------------------------------------------------------
def _merge(tables: list) -> pl.DataFrame:
    return pl.concat(tables).group_by("value").agg(pl.col("count").sum())


def count_days(days: list, test_day: int, progress) -> tuple:
    """Count the training values per feature and every day's lines.

    Returns ([26 frames (value, count)], lines per day, malformed lines)."""
    tables = [[] for _ in CATEGORICAL_COLUMNS]
    lines_per_day, malformed = {}, 0
    for day, path in enumerate(days):
        lines_per_day[day] = 0
        for lines in read_lines(path, progress):
            lines_per_day[day] += len(lines)
            if day == test_day:
                malformed += count_malformed(lines)
                continue
            rows = parse_block(lines, numerical=False)
            malformed += len(lines) - len(rows)
            for i, column in enumerate(CATEGORICAL_COLUMNS):
                counts = rows.group_by(column).len("count").rename({column: "value"})
                tables[i].append(counts.with_columns(pl.col("count").cast(pl.Int64)))
                if len(tables[i]) >= MERGE_EVERY:
                    tables[i] = [_merge(tables[i])]
        progress(f"  day {day}: {lines_per_day[day]} lines counted")
    return [_merge(t) if t else pl.DataFrame(schema={"value": pl.String, "count": pl.Int64})
            for t in tables], lines_per_day, malformed


def build_dictionaries(counts: list, frequency_threshold: int, models_dir: str) -> tuple:
    """Frequent values -> ids 1.. in the order (count desc, value asc by bytes); the tables are
    also written to models_dir/feature=<i>/ like the Spark engine's. Returns (tables,
    cardinalities)."""
    tables = []
    for i, table in enumerate(counts):
        if frequency_threshold > 1:
            table = table.filter(pl.col("count") >= frequency_threshold)
        table = (table.sort(["count", "value"], descending=[True, False])
                 .with_row_index("id", offset=1)
                 .select("value", pl.col("id").cast(pl.Int32), "count"))
        if len(table) + 1 > MAX_CARDINALITY:
            raise PreprocError(f"feature {i} has more than {MAX_CARDINALITY} ids; raise the "
                               f"frequency threshold")
        tables.append(table)
    write_models(tables, models_dir)
    return tables, [len(t) + 1 for t in tables]


def write_models(tables: list, models_dir: str) -> None:
    """Every dictionary into a temporary sibling of models_dir, renamed into place (an earlier
    run's models go as a whole, as with Spark's overwrite)."""
    with StagedDirectory(models_dir, overwrite=True) as staged:
        for i, table in enumerate(tables):
            if len(table):  # no frequent value: no directory, as with Spark's partitioned write
                os.makedirs(os.path.join(staged.tmp_dir, f"feature={i}"))
                pq.write_table(table.to_arrow(),
                               os.path.join(staged.tmp_dir, f"feature={i}", "part-00000.parquet"))


# ---- pass 2: apply ----------------------------------------------------------------------
def apply_days(days: list, test_day: int, lines_per_day: dict, tables: list, writer,
               progress) -> None:
    """Parse every day again, replace values by ids and append the rows to `writer` (a
    datasets.SplitBinaryWriter) in (day, line) order."""
    ids = [pl.col(c).replace_strict(t["value"], t["id"], default=RARE_ID,
                                    return_dtype=pl.Int32).alias(c)
           for c, t in zip(CATEGORICAL_COLUMNS, tables)]
    half = lines_per_day[test_day] // 2
    for day, path in enumerate(days):
        first = 0
        for lines in read_lines(path, progress):
            rows = parse_block(lines).with_columns(*ids)
            _write(writer, _splits(day, test_day, half, first, rows))
            first += len(lines)
        progress(f"  day {day}: {first} lines applied")


def _splits(day: int, test_day: int, half: int, first: int, rows) -> list:
    """[(split, rows)] of one block whose first line is line `first` of its day: a training
    day's rows, or the test day's rows cut at line `half` (rows are in line order)."""
    if day < test_day:
        return [("train", rows)]
    cut = int(np.searchsorted(rows["index"].to_numpy(), half - first))
    return [(FIRST_HALF_SPLIT, rows[:cut]), (SECOND_HALF_SPLIT, rows[cut:])]


def _write(writer, pieces: list) -> None:
    for split, part in pieces:
        writer.write(split, part.select(NUMERICAL_COLUMNS).to_numpy(),
                     [part[c].to_numpy() for c in CATEGORICAL_COLUMNS],
                     part[LABEL_COLUMN].to_numpy())


def run_local(days: list, frequency_threshold: int, models_dir: str, open_writer,
              progress) -> dict:
    """Both passes. open_writer(cardinalities, lines, malformed) -> a SplitBinaryWriter,
    called between them. Returns the figures for the summary (lines, malformed_lines,
    cardinalities, rows per split, the written spec)."""
    test_day = len(days) - 1
    counts, lines_per_day, malformed = count_days(days, test_day, progress)
    tables, cards = build_dictionaries(counts, frequency_threshold, models_dir)
    del counts
    total = sum(lines_per_day.values())
    writer = open_writer(cards, total, malformed)
    try:
        apply_days(days, test_day, lines_per_day, tables, writer, progress)
        spec = writer.close()
    except BaseException:
        writer.abort()
        raise
    return {"lines": total, "malformed_lines": malformed, "cardinalities": cards,
            "rows": dict(spec.metadata["rows"]), "spec": spec}


# ---- one pass: raw values as ids of dynamic tables --------------------------------------
MISSING_VALUE_ID = -1  # an empty categorical field: one id of its own, as "" is in a dictionary


def raw_ids(field: str) -> pl.Expr:
    """A categorical field's 8 hex digits read as an int64 id (empty: MISSING_VALUE_ID)."""
    return (pl.col(field).str.to_integer(base=16, strict=False)
            .fill_null(MISSING_VALUE_ID).cast(pl.Int64).alias(field))


def run_one_pass(days: list, open_writer, progress) -> dict:
    """The dictionary-free route: every training day is read once and written with its raw
    values as int64 ids (for a spec whose tables are dynamic, core/dynamic.py); only the test
    day is read twice, its lines counted first for the validation/test cut at its half."""
    test_day = len(days) - 1
    half = sum(len(lines) for lines in read_lines(days[test_day])) // 2
    writer = open_writer()
    ids = [raw_ids(c) for c in CATEGORICAL_COLUMNS]
    lines_per_day, malformed = {}, 0
    try:
        for day, path in enumerate(days):
            lines_per_day[day] = 0
            for lines in read_lines(path, progress):
                rows = parse_block(lines).with_columns(*ids)
                malformed += len(lines) - len(rows)
                _write(writer, _splits(day, test_day, half, lines_per_day[day], rows))
                lines_per_day[day] += len(lines)
            progress(f"  day {day}: {lines_per_day[day]} lines written")
        spec = writer.close()
    except BaseException:
        writer.abort()
        raise
    return {"lines": sum(lines_per_day.values()), "malformed_lines": malformed,
            "rows": dict(spec.metadata["rows"]), "spec": spec}
