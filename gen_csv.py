#!/usr/bin/env python3
"""Write random CSV data matching a feature spec, with a feature_spec.yaml describing it.

    python gen_csv.py --feature_spec_in SPEC.yaml [--output DIR] --size 100000 [--seed 0]

For every mapping of SPEC's source_spec, --size rows are written: each chunk's features as
header-less comma-separated columns in chunk order, its rows split evenly over the chunk's
files. Integer columns hold uniform random ids in [0, cardinality) (cardinality `auto` or
none uses --auto_cardinality), numerical (float) columns random non-negative floats, and the
label real 0/1 values. A feature with `dimensions: [d]` or `max_hotness: d` gets 0..d ids
per row joined by `|`. DIR/feature_spec.yaml repeats SPEC with every chunk typed `csv` (a
chunk of another type is renamed <file>.csv), ready for transcode.py. The output goes through a
temporary directory; a non-empty DIR is refused unless --overwrite. Without --output the
files are added to SPEC's own directory (as NVIDIA's README runs it), where an existing file
of the same name is refused unless --overwrite and nothing else is touched.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd

from core.cli import run_cli
from core.files import StagedDirectory
from core.sources import DatasetError
from core.feature_spec import CHUNK_TYPES, DEFAULT_FILENAME
from transcode import AUTO, CSV, SEPARATOR, is_float_feature, load_csv_spec


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feature_spec_in", required=True,
                   help="yaml describing the features, channels and file layout to imitate "
                        "(chunks of any type)")
    p.add_argument("--output", default=None,
                   help="directory to write the CSV files and feature_spec.yaml into "
                        "(default: add them to the directory of --feature_spec_in)")
    p.add_argument("--size", type=int, default=100_000,
                   help="rows per mapping (default 100,000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--auto_cardinality", type=int, default=1000,
                   help="id range used for categorical features whose cardinality is 'auto' "
                        "(default 1000)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output")
    return p.parse_args(argv)


def _as_csv_spec(spec):
    """Retype every chunk as csv; files of other chunk types get a .csv name."""
    out = spec.copy()
    for chunks in out.source_spec.values():
        for chunk in chunks:
            if chunk["type"] != CSV:
                chunk["files"] = [os.path.splitext(f)[0] + ".csv" for f in chunk["files"]]
                chunk["type"] = CSV
    return out


def _column(rng, spec, name, rows, auto_cardinality):
    if name == spec.label_feature:
        return (rng.random(rows) < 0.3).astype(np.int64)
    if is_float_feature(spec, name):
        return rng.exponential(2.0, rows)
    card = (spec.feature_spec[name] or {}).get("cardinality", AUTO)
    card = auto_cardinality if card == AUTO else int(card)
    width = spec.dimension(name)  # dimensions: [d] or max_hotness: d
    if width is None:
        return rng.integers(0, card, rows)
    lengths = rng.integers(0, width + 1, rows)
    ids = rng.integers(0, card, int(lengths.sum())).astype(str)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return np.array([SEPARATOR.join(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])],
                    dtype=object)


def _add_files(tmp: str, output: str, overwrite: bool) -> None:
    """Move every file of `tmp` into the existing directory `output` (same relative paths);
    all of them are checked for collisions before any is moved."""
    names = [os.path.relpath(os.path.join(d, f), tmp) for d, _, fs in os.walk(tmp) for f in fs]
    taken = [n for n in names if os.path.exists(os.path.join(output, n))]
    if taken and not overwrite:
        raise DatasetError(f"{os.path.join(output, taken[0])} exists; refusing to replace it "
                           f"(pass --overwrite, or --output DIR)")
    for name in names:
        os.makedirs(os.path.dirname(os.path.join(output, name)), exist_ok=True)
        os.replace(os.path.join(tmp, name), os.path.join(output, name))


def generate(spec_in: str, output: str = None, size: int = 100_000, seed: int = 0,
             auto_cardinality: int = 1000, overwrite: bool = False):
    """output None: add the files to the spec's directory."""
    if size < 0:
        raise DatasetError(f"--size must be >= 0, found {size}")
    spec = load_csv_spec(spec_in, chunk_types=CHUNK_TYPES)
    spec = _as_csv_spec(spec)
    beside = output is None
    output = os.path.abspath(output or os.path.dirname(os.path.abspath(spec_in)))
    # beside the spec: files are added to its directory, collisions checked by _add_files
    staged = StagedDirectory(output, overwrite=overwrite or beside)
    tmp = staged.tmp_dir
    try:
        rng = np.random.default_rng(seed)
        for mapping, chunks in spec.source_spec.items():
            columns = {}
            for chunk in chunks:
                for name in chunk["features"]:
                    columns[name] = _column(rng, spec, name, size, auto_cardinality)
            for chunk in chunks:
                files = chunk["files"]
                bounds = [size * i // len(files) for i in range(len(files) + 1)]
                for f, lo, hi in zip(files, bounds[:-1], bounds[1:]):
                    path = os.path.join(tmp, f)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    frame = pd.DataFrame({i: columns[n][lo:hi]
                                          for i, n in enumerate(chunk["features"])})
                    frame.to_csv(path, header=False, index=False, float_format="%.4f")
        spec.metadata = dict(spec.metadata, generated_by="gen_csv.py", seed=seed, size=size)
        spec.to_yaml(os.path.join(tmp, DEFAULT_FILENAME))
        if beside:
            _add_files(tmp, output, overwrite)
            staged.discard()
        else:
            staged.publish()
    except BaseException:
        staged.discard()
        raise
    return spec


def main(argv=None) -> int:
    args = parse_args(argv)

    def work():
        spec = generate(args.feature_spec_in, args.output, args.size, args.seed,
                        args.auto_cardinality, args.overwrite)
        files = sum(len(c["files"]) for cs in spec.source_spec.values() for c in cs)
        output = args.output or os.path.dirname(os.path.abspath(args.feature_spec_in))
        return (f"wrote {output}: {files} csv files, {args.size:,} rows per mapping "
                f"({', '.join(spec.mappings)})")
    return run_cli(work, errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
