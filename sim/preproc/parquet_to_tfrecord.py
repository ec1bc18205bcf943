"""NVIDIA's BYO parquet layout -> SIM TFRecords (plain or prebatched) with feature_spec.yaml.

  python -m sim.preproc.parquet_to_tfrecord --amazon_dataset_path PARQUET
      --tfrecord_output_dir OUT [--number_of_user_features 1] [--max_seq_len 100]
      [--prebatch_train_size P] [--prebatch_test_size P] [--train_parts 8] [--test_parts 4]

PARQUET holds metadata.json ({"cardinalities": [{"name": ..., "value": N}, ...]}: user
features, then item features) and train/, test/ parquet parts whose columns are, in this
order: the label, the user features, the target item features, the positive history of each
item feature, the negative history of each item feature (columns are taken by position, as
NVIDIA's tool takes them). Ids run 1..cardinality (0 is padding); histories hold at most
--max_seq_len behaviours, oldest first, and are written left-padded to that length.

The output is what NVIDIA's preprocessing/parquet_to_tfrecord.py writes (its feature names,
one row per record, or --prebatch_*_size rows per record with the last rows in
remainder.tfrecord), without its defects: no record is truncated, a row count divisible by
the prebatch size needs no remainder file, and the spec records the prebatch sizes
(metadata.prebatch_size). It is written into a staged directory renamed into place.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

from core import runtime
from core.cli import run_cli
from core.feature_spec import FeatureSpec
from sim.contract import (NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL,
                          left_padded)


class ParquetInputError(ValueError):
    pass


def reference_spec(user_cards, item_cards, max_seq_len: int) -> FeatureSpec:
    """The spec NVIDIA's tool writes (names user_feat_i, item_feat_i_{trgt,pos,neg}, label;
    bool label), files and rows left for the writer."""
    features = {f"user_feat_{i}": {"dtype": "int64", "cardinality": int(c)}
                for i, c in enumerate(user_cards)}
    channels = {USER_CHANNEL: list(features)}
    for channel, suffix in ((TARGET_CHANNEL, "trgt"), (POSITIVE_CHANNEL, "pos"),
                            (NEGATIVE_CHANNEL, "neg")):
        channels[channel] = []
        for i, c in enumerate(item_cards):
            name = f"item_feat_{i}_{suffix}"
            features[name] = {"dtype": "int64", "cardinality": int(c)}
            if channel != TARGET_CHANNEL:
                features[name]["dimensions"] = [int(max_seq_len)]
            channels[channel].append(name)
    features["label"] = {"dtype": "bool"}
    channels["label"] = ["label"]
    return FeatureSpec(feature_spec=features, source_spec={}, channel_spec=channels)


def read_cardinalities(path: str) -> list:
    try:
        with open(path) as f:
            entries = json.load(f)["cardinalities"]
        return [int(e["value"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ParquetInputError(f"{path}: expected {{\"cardinalities\": [{{\"name\": ..., "
                                f"\"value\": N}}, ...]}} ({type(e).__name__}: {e})") from None


def parquet_files(directory: str) -> list:
    files = sorted(glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True))
    if not files:
        raise ParquetInputError(f"no parquet file under {directory}")
    return files


def read_split(files: list, spec: FeatureSpec) -> dict:
    """Every row of the split's files as the writer's columns, checked file by file."""
    import pyarrow.parquet as pq
    names = [f for c in ("label", USER_CHANNEL, TARGET_CHANNEL, POSITIVE_CHANNEL,
                         NEGATIVE_CHANNEL) for f in spec.channel(c)]
    pieces = []
    for path in files:
        table = pq.read_table(path)
        if table.num_columns != len(names):
            raise ParquetInputError(f"{path}: {table.num_columns} columns {table.column_names}, "
                                    f"expected {len(names)}: the label, the user features, "
                                    f"then the target, positive and negative item features")
        pieces.append({name: _column(table.column(k).combine_chunks(), name, spec, path,
                                     table.column_names[k])
                       for k, name in enumerate(names)})
    return {name: np.concatenate([p[name] for p in pieces]) for name in names}


def _column(column, name: str, spec: FeatureSpec, path: str, source: str) -> np.ndarray:
    from core.sources import pad_ragged
    where = f"{path}: column {source!r} (feature '{name}')"
    if column.null_count:
        raise ParquetInputError(f"{where} has {column.null_count} missing value(s)")
    width = spec.dimension(name)
    if width is None:
        values = column.to_numpy(zero_copy_only=False)
    else:
        try:
            flat = column.flatten().to_numpy(zero_copy_only=False)
        except (AttributeError, TypeError):
            raise ParquetInputError(f"{where} is {column.type}, expected a list of ids") \
                from None
        lengths = np.diff(column.offsets.to_numpy())
        values = left_padded((pad_ragged(flat.astype(np.int64), lengths, width, name, where),
                              lengths), width)
    if name == "label":
        return values.astype(bool)
    card = spec.cardinality(name)
    bad = (values < 0) | (values > card)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ParquetInputError(f"{where} row {row}: id {values[bad][0]} outside [0, {card}] "
                                f"(ids 1..cardinality from metadata.json, 0 = padding)")
    return values.astype(np.int64)


def part_bounds(rows: int, parts: int, prebatch: int) -> list:
    """Row bounds of the output parts: whole records spread over `parts` files, the rows
    short of a record (prebatching) after them (the writer puts those in the remainder)."""
    size = prebatch or 1
    records = np.array_split(np.arange(rows // size), parts)
    bounds = np.cumsum([0] + [len(r) * size for r in records])
    bounds[-1] = rows
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def convert(args) -> FeatureSpec:
    from core.columnar import ColumnarWriter
    cards = read_cardinalities(os.path.join(args.amazon_dataset_path, args.metadata_file))
    users = args.number_of_user_features
    if not 0 <= users < len(cards):
        raise ParquetInputError(f"--number_of_user_features {users}: metadata.json lists "
                                f"{len(cards)} cardinalities, which must include at least "
                                f"one item feature")
    spec = reference_spec(cards[:users], cards[users:], args.max_seq_len)
    splits = {"train": (args.train_split_dir, args.train_parts, args.prebatch_train_size),
              "test": (args.test_split_dir, args.test_parts, args.prebatch_test_size)}
    prebatch = {m: s[2] for m, s in splits.items() if s[2]}
    writer = ColumnarWriter(args.tfrecord_output_dir, spec, "tfrecord", args.overwrite,
                            ids_from_one=True, prebatch=prebatch)
    with writer:
        for mapping, (directory, parts, size) in splits.items():
            columns = read_split(parquet_files(os.path.join(args.amazon_dataset_path,
                                                            directory)), spec)
            rows = len(columns["label"])
            for a, b in part_bounds(rows, parts, size):
                writer.write(mapping, {k: _history(spec, k, v[a:b])
                                       for k, v in columns.items()})
    return writer.spec


def _history(spec, name, values):
    """The writer's form of a column: histories as (padded values, full lengths)."""
    if spec.dimension(name) is None:
        return values
    return values, np.full(len(values), values.shape[1], np.int64)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--amazon_dataset_path", required=True, help="BYO parquet directory")
    p.add_argument("--tfrecord_output_dir", required=True, help="output directory")
    p.add_argument("--number_of_user_features", type=int, default=1)
    p.add_argument("--max_seq_len", type=int, default=100, help="history length (dimensions)")
    p.add_argument("--n_proc", type=int, default=0,
                   help="accepted for NVIDIA's command line; the writer is one process")
    p.add_argument("--train_split_dir", default="train")
    p.add_argument("--test_split_dir", default="test")
    p.add_argument("--metadata_file", default="metadata.json")
    p.add_argument("--train_output_dir", default="train", choices=["train"],
                   help="fixed: train/ (as NVIDIA's default)")
    p.add_argument("--test_output_dir", default="test", choices=["test"],
                   help="fixed: test/ (as NVIDIA's default)")
    p.add_argument("--train_parts", type=int, default=8, help="train files (at most)")
    p.add_argument("--test_parts", type=int, default=4, help="test files (at most)")
    p.add_argument("--prebatch_train_size", type=int, default=0,
                   help="rows per train record (0: one row per record)")
    p.add_argument("--prebatch_test_size", type=int, default=0,
                   help="rows per test record (0: one row per record)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output dir")
    args = p.parse_args(argv)
    for flag in ("max_seq_len", "train_parts", "test_parts"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be positive, found {getattr(args, flag)}")
    for flag in ("prebatch_train_size", "prebatch_test_size"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must be >= 0, found {getattr(args, flag)}")
    return args


def main(argv=None):
    runtime.configure()  # quiet TensorFlow, which the TFRecord writer imports
    args = parse_args(argv)

    def work():
        spec = convert(args)
        return f"wrote {args.tfrecord_output_dir}: {spec.metadata['rows']} rows" + (
            f", prebatch {spec.metadata['prebatch_size']}" if "prebatch_size" in spec.metadata
            else "")
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
