#!/usr/bin/env python3
"""Write a split-binary dataset (train and test mappings, optionally validation) from a
batch source.

Quick start, synthetic data shaped like the spec in DIR (cardinalities and numerical count):
    python generate_feature_spec.py --variant criteo_t15_synthetic --dst DIR/feature_spec.yaml
    python transcribe.py --src_dataset_type synthetic --src_dataset_path DIR \\
        --dst_dataset_path OUT --max_batches_train 1000 --max_batches_test 100 \\
        --dst_dataset_type tf_raw

Synthetic batches come from datasets.SyntheticSource: batch i is a pure function of
(--seed, i). Train uses batches 0..N-1 and test uses batches N..N+M-1, so the two never share
rows; --max_batches_validation V adds a validation mapping of batches N+M..N+M+V-1 (training
then selects its best epoch on it and reports the test data held out). Categorical ids follow id = floor(cardinality * u ** alpha) with u ~ U(0, 1)
(--power_law_alpha 1 is uniform; larger values favour small ids). With --signal_strength s
the label is Bernoulli(sigmoid(s * z - 1)) for the planted score
    z = (num_0 + num_1) / sqrt(2) + (h(cat_0) + h(cat_1)) / sqrt(2),
numerical features ~ N(0, 1) and h(id) = +1/-1 from the parity of a multiplicative hash of
the id; s = 0 (the default) gives labels independent of the features.

--src_dataset_type tf_raw copies (the first batches of) an existing split-binary dataset
instead, e.g. to cut a small test copy of a big one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from core.cli import run_cli
from core.sources import load_spec
from datasets import SplitBinaryReader, SplitBinaryWriter, SyntheticSource
from dlrm_contract import DLRM_CONTRACT
from core.feature_spec import (CATEGORICAL_CHANNEL, CATEGORICAL_DTYPES, DEFAULT_FILENAME,
                               FeatureSpec, FeatureSpecError, LABEL_CHANNEL, LABEL_DTYPES,
                               NUMERICAL_CHANNEL, NUMERICAL_DTYPES, REQUIRED_MAPPINGS, TEST_MAPPING,
                               TRAIN_MAPPING, VALIDATION_MAPPING, allowed_dtype,
                               narrowest_int_dtype, read_spec_yaml)

SPLIT_BINARY_TYPES = ("tf_raw", "split_binary")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src_dataset_type", choices=("synthetic",) + SPLIT_BINARY_TYPES,
                   default="synthetic",
                   help="synthetic: generate batches shaped like the spec in "
                        "--src_dataset_path; tf_raw/split_binary: copy that dataset")
    p.add_argument("--src_dataset_path", required=True,
                   help="directory holding the source feature_spec.yaml (for synthetic, only "
                        "its shape is used: cardinalities, numerical count, dtypes)")
    p.add_argument("--dst_dataset_path", required=True,
                   help="output directory; must be missing or empty unless --overwrite")
    p.add_argument("--dst_dataset_type", choices=SPLIT_BINARY_TYPES, default="tf_raw",
                   help="output format: tf_raw (= split_binary, the only one)")
    p.add_argument("--max_batches_train", type=int, default=-1,
                   help="train batches to write (synthetic: required, > 0; copy: -1 = all)")
    p.add_argument("--max_batches_test", type=int, default=-1,
                   help="test batches to write (synthetic: required, > 0; copy: -1 = all)")
    p.add_argument("--max_batches_validation", type=int, default=0,
                   help="synthetic: validation batches to write besides train and test "
                        "(default 0: no validation split; training then selects on test)")
    p.add_argument("--src_batch_size", type=int, default=65536,
                   help="rows per source batch (default 65536)")
    p.add_argument("--seed", type=int, default=0, help="synthetic data seed (default 0)")
    p.add_argument("--signal_strength", type=float, default=0.0,
                   help="synthetic label signal s >= 0 (default 0: random labels)")
    p.add_argument("--power_law_alpha", type=float, default=1.2,
                   help="synthetic id skew alpha >= 1 (1 = uniform; default 1.2)")
    p.add_argument("--feature_spec", default=DEFAULT_FILENAME,
                   help="name of the spec file inside --src_dataset_path "
                        "(default feature_spec.yaml)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty --dst_dataset_path (only once the new one is "
                        "complete)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p.parse_args(argv)


def spec_shape(path: str, mappings=REQUIRED_MAPPINGS) -> FeatureSpec:
    """The default-layout spec with the shape of the yaml at `path`.

    Only channel_spec and feature_spec are read, so a spec without a usable source_spec (as
    NVIDIA's generator writes) works. Dtypes are kept where the split-binary format allows
    them, otherwise float16 / the narrowest integer type / bool are used."""
    raw = read_spec_yaml(path)
    fs = raw.get("feature_spec") or {}
    cs = raw.get("channel_spec") or {}
    categorical = list(cs.get(CATEGORICAL_CHANNEL) or [])
    numerical = list(cs.get(NUMERICAL_CHANNEL) or [])
    labels = list(cs.get(LABEL_CHANNEL) or ["label"])
    if len(labels) != 1:
        raise FeatureSpecError(f"{path}: channel 'label' must hold one feature, found {labels}")
    cards, cat_dtypes = [], []
    for name in categorical:
        props = fs.get(name) or {}
        card = props.get("cardinality")
        if isinstance(card, bool) or not isinstance(card, int) or card < 1:
            raise FeatureSpecError(f"{path}: categorical feature '{name}' needs an integer "
                                   f"cardinality, found {card!r}")
        cards.append(card)
        dtype = allowed_dtype(props.get("dtype"), CATEGORICAL_DTYPES)
        if dtype is None or card - 1 > np.iinfo(dtype).max:
            dtype = narrowest_int_dtype(card)
        cat_dtypes.append(dtype)
    num_dtypes = {allowed_dtype((fs.get(n) or {}).get("dtype"), NUMERICAL_DTYPES)
                  for n in numerical}
    num_dtype = num_dtypes.pop() if len(num_dtypes) == 1 and None not in num_dtypes \
        else "float16"
    label_dtype = (allowed_dtype((fs.get(labels[0]) or {}).get("dtype"), LABEL_DTYPES)
                   or "bool")
    return FeatureSpec.get_default(len(numerical), cards, mappings=mappings,
                                   numerical_dtype=num_dtype, label_dtype=label_dtype,
                                   categorical_dtypes=cat_dtypes, numerical_names=numerical,
                                   categorical_names=categorical,
                                   label_name=labels[0]).validate(DLRM_CONTRACT)


class Progress:
    def __init__(self, what: str, total: int, quiet: bool):
        self.what, self.total, self.quiet = what, total, quiet
        self.t0 = self.last = time.perf_counter()
        self.rows = 0

    def update(self, done: int, rows: int):
        self.rows += rows
        now = time.perf_counter()
        if self.quiet or (now - self.last < 2.0 and done != self.total):
            return
        self.last = now
        rate = self.rows / max(now - self.t0, 1e-9)
        print(f"{self.what}: {done}/{self.total} batches, {self.rows:,} rows "
              f"({rate:,.0f} rows/s)", flush=True)


def _copy(writer, mapping: str, source, indices, quiet: bool):
    progress = Progress(mapping, len(indices), quiet)
    for done, index in enumerate(indices, 1):
        numerical, categorical, label = source.get(int(index))
        writer.write(mapping, numerical, categorical, label)
        progress.update(done, label.shape[0])
    return progress.rows


def transcribe(args) -> FeatureSpec:
    src_spec_path = os.path.join(args.src_dataset_path, args.feature_spec)
    if args.src_dataset_type == "synthetic":
        if args.max_batches_train < 1 or args.max_batches_test < 1:
            raise FeatureSpecError("synthetic source: give --max_batches_train and "
                                   "--max_batches_test (both > 0)")
        if args.signal_strength < 0:
            raise FeatureSpecError(f"--signal_strength must be >= 0, found "
                                   f"{args.signal_strength}")
        if args.max_batches_validation < 0:
            raise FeatureSpecError(f"--max_batches_validation must be >= 0, found "
                                   f"{args.max_batches_validation}")
        n_train, n_test = args.max_batches_train, args.max_batches_test
        n_val = args.max_batches_validation
        spec = spec_shape(src_spec_path, REQUIRED_MAPPINGS + ((VALIDATION_MAPPING,) if n_val
                                                              else ()))
        source = SyntheticSource(spec, args.src_batch_size, n_train + n_test + n_val,
                                 seed=args.seed, power_law_alpha=args.power_law_alpha,
                                 signal_strength=args.signal_strength)
        # validation after test: the train and test batches of a seed stay what they were
        plan = {TRAIN_MAPPING: (source, range(n_train)),
                TEST_MAPPING: (source, range(n_train, n_train + n_test))}
        if n_val:
            plan[VALIDATION_MAPPING] = (source, range(n_train + n_test,
                                                      n_train + n_test + n_val))
        spec.metadata.update(source="synthetic", seed=args.seed,
                             signal_strength=args.signal_strength,
                             power_law_alpha=args.power_law_alpha,
                             batch_size=args.src_batch_size)
    else:
        spec = load_spec(args.src_dataset_path, DLRM_CONTRACT, args.feature_spec)
        plan = {}
        for mapping, limit in ((TRAIN_MAPPING, args.max_batches_train),
                               (TEST_MAPPING, args.max_batches_test)):
            reader = SplitBinaryReader(spec, mapping, args.src_batch_size, drop_last=False)
            count = len(reader) if limit < 0 else min(limit, len(reader))
            plan[mapping] = (reader, range(count))
        spec = FeatureSpec.get_default(
            len(spec.numerical_features), spec.cardinalities, mappings=REQUIRED_MAPPINGS,
            numerical_dtype=str(spec.dtype(spec.numerical_features[0]))
            if spec.numerical_features else "float16",
            label_dtype=str(spec.dtype(spec.label_feature)),
            categorical_dtypes=[str(spec.dtype(n)) for n in spec.categorical_features],
            numerical_names=spec.numerical_features,
            categorical_names=spec.categorical_features, label_name=spec.label_feature)
        spec.metadata["source"] = os.path.abspath(args.src_dataset_path)
    with SplitBinaryWriter(args.dst_dataset_path, spec, overwrite=args.overwrite) as writer:
        for mapping, (source, indices) in plan.items():
            _copy(writer, mapping, source, indices, args.quiet)
    return writer.spec


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()

    def work():
        spec = transcribe(args)
        rows = spec.metadata.get("rows", {})
        return (f"wrote {args.dst_dataset_path}: " +
                ", ".join(f"{m} {n:,} rows" for m, n in rows.items()) +
                f" in {time.perf_counter() - t0:.1f} s")
    return run_cli(work, errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
