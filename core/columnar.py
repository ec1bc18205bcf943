"""Columnar formats, parquet and TFRecord (plain or prebatched as NVIDIA's SIM tools write
it): readers that give one dict of arrays per batch, sharded per rank like the split-binary
reader, and the staged writer every tool writes them with."""
from __future__ import annotations

import os
import threading

import numpy as np

from core.feature_spec import TEST_MAPPING, TRAIN_MAPPING, FeatureSpec
from core.crc32c import crc32c_many, masked
from core.files import StagedDirectory, StagedWriter
from core.sources import (BatchSource, DatasetError, expected_rows, first_bad_id,
                          first_non_finite, id_range_error, length_key, non_finite_error,
                          pad_ragged)

COLUMNAR_FORMATS = ("parquet", "tfrecord")
PARQUET_ROW_GROUP = 1 << 16  # small groups keep random (shuffled) batch reads cheap


def _one_line(error: Exception) -> str:
    """A library's message (pyarrow's can span lines) as one line of an `error:`."""
    return " ".join(str(error).split()) or type(error).__name__


def _as_dtype(values: np.ndarray, dtype: np.dtype, name: str, where: str) -> np.ndarray:
    """values as the spec's dtype; ids stored as floats (NVIDIA's Wide & Deep writes multi-hot
    ids as list<double>) must be whole numbers, never silently truncated."""
    if values.dtype.kind == "f" and dtype.kind in "iu" and values.size and \
            not np.array_equal(values, np.floor(values)):
        bad = values[np.flatnonzero(values != np.floor(values))[0]]
        raise DatasetError(f"{where}: feature '{name}' holds ids, found the value {bad:g}")
    return values.astype(dtype, copy=False)


class _ChunkFiles:
    """One chunk of a mapping: its features' rows continue from one file to the next."""

    def __init__(self, spec: FeatureSpec, chunk: dict, features: list):
        self.spec, self.features = spec, features
        self.paths = [os.path.join(spec.base_directory, f) for f in chunk["files"]]
        for path in self.paths:
            if not os.path.isfile(path):
                raise DatasetError(f"{chunk['type']} file not found: {path} (features "
                                   f"{chunk['features']})")
        self.file_rows = np.array(self._open(), dtype=np.int64)
        self.file_starts = np.concatenate([[0], np.cumsum(self.file_rows)])
        self.num_rows = int(self.file_starts[-1])

    def read(self, lo: int, hi: int) -> dict:
        """Rows [lo, hi) of the chunk as {feature: array} (+ lengths of multi features)."""
        pieces = []
        first = max(int(np.searchsorted(self.file_starts, lo, side="right")) - 1, 0)
        for i in range(first, len(self.paths)):
            start = int(self.file_starts[i])
            if start >= hi:
                break
            a, b = max(lo - start, 0), min(hi, int(self.file_starts[i + 1])) - start
            if b > a:
                pieces.append(self._read_file(i, a, b))
        if not pieces:
            pieces.append(self._read_file(0, 0, 0) if self.paths else {})
        return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}

    def locate(self, row: int) -> str:
        """'file row r' of a chunk row (for error messages)."""
        i = int(np.searchsorted(self.file_starts, row, side="right")) - 1
        return f"{self.paths[i]} row {row - int(self.file_starts[i])}"

    def _to_batch(self, name: str, values, where: str, first_row: int) -> dict:
        """values: ndarray [n] for a scalar, (flat, lengths) for a multi feature."""
        width = self.spec.dimension(name)
        dtype = self.spec.dtype(name)
        if width is None:
            return {name: _as_dtype(np.asarray(values), dtype, name, where)}
        flat, lengths = values
        padded = pad_ragged(_as_dtype(np.asarray(flat), dtype, name, where), lengths, width,
                            name, where, first_row)
        return {name: padded, length_key(name): np.asarray(lengths, dtype=np.int32)}


