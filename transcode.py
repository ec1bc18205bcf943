#!/usr/bin/env python3
"""Convert a CSV dataset described by a feature spec into the format a model family reads.

    python transcode.py --input DIR --output OUT [--chunk_size 1000000]
                        [--output_format split_binary|parquet|tfrecord] [--overwrite]

DIR/feature_spec.yaml describes header-less CSV files (chunk type `csv`): each chunk lists
its features in column order and its files in row order (rows 0..i-1 in the first file, the
next rows in the next one, ...); a chunk may hold several features of any channels, and
different chunks may split their rows over files differently. The mappings train and test
are required, validation is optional. The channel `label` holds one feature whose values
must be 0 or 1.

Without --output_format the output follows the spec's channels: DLRM's (categorical,
numerical, label) -> split binary, Wide & Deep's (onehot_categorical, multihot_categorical,
numerical, label, map) -> parquet, SIM's -> TFRecord. A feature the output cannot hold (a
channel split binary has no file for, several values per row in split binary, a float dtype
the format would narrow) is an error naming it: nothing is dropped.

Categorical features (those of a categorical channel and every feature with a
`cardinality`) hold integer ids in [0, cardinality); a cardinality of `auto` (or none in the
channel `categorical`) is inferred as the largest id in any mapping + 1. A feature with
`dimensions: [d]` or `max_hotness: d` (multi-hot or sequence) holds up to d integers in one
field, separated by `|` (`3|17|4`) or as NVIDIA's quoted list (`"[3, 17, 4]"`); an empty
field or list has no values, more than d is an error naming the row and feature.
Features of the channel `numerical` (or with a float dtype) are floats; others integers.
Dtypes in the input spec are optional. Split binary: categorical features get the narrowest
integer type holding their cardinality, numerical ones float16, the label bool (or the given
dtypes). Parquet and TFRecord: categorical int32 (int64 past 2^31 ids), numerical float64 in
parquet (the CSV's values as parsed) and float32 in TFRecord, the label int8, others int64
(or the given dtypes); hotness is written both as `dimensions` and `max_hotness`, and a Wide
& Deep spec lists all five of its channels, so NVIDIA's FeatureSpec check accepts it.

split_binary writes the DLRM layout (<mapping>/numerical.bin, label.bin, cat_<i>.bin);
parquet and tfrecord write <mapping>/part_<k> files of up to --chunk_size rows (one column /
Example feature per spec feature, lists for multi-valued ones). A generated
feature_spec.yaml goes with them; everything is written through a temporary directory so a
failure leaves no half dataset. A non-empty OUT is refused unless --overwrite.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np
import pandas as pd

from core.cli import run_cli
from core.columnar import COLUMNAR_FORMATS, ColumnarWriter
from core.sources import DatasetError
from datasets import SplitBinaryWriter
from core.feature_spec import (AUTO_CARDINALITY, CATEGORICAL_CHANNEL, CATEGORICAL_DTYPES,
                               COLUMNAR_LABEL_DTYPES, COLUMNAR_NUMERICAL_DTYPES, CSV,
                               DEFAULT_FILENAME, FeatureSpec, FeatureSpecError, KNOWN_MAPPINGS,
                               LABEL_CHANNEL, LABEL_DTYPES, MAX_HOTNESS, NUMERICAL_CHANNEL,
                               NUMERICAL_DTYPES, PARQUET, SPLIT_BINARY, TFRECORD, allowed_dtype,
                               check_mapping_names, dtype_name, feature_hotness,
                               narrowest_int_dtype, read_spec_yaml)
from dlrm_contract import DLRM_CONTRACT
from sim.contract import SIM_CONTRACT
from wide_and_deep.contract import WIDE_DEEP_CONTRACT

AUTO = AUTO_CARDINALITY
SEPARATOR = "|"  # between the values of a multi-hot or sequence field
OUTPUT_FORMATS = (SPLIT_BINARY,) + COLUMNAR_FORMATS


def load_csv_spec(path: str, chunk_types=(CSV,)) -> FeatureSpec:
    """Load and check a spec describing CSV files (one-line FeatureSpecError otherwise).

    Unlike FeatureSpec.validate this allows several files per chunk, several features (of any
    channel) per chunk, any model family's channels, missing dtypes and cardinality `auto`."""
    raw = read_spec_yaml(path)
    fs = raw.get("feature_spec") or {}
    ss = raw.get("source_spec") or {}
    cs = raw.get("channel_spec") or {}
    if not isinstance(fs, dict) or not isinstance(ss, dict) or not isinstance(cs, dict):
        raise FeatureSpecError(f"{path}: feature_spec, source_spec and channel_spec must be "
                               f"mappings")
    channel_of = _check_csv_channels(path, fs, cs)
    check_mapping_names(ss, f"{path}: ")
    for mapping, chunks in ss.items():
        _check_csv_mapping(path, mapping, chunks, channel_of, chunk_types)
    return FeatureSpec(feature_spec=fs, source_spec=ss, channel_spec=cs,
                       metadata=raw.get("metadata") or {},
                       base_directory=os.path.dirname(os.path.abspath(path)))