class _ParquetChunk(_ChunkFiles):
    def _open(self) -> list:
        """Open every file; return their row counts."""
        self._files, self._group_starts, self._cached = [], [], (None, None)
        # tf.data reads batches from several threads: pyarrow's ParquetFile is not safe to
        # read from two at once (its pre-buffering races: a segfault now and then), and the
        # cached row groups must be the ones checked for
        self._lock = threading.Lock()
        for path in self.paths:
            self._files.append(self._open_file(path))
            meta = self._files[-1].metadata
            self._group_starts.append(np.concatenate(
                [[0], np.cumsum([meta.row_group(g).num_rows
                                 for g in range(meta.num_row_groups)])]))
        return [f.metadata.num_rows for f in self._files]

    def _open_file(self, path: str):
        import pyarrow.parquet as pq
        try:
            # pages written with a checksum (ColumnarWriter's) are checked as they are read
            parquet_file = pq.ParquetFile(path, page_checksum_verification=True)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise DatasetError(f"{path}: not a readable parquet file ({_one_line(e)})") from None
        names = set(parquet_file.schema_arrow.names)
        missing = [f for f in self.features if f not in names]
        if missing:
            raise DatasetError(f"{path}: no column for feature(s) {missing} "
                               f"(columns: {sorted(names)})")
        return parquet_file

    def _groups(self, i: int, a: int, b: int):
        """Row groups of file i covering rows [a, b), and the first row of the first one."""
        starts = self._group_starts[i]
        g0 = max(int(np.searchsorted(starts, a, side="right")) - 1, 0)
        g1 = max(int(np.searchsorted(starts, b, side="left")), g0 + 1)
        return tuple(range(g0, min(g1, len(starts) - 1))), int(starts[g0])

    def _read_groups(self, i: int, groups: tuple):
        """Row groups of file i; a damaged one is named (read again alone to find it)."""
        try:
            return self._files[i].read_row_groups(list(groups), columns=self.features)
        except Exception as e:  # a damaged page: pyarrow's OSError, ArrowInvalid, ...
            culprit, error = groups, e
            for g in groups if len(groups) > 1 else ():
                try:
                    self._files[i].read_row_group(g, columns=self.features)
                except Exception as alone:
                    culprit, error = (g,), alone
                    break
            named = f"row group {culprit[0]}" if len(culprit) == 1 else \
                f"row groups {culprit[0]}..{culprit[-1]}"
            raise DatasetError(f"{self.paths[i]}: {named}: not readable (corrupt file?): "
                               f"{_one_line(error)}") from None

    def _read_file(self, i: int, a: int, b: int) -> dict:
        groups, group_row = self._groups(i, a, b)
        key = (i, groups)
        with self._lock:
            if self._cached[0] != key:  # consecutive batches often share a row group
                self._cached = (key, self._read_groups(i, groups))
            table = self._cached[1].slice(a - group_row, b - a)
        out = {}
        for name in self.features:
            column = table.column(name).combine_chunks()
            where = f"{self.paths[i]}"
            if column.null_count:
                raise DatasetError(f"{where}: feature '{name}' has {column.null_count} "
                                   f"missing value(s)")
            if self.spec.dimension(name) is None:
                values = column.to_numpy(zero_copy_only=False)
            else:
                offsets = column.offsets.to_numpy()
                values = (column.flatten().to_numpy(zero_copy_only=False), np.diff(offsets))
            out.update(self._to_batch(name, values, where, a))
        return out


def _tfrecord_offsets(path: str) -> np.ndarray:
    """Byte offset of every record of a TFRecord file, plus the file size at the end.
    A record is: uint64 length, uint32 masked CRC-32C of the length, data, uint32 masked
    CRC-32C of the data. The length CRCs are checked here (a corrupt length would misplace
    every later record), the data CRCs as records are read (_check_data_crcs)."""
    offsets, headers, size = [], [], os.path.getsize(path)
    with open(path, "rb") as f:
        position = 0
        while position < size:
            header = f.read(12)
            if len(header) < 12:
                raise DatasetError(f"{path}: truncated TFRecord header at byte {position}")
            offsets.append(position)
            headers.append(header)
            position += 16 + int(np.frombuffer(header, dtype="<u8", count=1)[0])
            if position > size:  # a corrupt length, or a truncated file
                _check_length_crcs(path, headers)
                raise DatasetError(f"{path}: truncated TFRecord (record {len(offsets) - 1} "
                                   f"ends at byte {position}, file has {size})")
            f.seek(position)
    _check_length_crcs(path, headers)
    return np.array(offsets + [size], dtype=np.int64)