def _check_csv_channels(path: str, fs: dict, cs: dict) -> dict:
    """{feature: channel} after checking channels, cardinalities and dimensions."""
    if LABEL_CHANNEL not in cs:
        raise FeatureSpecError(f"{path}: channel_spec: channel 'label' is required, found "
                               f"{sorted(cs)}")
    channel_of = {}
    for channel, names in cs.items():
        for name in names or []:
            if name in channel_of:
                raise FeatureSpecError(f"{path}: feature '{name}' appears in channels "
                                       f"'{channel_of[name]}' and '{channel}'")
            if name not in fs:
                raise FeatureSpecError(f"{path}: feature '{name}' of channel '{channel}' is "
                                       f"not described in feature_spec")
            channel_of[name] = channel
    if len(cs[LABEL_CHANNEL] or []) != 1:
        raise FeatureSpecError(f"{path}: channel 'label' must hold exactly one feature, "
                               f"found {cs[LABEL_CHANNEL]}")
    for name in channel_of:
        props = fs[name] or {}
        card = props.get("cardinality", AUTO)
        if card != AUTO and (isinstance(card, bool) or not isinstance(card, int) or card < 1):
            raise FeatureSpecError(f"{path}: feature '{name}': cardinality must be a positive "
                                   f"integer or 'auto', found {card!r}")
        if "dynamic" in props and card == AUTO:
            raise FeatureSpecError(f"{path}: feature '{name}' is dynamic: its cardinality is "
                                   f"the table's capacity, which transcode cannot infer from "
                                   f"ids that may be any int64; give an integer")
        feature_hotness(name, props, f"{path}: ")
    return channel_of


def _check_csv_mapping(path, mapping, chunks, channel_of, chunk_types) -> None:
    if not isinstance(chunks, list) or not chunks:
        raise FeatureSpecError(f"{path}: mapping '{mapping}' must be a non-empty list of "
                               f"chunks")
    seen = set()
    for index, chunk in enumerate(chunks):
        where = f"{path}: mapping '{mapping}' chunk {index}"
        if not isinstance(chunk, dict) or chunk.get("type") not in chunk_types:
            found = chunk.get("type") if isinstance(chunk, dict) else chunk
            raise FeatureSpecError(f"{where}: type must be one of {list(chunk_types)}, "
                                   f"found {found!r}")
        files, features = chunk.get("files"), chunk.get("features")
        if not isinstance(files, list) or not files or \
                not all(isinstance(f, str) and f for f in files):
            raise FeatureSpecError(f"{where}: files must be a non-empty list of names, "
                                   f"found {files!r}")
        if not isinstance(features, list) or not features:
            raise FeatureSpecError(f"{where}: features must be a non-empty list")
        for name in features:
            if name not in channel_of:
                raise FeatureSpecError(f"{where}: feature {name!r} belongs to no channel")
            if name in seen:
                raise FeatureSpecError(f"{where}: feature '{name}' appears twice in "
                                       f"mapping '{mapping}'")
            seen.add(name)
    missing = [n for n in channel_of if n not in seen]
    if missing:
        raise FeatureSpecError(f"{path}: mapping '{mapping}' lacks feature(s) {missing}")


def categorical_features(spec: FeatureSpec) -> list:
    """Features holding ids below a cardinality: the DLRM channel, and any with one."""
    return [n for names in spec.channel_spec.values() for n in names or []
            if n in spec.channel(CATEGORICAL_CHANNEL)
            or "cardinality" in (spec.feature_spec[n] or {})]


def is_float_feature(spec: FeatureSpec, name: str) -> bool:
    dtype = (spec.feature_spec[name] or {}).get("dtype")
    return name in spec.channel(NUMERICAL_CHANNEL) or \
        (dtype is not None and np.dtype(dtype).kind == "f")


class _ChunkRows:
    """The rows of one CSV chunk, read across its files, handed out n at a time."""

    def __init__(self, spec: FeatureSpec, chunk: dict, dtypes: dict, chunk_size: int,
                 usecols=None):
        self.features = list(chunk["features"])
        self.paths = [os.path.join(spec.base_directory, f) for f in chunk["files"]]
        self.where = ", ".join(chunk["files"])
        self.widths = {f: spec.dimension(f) for f in self.features
                       if spec.dimension(f) is not None}
        self.rows_taken = 0
        self.dtypes, self.chunk_size = dtypes, chunk_size
        self.usecols = usecols
        self._frames = self._read()
        self._pending, self._pending_rows = [], 0
        self.exhausted = False

    def _read(self):
        for path in self.paths:
            if not os.path.isfile(path):
                raise DatasetError(f"csv file not found: {path}")
            if os.path.getsize(path) == 0:
                continue
            with open(path, newline="") as f:
                first = next(csv.reader(f), [])
            if len(first) != len(self.features):
                raise DatasetError(f"{path}: expected {len(self.features)} comma-separated "
                                   f"columns {self.features}, found {len(first)} in the "
                                   f"first line")
            try:
                reader = pd.read_csv(path, header=None, names=self.features,
                                     usecols=self.usecols, dtype=self.dtypes, index_col=False,
                                     chunksize=self.chunk_size, na_filter=True)
                with reader:
                    for frame in reader:
                        yield path, frame
            except (ValueError, TypeError, pd.errors.ParserError) as e:
                msg = str(e).replace("\n", " ")
                raise DatasetError(f"{path}: cannot read as {len(self.features)} columns "
                                   f"{self.features} ({msg})") from None

    def take(self, n: int):
        """Up to n rows as {feature: array}; fewer only when the chunk's files are done."""
        while self._pending_rows < n and not self.exhausted:
            try:
                path, frame = next(self._frames)
            except StopIteration:
                self.exhausted = True
                break
            single = frame.drop(columns=[c for c in frame.columns if c in self.widths])
            bad = single.columns[single.isna().any()].tolist()
            if bad:
                raise DatasetError(f"{path}: missing or non-numeric values in column(s) {bad}")
            self._pending.append(frame)
            self._pending_rows += len(frame)
        if not self._pending:
            return {}, 0
        frame = self._pending[0] if len(self._pending) == 1 else pd.concat(self._pending)
        head, tail = frame.iloc[:n], frame.iloc[n:]
        self._pending = [tail] if len(tail) else []
        self._pending_rows = len(tail)
        block = {c: (self._split_values(c, head[c]) if c in self.widths else head[c].to_numpy())
                 for c in head.columns}
        self.rows_taken += len(head)
        return block, len(head)

    def _split_values(self, name: str, column: pd.Series) -> tuple:
        """'3|17|4' or '[3, 17, 4]' (NVIDIA's quoted list) fields -> (flat int64 values,
        lengths); an empty field or list has no values."""
        texts = column.fillna("").astype(str).str.strip()
        listed = texts.str.startswith("[") & texts.str.endswith("]")
        texts = texts.where(~listed, texts.str.slice(1, -1).str.replace(" ", "")
                            .str.replace(",", SEPARATOR)).to_numpy()
        lengths = np.array([t.count(SEPARATOR) + 1 if t else 0 for t in texts], dtype=np.int64)
        too_long = np.flatnonzero(lengths > self.widths[name])
        if too_long.size:
            row = int(too_long[0])
            raise DatasetError(f"{self.where}: feature '{name}' has {lengths[row]} values in "
                               f"row {self.rows_taken + row} of the mapping, more than its "
                               f"dimensions [{self.widths[name]}]")
        joined = SEPARATOR.join(t for t in texts if t)
        try:
            flat = np.array(joined.split(SEPARATOR) if joined else [], dtype=np.int64)
        except ValueError:
            raise DatasetError(f"{self.where}: feature '{name}': fields must hold integers "
                               f"separated by '{SEPARATOR}' or a list like \"[3, 17, 4]\"") \
                from None
        return flat, lengths


def _files_of(spec: FeatureSpec, mapping: str, feature: str) -> str:
    for chunk in spec.source_spec[mapping]:
        if feature in chunk["features"]:
            return ", ".join(chunk["files"])
    return "?"


def _column_dtypes(spec: FeatureSpec) -> dict:
    dtypes = {}
    for name in (n for names in spec.channel_spec.values() for n in names or []):
        if spec.dimension(name) is not None:
            dtypes[name] = "str"
        else:
            dtypes[name] = "float64" if is_float_feature(spec, name) else "int64"
    dtypes[spec.label_feature] = "float64"
    return dtypes