def _check_length_crcs(path: str, headers: list) -> None:
    blob = b"".join(headers)
    starts = np.arange(0, len(blob), 12)
    found = np.frombuffer(blob, dtype="<u4").reshape(-1, 3)[:, 2]
    bad = np.flatnonzero(masked(crc32c_many(blob, starts, starts + 8)) != found)
    if bad.size:
        raise DatasetError(f"{path}: record {int(bad[0])}: corrupt length (CRC "
                           f"mismatch; the file is damaged or not a TFRecord file)")


def _check_data_crcs(path: str, blob: bytes, local: np.ndarray, first_record: int) -> None:
    """local: record offsets within blob (records first_record.., then blob's end)."""
    starts, ends = local[:-1] + 12, local[1:] - 4
    stored = np.frombuffer(blob, dtype=np.uint8)[ends[:, None] + np.arange(4)]
    bad = np.flatnonzero(masked(crc32c_many(blob, starts, ends)) != stored.view("<u4")[:, 0])
    if bad.size:
        raise DatasetError(f"{path}: record {first_record + int(bad[0])}: corrupt data (CRC "
                           f"mismatch; the file is damaged)")


REMAINDER_FILENAME = "remainder.tfrecord"  # NVIDIA's SIM tools: a prebatched mapping's last rows
PREBATCH_KEY = "prebatch_size"  # metadata: {mapping: rows per record} of prebatched mappings