def _mapping_rows(spec: FeatureSpec, mapping: str, chunk_size: int, features=None):
    """Yield {feature: array} blocks of up to chunk_size aligned rows of one mapping."""
    dtypes = _column_dtypes(spec)
    streams = []
    for chunk in spec.source_spec[mapping]:
        wanted = [f for f in chunk["features"] if features is None or f in features]
        if not wanted:
            continue
        streams.append(_ChunkRows(spec, chunk, dtypes, chunk_size,
                                  usecols=None if features is None else wanted))
    while True:
        block, counts = {}, []
        for stream in streams:
            columns, n = stream.take(chunk_size)
            block.update(columns)
            counts.append(n)
        if len(set(counts)) > 1:
            detail = "; ".join(
                ", ".join(os.path.relpath(p, spec.base_directory) for p in stream.paths)
                + f" -> {n}" for stream, n in zip(streams, counts))
            raise DatasetError(f"mapping '{mapping}': chunks hold different numbers of rows "
                               f"(rows in this block: {detail})")
        if not counts or counts[0] == 0:
            return
        yield block, counts[0]


def infer_cardinalities(spec: FeatureSpec, chunk_size: int) -> dict:
    """Largest id + 1 over all mappings, for categorical features whose cardinality is auto."""
    auto = [n for n in categorical_features(spec)
            if (spec.feature_spec[n] or {}).get("cardinality", AUTO) == AUTO]
    if not auto:
        return {}
    largest = {n: -1 for n in auto}
    for mapping in spec.mappings:
        for block, _ in _mapping_rows(spec, mapping, chunk_size, features=set(auto)):
            for n in auto:
                ids = block[n][0] if isinstance(block[n], tuple) else block[n]
                if ids.size:
                    largest[n] = max(largest[n], int(ids.max()))
    return {n: max(v + 1, 1) for n, v in largest.items()}


def _categorical_dtype(props: dict, cardinality: int) -> str:
    """The spec's integer dtype if it holds the ids, else the narrowest one that does."""
    dtype = allowed_dtype(props.get("dtype"), CATEGORICAL_DTYPES)
    if dtype is None or cardinality - 1 > np.iinfo(dtype).max:
        dtype = narrowest_int_dtype(cardinality)
    return dtype


def output_spec(spec: FeatureSpec, cardinalities: dict) -> FeatureSpec:
    fs = spec.feature_spec
    cards, cat_dtypes = [], []
    for name in spec.categorical_features:
        props = fs[name] or {}
        card = int(cardinalities.get(name, props.get("cardinality")))
        cards.append(card)
        cat_dtypes.append(_categorical_dtype(props, card))
    num_dtypes = {allowed_dtype((fs[n] or {}).get("dtype"), NUMERICAL_DTYPES)
                  for n in spec.numerical_features}
    num_dtype = "float32" if num_dtypes == {"float32"} else "float16"
    label_dtype = allowed_dtype((fs[spec.label_feature] or {}).get("dtype"),
                                 LABEL_DTYPES) or "bool"
    mappings = [m for m in KNOWN_MAPPINGS if m in spec.source_spec]
    out = FeatureSpec.get_default(len(spec.numerical_features), cards, mappings=mappings,
                                  numerical_dtype=num_dtype, label_dtype=label_dtype,
                                  categorical_dtypes=cat_dtypes,
                                  numerical_names=spec.numerical_features,
                                  categorical_names=spec.categorical_features,
                                  label_name=spec.label_feature)
    return out.validate(DLRM_CONTRACT)


def _columnar_categorical_dtype(props: dict, cardinality: int) -> str:
    """The spec's integer dtype if it holds the ids, else int32 or int64 (the types NVIDIA's
    Wide & Deep FeatureSpec check allows)."""
    dtype = allowed_dtype(props.get("dtype"), CATEGORICAL_DTYPES)
    if dtype is None or cardinality - 1 > np.iinfo(dtype).max:
        dtype = "int32" if cardinality - 1 <= np.iinfo(np.int32).max else "int64"
    return dtype


def _channels_of(spec: FeatureSpec, family) -> dict:
    """The spec's channels; for Wide & Deep every one of its channels, empty ones included
    (NVIDIA's FeatureSpec check wants all five)."""
    channels = spec.to_dict()["channel_spec"]
    if family is WIDE_DEEP_CONTRACT:
        channels = {c: list(channels.get(c) or []) for c in family.channels}
    return channels