def prebatch_size(spec: FeatureSpec, mapping: str):
    """Rows per record the spec records for a mapping (None: not recorded)."""
    sizes = spec.metadata.get(PREBATCH_KEY) if isinstance(spec.metadata, dict) else None
    size = sizes.get(mapping) if isinstance(sizes, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


class _TFRecordChunk(_ChunkFiles):
    """Plain files hold one row per record. Prebatched files (NVIDIA's SIM preprocessing with
    --prebatch_*_size P) hold P rows per record, each feature's values of the P rows
    concatenated, and the mapping's last rows (fewer than P) in one record of a file named
    remainder.tfrecord. P comes from the caller (flag or spec) or from the first record."""

    def __init__(self, spec: FeatureSpec, chunk: dict, features: list, prebatch=None):
        self.prebatch, self._cached = prebatch, (None, None)
        self._scalar = next((f for f in features if spec.dimension(f) is None), None)
        super().__init__(spec, chunk, features)

    def _open(self) -> list:
        self._offsets = [_tfrecord_offsets(path) for path in self.paths]
        size = self._rows_per_record()
        self._record_starts = []  # per file: first row of every record, then the row count
        for i, path in enumerate(self.paths):
            records = len(self._offsets[i]) - 1
            if os.path.basename(path) == REMAINDER_FILENAME:
                counts = self._parse(i, 0, records)[1]
            else:
                counts = np.full(records, size, np.int64)
            self._record_starts.append(np.concatenate([[0], np.cumsum(counts)]))
        return [int(s[-1]) for s in self._record_starts]

    def _rows_per_record(self) -> int:
        """The prebatch size asked for, checked against the first record; else detected."""
        first = next((i for i, p in enumerate(self.paths)
                      if os.path.basename(p) != REMAINDER_FILENAME
                      and len(self._offsets[i]) > 1), None)
        if first is None:
            return self.prebatch or 1
        found = int(self._parse(first, 0, 1)[1][0])
        if self.prebatch and found != self.prebatch:
            raise DatasetError(f"{self.paths[first]}: record 0 holds {found} row(s), but the "
                               f"prebatch size is {self.prebatch} (--prebatch_*_size or the "
                               f"spec's metadata.{PREBATCH_KEY})")
        return found

    def _parse_spec(self) -> dict:
        import tensorflow as tf
        return {name: tf.io.RaggedFeature(tf.float32 if self.spec.dtype(name).kind == "f"
                                          else tf.int64) for name in self.features}

    def _records(self, i: int, r0: int, r1: int) -> list:
        offsets = self._offsets[i]
        try:
            with open(self.paths[i], "rb") as f:
                f.seek(int(offsets[r0]))
                blob = f.read(int(offsets[r1] - offsets[r0]))
        except OSError as e:  # a file gone or unreadable since it was opened
            raise DatasetError(f"{self.paths[i]}: records {r0}..{r1 - 1}: not readable "
                               f"({_one_line(e)})") from None
        if len(blob) != offsets[r1] - offsets[r0]:
            raise DatasetError(f"{self.paths[i]}: records {r0}..{r1 - 1}: the file is shorter "
                               f"than when it was opened")
        local = offsets[r0:r1 + 1] - offsets[r0]
        _check_data_crcs(self.paths[i], blob, local, r0)
        return [blob[s + 12:e - 4] for s, e in zip(local[:-1], local[1:])]

    def _parse(self, i: int, r0: int, r1: int) -> tuple:
        """Records [r0, r1) of file i -> ({feature: (flat values, values per record)}, rows
        per record). A record that does not parse is named with its feature."""
        import tensorflow as tf
        records = self._records(i, r0, r1)
        try:
            parsed = tf.io.parse_example(tf.constant(records, dtype=tf.string),
                                         self._parse_spec())
        except (tf.errors.OpError, UnicodeDecodeError):
            self._raise_bad_record(i, r0, records)
        out = {name: (value.flat_values.numpy(), value.row_lengths().numpy())
               for name, value in parsed.items()}
        if self._scalar is not None:
            return out, out[self._scalar][1]
        name = self.features[0]
        return out, out[name][1] // self.spec.dimension(name)

    def _raise_bad_record(self, i: int, r0: int, records: list):
        import tensorflow as tf
        for r, record in enumerate(records):
            try:
                example = tf.train.Example.FromString(record)
            except Exception:  # protobuf's DecodeError and friends
                raise DatasetError(f"{self.paths[i]}: record {r0 + r} is not a tf.train.Example "
                                   f"(corrupt file?)") from None
            for name in self.features:
                feature = example.features.feature.get(name)
                kind = "float_list" if self.spec.dtype(name).kind == "f" else "int64_list"
                if feature is None or feature.WhichOneof("kind") != kind:
                    found = "missing" if feature is None else feature.WhichOneof("kind")
                    raise DatasetError(f"{self.paths[i]}: record {r0 + r}: feature '{name}' "
                                       f"is {found}, expected {kind}")
        raise DatasetError(f"{self.paths[i]}: records {r0}..{r0 + len(records) - 1} do not "
                           f"match the feature spec")

    def _read_file(self, i: int, a: int, b: int) -> dict:
        starts = self._record_starts[i]
        r0 = max(int(np.searchsorted(starts, a, side="right")) - 1, 0)
        r1 = max(int(np.searchsorted(starts, b, side="left")), r0)
        cached = self._cached  # one snapshot: tf.data reads batches from several threads
        if cached[0] != (i, r0, r1):  # small batches of a prebatched record share its parse
            cached = self._cached = ((i, r0, r1), self._rows(i, r0, r1))
        first, rows = a - int(starts[r0]), b - a
        return {k: v[first:first + rows] for k, v in cached[1].items()}

    def _rows(self, i: int, r0: int, r1: int) -> dict:
        """Every row of records [r0, r1) of file i, shapes checked record by record."""
        parsed, _ = self._parse(i, r0, r1)
        rows = np.diff(self._record_starts[i][r0:r1 + 1])
        out = {}
        for name in self.features:
            flat, counts = parsed[name]
            width = self.spec.dimension(name)
            if width is None:
                expected = rows
            else:  # one row a record: ragged (pad_ragged checks the width); else d per row
                expected = None if (rows == 1).all() else rows * width
            if expected is not None and (counts != expected).any():
                r = int(np.argmax(counts != expected))
                raise DatasetError(f"{self.paths[i]}: record {r0 + r}: feature '{name}' has "
                                   f"{counts[r]} values, expected {expected[r]} ({rows[r]} "
                                   f"row(s) x {width or 1})")
            if width is None:
                values = flat
            elif expected is None:  # one row per record, ragged or fixed
                values = (flat, counts)
            else:
                values = (flat, np.full(int(rows.sum()), width, np.int64))
            out.update(self._to_batch(name, values, self.paths[i], int(
                self._record_starts[i][r0])))
        return out

    def locate(self, row: int) -> str:
        """'file record r' (and the row within a prebatched record) of a chunk row."""
        i = int(np.searchsorted(self.file_starts, row, side="right")) - 1
        local = row - int(self.file_starts[i])
        starts = self._record_starts[i]
        r = int(np.searchsorted(starts, local, side="right")) - 1
        inner = f" row {local - int(starts[r])}" if starts[r + 1] - starts[r] > 1 else ""
        return f"{self.paths[i]} record {r}{inner}"


_CHUNK_READERS = {"parquet": _ParquetChunk, "tfrecord": _TFRecordChunk}


class ColumnarReader(BatchSource):
    """Batches of one mapping of a parquet or TFRecord dataset, as {feature: array}.

    Sharding as the split-binary reader: batch i is the global rows [i*B, (i+1)*B), and
    each rank gets its contiguous slice of it, so every row is read once per epoch across
    ranks. Multi-hot and sequence features come padded with 0 to their dimensions, with
    their lengths under length_key(name). Every id of a feature with a cardinality is
    checked against it (spec.id_limit: the family's convention); an id outside is a
    DatasetError naming file, row (or record) and feature; so is a NaN or inf in a float
    feature."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, features=None, prebatch=None):
        """prebatch: rows per TFRecord record (NVIDIA's prebatched SIM data); None: the
        spec's metadata.prebatch_size, else detected from the first record."""
        if mapping not in spec.source_spec:
            raise DatasetError(f"mapping '{mapping}' not in the feature spec "
                               f"(has {spec.mappings})")
        wanted = None if features is None else set(features)
        self.spec, self.mapping, self.parts = spec, mapping, []
        for chunk in spec.source_spec[mapping]:
            if chunk["type"] not in _CHUNK_READERS:
                raise DatasetError(f"mapping '{mapping}': chunk type '{chunk['type']}' is not "
                                   f"columnar; expected one of {list(_CHUNK_READERS)}")
            names = [f for f in chunk["features"] if wanted is None or f in wanted]
            if names and chunk["type"] == "tfrecord":
                self.parts.append(_TFRecordChunk(spec, chunk, names,
                                                 prebatch or prebatch_size(spec, mapping)))
            elif names:
                self.parts.append(_ParquetChunk(spec, chunk, names))
        super().__init__(batch_size, self._check_rows(), drop_last, rank, world_size,
                         shuffle, seed)
        self._id_limits = {f: spec.id_limit(f) for p in self.parts for f in p.features
                           if spec.id_limit(f) is not None}
        self._floats = [f for p in self.parts for f in p.features
                        if spec.dtype(f).kind == "f"]

    def _check_rows(self) -> int:
        counts = {tuple(p.paths): p.num_rows for p in self.parts}
        expected = expected_rows(self.spec, self.mapping)
        if expected is None:
            expected = max(counts.values()) if counts else 0
        odd = [f"{list(files)} ({n} rows)" for files, n in counts.items() if n != expected]
        if odd:
            raise DatasetError(f"mapping '{self.mapping}': expected {expected} rows, but "
                               f"chunk file(s) {'; '.join(odd)}")
        return expected

    def locate(self, row: int, feature: str) -> str:
        """Where a row of this mapping's feature lies: 'file record r' (TFRecord) or
        'file row r' (parquet)."""
        part = next(p for p in self.parts if feature in p.features)
        return part.locate(row)

    def get(self, index: int) -> dict:
        lo, hi = self.local_rows(index)
        batch = {}
        for part in self.parts:
            batch.update(part.read(lo, hi))
        for name, limit in self._id_limits.items():
            bad = first_bad_id(batch[name], limit)
            if bad is not None:
                raise id_range_error(self.spec, name, batch[name][bad],
                                     self.locate(lo + int(bad[0]), name))
        for name in self._floats:
            bad = first_non_finite(batch[name])
            if bad is not None:
                raise non_finite_error(name, batch[name][bad],
                                       self.locate(lo + int(bad[0]), name))
        return batch


def open_reader(spec: FeatureSpec, mapping: str, batch_size: int, **kwargs) -> ColumnarReader:
    return ColumnarReader(spec, mapping, batch_size, **kwargs)


def _ragged(values, width: int, name: str):
    """A multi feature's rows -> (flat values, lengths). Accepts per-row sequences, a
    (padded [n, d] values, lengths [n]) pair or a (flat values, lengths) pair."""
    if isinstance(values, tuple):
        padded, lengths = np.asarray(values[0]), np.asarray(values[1], dtype=np.int64)
        if padded.ndim == 1:
            if padded.size != lengths.sum():
                raise DatasetError(f"feature '{name}': {padded.size} values for lengths "
                                   f"summing to {lengths.sum()}")
            return padded, lengths
        mask = np.arange(padded.shape[1])[None, :] < lengths[:, None]
        if lengths.size and lengths.max() > padded.shape[1]:
            raise DatasetError(f"feature '{name}': a length exceeds the padded width "
                               f"{padded.shape[1]}")
        return padded[mask], lengths
    rows = [np.asarray(r).reshape(-1) for r in values]
    lengths = np.array([r.size for r in rows], dtype=np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return flat, lengths


class ColumnarWriter(StagedWriter):
    """Writes a parquet or TFRecord dataset with its feature_spec.yaml, through a staged
    directory (nothing appears at output_dir until close() succeeds).

    write(mapping, columns) checks a block of rows against the spec and appends it as the
    next file of the mapping (<mapping>/part_<k>.<ext>). columns: {feature: [n] array} for
    scalar features; per-row sequences or (padded values, lengths) for features with
    dimensions. close() fills source_spec (one chunk per mapping holding every feature) and
    metadata.rows and returns the spec."""

    def __init__(self, output_dir: str, spec: FeatureSpec, output_format: str,
                 overwrite: bool = False, ids_from_one: bool = False, prebatch=None,
                 mappings=None):
        """mappings: the mappings to write (default: the spec's, else train and test).
        ids_from_one: ids lie in [0, cardinality], 0 the padding (NVIDIA's SIM
        convention), instead of [0, cardinality). prebatch: {mapping: P} writes P rows per
        TFRecord record and the last rows (fewer than P) to <mapping>/remainder.tfrecord,
        as NVIDIA's SIM preprocessing does; recorded in metadata.prebatch_size."""
        if output_format not in COLUMNAR_FORMATS:
            raise DatasetError(f"output format must be one of {list(COLUMNAR_FORMATS)}, found "
                               f"{output_format!r}")
        self.prebatch = {m: int(p) for m, p in (prebatch or {}).items() if p}
        if self.prebatch and output_format != "tfrecord":
            raise DatasetError(f"prebatching is a TFRecord layout, not {output_format}")
        self.format, self.spec, self.ids_from_one = output_format, spec.copy(), ids_from_one
        self.features = [f for names in self.spec.channel_spec.values() for f in names or []]
        self._output = StagedDirectory(output_dir, overwrite)
        self.files = {m: [] for m in mappings or self.spec.source_spec
                      or (TRAIN_MAPPING, TEST_MAPPING)}
        self.rows = {m: 0 for m in self.files}
        self._carry = {m: None for m in self.prebatch}  # rows short of a whole record
        self._done = False

    def _check(self, columns: dict) -> tuple:
        """(rows, {feature: array or (flat, lengths)}) after checking every value."""
        missing = [f for f in self.features if f not in columns]
        if missing:
            raise DatasetError(f"write: no values for feature(s) {missing}")
        checked, rows = {}, None
        for name in self.features:
            width = self.spec.dimension(name)
            if width is None:
                value = np.asarray(columns[name])
                n, ids = value.shape[0] if value.ndim == 1 else -1, value
            else:
                value = _ragged(columns[name], width, name)
                n, ids = value[1].size, value[0]
                if n and value[1].max() > width:
                    row = int(np.argmax(value[1] > width))
                    raise DatasetError(f"feature '{name}': row {row} has {value[1][row]} "
                                       f"values, more than its dimensions [{width}]")
            if n < 0 or (rows is not None and n != rows):
                raise DatasetError(f"feature '{name}': {n if n >= 0 else 'not 1-d'} rows, "
                                   f"expected {rows}")
            rows = n
            self._check_ids(name, ids)
            dtype = self.spec.dtype(name)
            checked[name] = (value.astype(dtype) if width is None
                             else (value[0].astype(dtype), value[1]))
        return rows or 0, checked

    def _check_ids(self, name: str, ids: np.ndarray) -> None:
        card = self.spec.feature_spec[name].get("cardinality")
        if not (ids.size and isinstance(card, int)) or self.spec.dynamic(name):
            return  # a dynamic table takes any int64 id
        top = card + 1 if self.ids_from_one else card
        if ids.min() < 0 or ids.max() >= top:
            raise DatasetError(f"feature '{name}': ids must lie in [0, {top}), found "
                               f"[{ids.min()}, {ids.max()}]")

    def write(self, mapping: str, columns: dict) -> None:
        if self._done:
            raise DatasetError("write() after close() or abort()")
        if mapping not in self.files:
            raise DatasetError(f"mapping '{mapping}' not in the writer's spec "
                               f"({list(self.files)})")
        rows, checked = self._check(columns)
        size = self.prebatch.get(mapping)
        if not size:
            return self._write_part(mapping, f"part_{len(self.files[mapping]):05d}", rows,
                                    checked)
        carry = self._carry[mapping]
        if carry is not None:
            checked = {k: _join_rows(carry[1][k], v) for k, v in checked.items()}
            rows += carry[0]
        whole = rows - rows % size
        if whole:
            self._write_part(mapping, f"part_{len(self.files[mapping]):05d}", whole,
                             {k: _take_rows(v, 0, whole) for k, v in checked.items()}, size)
        self._carry[mapping] = (rows - whole, {k: _take_rows(v, whole, rows)
                                               for k, v in checked.items()})

    def _write_part(self, mapping: str, stem: str, rows: int, checked: dict,
                    rows_per_record: int = 1) -> None:
        name = f"{mapping}/{stem}.{self.format}"
        path = os.path.join(self._output.tmp_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if self.format == "parquet":
            self._write_parquet(path, rows, checked)
        else:
            self._write_tfrecord(path, rows, checked, rows_per_record)
        self.files[mapping].append(name)
        self.rows[mapping] += rows

    def _write_parquet(self, path: str, rows: int, columns: dict) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        arrays = {}
        for name, value in columns.items():
            if isinstance(value, tuple):
                offsets = np.concatenate([[0], np.cumsum(value[1])]).astype(np.int32)
                arrays[name] = pa.ListArray.from_arrays(
                    pa.array(offsets), pa.array(value[0]))
            else:
                arrays[name] = pa.array(value)
        pq.write_table(pa.table(arrays), path, row_group_size=PARQUET_ROW_GROUP,
                       write_page_checksum=True)

    def _write_tfrecord(self, path: str, rows: int, columns: dict,
                        rows_per_record: int = 1) -> None:
        """One tf.train.Example per rows_per_record rows: each feature's values of those
        rows concatenated (a fixed-length history of d values: rows x d values)."""
        import tensorflow as tf
        bounds = np.arange(0, rows + rows_per_record, rows_per_record).clip(max=rows)
        kinds = {name: self.spec.dtype(name).kind == "f" for name in columns}
        lists = {}
        for name, value in columns.items():
            flat, lengths = value if isinstance(value, tuple) else (value, np.ones(rows, int))
            offsets = np.concatenate([[0], np.cumsum(lengths)])[bounds]
            # protobuf 6 (TensorFlow 2.18+) refuses Python bools in an Int64List: bool
            # columns (labels) go in as 0/1
            flat = (flat if kinds[name] else flat.astype(np.int64, copy=False)).tolist()
            lists[name] = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        with tf.io.TFRecordWriter(path) as out:
            for record in range(len(bounds) - 1):
                feature = {name: (tf.train.Feature(float_list=tf.train.FloatList(
                                      value=v[record])) if kinds[name] else
                                  tf.train.Feature(int64_list=tf.train.Int64List(
                                      value=v[record])))
                           for name, v in lists.items()}
                # deterministic: the features in key order (protobuf's own map order
                # varies from process to process), so the same rows give the same file
                out.write(tf.train.Example(features=tf.train.Features(feature=feature))
                          .SerializeToString(deterministic=True))

    def _finish_files(self) -> None:
        for mapping, carry in self._carry.items():
            if carry is not None and carry[0]:
                self._write_part(mapping, REMAINDER_FILENAME.split(".")[0], carry[0],
                                 carry[1], carry[0])
        for mapping, files in self.files.items():
            if not files:  # an empty mapping still gets a (row-less) file
                self._write_part(mapping, "part_00000", 0, self._check(
                    {f: ([] if self.spec.dimension(f) else np.zeros(0))
                     for f in self.features})[1])
        self.spec.source_spec = {m: [{"type": self.format, "features": list(self.features),
                                      "files": list(files)}]
                                 for m, files in self.files.items()}
        self.spec.metadata = dict(self.spec.metadata, rows=dict(self.rows))
        if self.prebatch:
            self.spec.metadata[PREBATCH_KEY] = dict(self.prebatch)


def write_columns(output_dir: str, spec: FeatureSpec, mappings: dict, output_format: str,
                  rows_per_file: int = 1_000_000, overwrite: bool = False,
                  **options) -> FeatureSpec:
    """Write {mapping: columns} in one go, rows_per_file rows per file part; options:
    ColumnarWriter's ids_from_one and prebatch."""
    writer = ColumnarWriter(output_dir, spec, output_format, overwrite, mappings=list(mappings),
                            **options)
    with writer:
        for mapping, columns in mappings.items():
            rows = writer._check(columns)[0]
            for start in range(0, rows, rows_per_file):
                writer.write(mapping, {name: _take_rows(value, start, start + rows_per_file)
                                       for name, value in columns.items()})
    return writer.spec


def _join_rows(first, second):
    """Rows of `second` after those of `first` (arrays, or (flat values, lengths) pairs)."""
    if isinstance(first, tuple):
        return tuple(np.concatenate([a, b]) for a, b in zip(first, second))
    return np.concatenate([first, second])


def _take_rows(value, start: int, stop: int):
    if isinstance(value, tuple):
        values, lengths = np.asarray(value[0]), np.asarray(value[1])
        if values.ndim == 1:  # flat values: row r starts at the sum of the lengths before it
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            stop = min(stop, lengths.size)
            return values[offsets[start]:offsets[stop]], lengths[start:stop]
        return values[start:stop], lengths[start:stop]
    return value[start:stop]