def columnar_output_spec(spec: FeatureSpec, cardinalities: dict, output_format: str,
                         family=None) -> FeatureSpec:
    """The input spec with dtypes, cardinalities and hotness settled (both `dimensions` and
    `max_hotness`); source_spec: the writer's."""
    fs = {}
    categorical = set(categorical_features(spec))
    floats = FLOAT_DTYPES[output_format]
    for name in (n for names in spec.channel_spec.values() for n in names or []):
        props = dict(spec.feature_spec[name] or {})
        if name in categorical:
            props["cardinality"] = int(cardinalities.get(name, props.get("cardinality")))
            dtype = _columnar_categorical_dtype(props, props["cardinality"])
        elif name == spec.label_feature:
            dtype = allowed_dtype(props.get("dtype"), COLUMNAR_LABEL_DTYPES) or "int8"
        elif is_float_feature(spec, name):
            dtype = allowed_dtype(props.get("dtype"), floats) or floats[-1]
        else:
            dtype = allowed_dtype(props.get("dtype"), CATEGORICAL_DTYPES) or "int64"
        props["dtype"] = dtype
        width = spec.dimension(name)
        if width is not None:
            props["dimensions"], props[MAX_HOTNESS] = [width], width
        fs[name] = props
    mappings = {m: [] for m in KNOWN_MAPPINGS if m in spec.source_spec}
    return FeatureSpec(fs, mappings, _channels_of(spec, family), {})


# The format each model family reads, and how a format keeps floats (most precise last:
# the default; a float dtype it cannot keep is refused, never narrowed).
FAMILY_FORMATS = ((DLRM_CONTRACT, SPLIT_BINARY), (WIDE_DEEP_CONTRACT, PARQUET),
                  (SIM_CONTRACT, TFRECORD))
FLOAT_DTYPES = {SPLIT_BINARY: NUMERICAL_DTYPES, PARQUET: COLUMNAR_NUMERICAL_DTYPES,
                TFRECORD: NUMERICAL_DTYPES}


def spec_family(spec: FeatureSpec):
    """(contract, format) of the model family whose channels the spec uses, or (None, None)."""
    channels = set(spec.channel_spec)
    for contract, output_format in FAMILY_FORMATS:
        if channels <= set(contract.channels) and set(contract.required_channels) <= channels:
            return contract, output_format
    return None, None


def choose_format(spec: FeatureSpec, output_format: str = None) -> tuple:
    """(family contract or None, format): --output_format, else the family's format."""
    family, family_format = spec_family(spec)
    if output_format is None:
        if family is None:
            known = "; ".join(f"{c.model}: {sorted(c.channels)}" for c, _ in FAMILY_FORMATS)
            raise FeatureSpecError(f"channel_spec: channels {sorted(spec.channel_spec)} are "
                                   f"no model family's ({known}); pass --output_format")
        output_format = family_format
    if output_format not in OUTPUT_FORMATS:
        raise DatasetError(f"--output_format must be one of {list(OUTPUT_FORMATS)}, found "
                           f"{output_format!r}")
    _check_output_holds(spec, output_format)
    return family, output_format


def _check_output_holds(spec: FeatureSpec, output_format: str) -> None:
    """FeatureSpecError naming the features `output_format` cannot hold."""
    hint = "(use --output_format parquet or tfrecord)"
    features = [(n, c) for c, names in spec.channel_spec.items() for n in names or []]
    if output_format == SPLIT_BINARY:
        lost = [f"'{n}' ({c})" for n, c in features if c not in DLRM_CONTRACT.channels]
        if lost:
            raise FeatureSpecError(f"split_binary holds only the channels "
                                   f"{list(DLRM_CONTRACT.channels)}; it would lose feature(s) "
                                   f"{', '.join(lost)} {hint}")
    for name, channel in features:
        where = f"feature '{name}' of channel '{channel}'"
        if output_format == SPLIT_BINARY and spec.dimension(name) is not None:
            raise FeatureSpecError(f"{where}: split_binary holds one value per row, found "
                                   f"dimensions [{spec.dimension(name)}] {hint}")
        dtype = dtype_name((spec.feature_spec[name] or {}).get("dtype"))
        if dtype and is_float_feature(spec, name) and dtype not in FLOAT_DTYPES[output_format]:
            raise FeatureSpecError(f"{where}: dtype {dtype} does not fit {output_format} "
                                   f"(holds {list(FLOAT_DTYPES[output_format])})")


def _check_labels(spec: FeatureSpec, mapping: str, labels: np.ndarray, first_row: int):
    ok = np.isin(labels, (0, 1))
    if not ok.all():
        bad = int(np.argmin(ok))
        label = spec.label_feature
        raise DatasetError(f"mapping '{mapping}' ({_files_of(spec, mapping, label)}): label "
                           f"'{label}' must be 0 or 1, found {labels[bad]:g} in row "
                           f"{first_row + bad} of the mapping")


def _write_split_binary(writer, spec: FeatureSpec, mapping: str, block: dict, n: int):
    numerical = (np.stack([block[f] for f in spec.numerical_features], axis=1)
                 if spec.numerical_features else np.zeros((n, 0)))
    writer.write(mapping, numerical, [block[f] for f in spec.categorical_features],
                 block[spec.label_feature])


def _write_columnar(writer, spec: FeatureSpec, mapping: str, block: dict, n: int):
    writer.write(mapping, block)


def _open_writer(spec: FeatureSpec, inferred: dict, output_dir: str, output_format: str,
                 overwrite: bool, family=None):
    if output_format == SPLIT_BINARY:
        return SplitBinaryWriter(output_dir, output_spec(spec, inferred), overwrite), \
            _write_split_binary
    out = columnar_output_spec(spec, inferred, output_format, family)
    return ColumnarWriter(output_dir, out, output_format, overwrite), _write_columnar


def transcode(input_dir: str, output_dir: str, chunk_size: int = 1_000_000,
              overwrite: bool = False, feature_spec: str = DEFAULT_FILENAME,
              quiet: bool = True, output_format: str = None) -> FeatureSpec:
    """Write the CSV dataset of input_dir as output_format (None: the format of the model
    family whose channels the spec uses); returns the written spec."""
    if chunk_size < 1:
        raise DatasetError(f"chunk_size must be positive, found {chunk_size}")
    spec = load_csv_spec(os.path.join(input_dir, feature_spec))
    family, output_format = choose_format(spec, output_format)
    t0 = time.perf_counter()
    inferred = infer_cardinalities(spec, chunk_size)
    if inferred and not quiet:
        print(f"inferred cardinalities {inferred} ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    writer, write_block = _open_writer(spec, inferred, output_dir, output_format, overwrite,
                                       family)
    with writer:
        for mapping in spec.mappings:
            rows = 0
            for block, n in _mapping_rows(spec, mapping, chunk_size):
                _check_labels(spec, mapping, block[spec.label_feature], rows)
                try:
                    write_block(writer, spec, mapping, block, n)
                except DatasetError as e:
                    culprit = next((f for f in spec.feature_spec if f"'{f}'" in str(e)), None)
                    where = f" ({_files_of(spec, mapping, culprit)})" if culprit else ""
                    raise DatasetError(f"mapping '{mapping}'{where} rows {rows}..{rows + n - 1}"
                                       f": {e}") from None
                rows += n
                if not quiet:
                    print(f"{mapping}: {rows:,} rows", flush=True)
    return writer.spec


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True,
                   help="directory holding the CSV files and the feature spec describing them")
    p.add_argument("--output", required=True,
                   help="output directory for the dataset (missing or empty "
                        "unless --overwrite)")
    p.add_argument("--output_format", choices=OUTPUT_FORMATS,
                   help="split_binary (DLRM), parquet (Wide & Deep) or tfrecord (SIM); "
                        "default: the format of the family whose channels the spec uses")
    p.add_argument("--chunk_size", type=int, default=1_000_000,
                   help="rows read and written at a time (and rows per parquet/tfrecord "
                        "file); higher is faster but needs more memory (default 1,000,000)")
    p.add_argument("--feature_spec", "--feature_spec_in", default=DEFAULT_FILENAME,
                   help="spec file name inside --input (default feature_spec.yaml)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty --output (only once the new data is complete)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p.parse_args(argv)


def _cardinalities(spec: FeatureSpec) -> dict:
    return {n: p["cardinality"] for n, p in spec.feature_spec.items() if "cardinality" in p}


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()

    def work():
        spec = transcode(args.input, args.output, args.chunk_size, args.overwrite,
                         args.feature_spec, quiet=args.quiet, output_format=args.output_format)
        rows = spec.metadata.get("rows", {})
        return (f"wrote {args.output}: " + ", ".join(f"{m} {n:,} rows" for m, n in rows.items())
                + f"; cardinalities {_cardinalities(spec)} ({time.perf_counter() - t0:.1f} s)")
    return run_cli(work, errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
