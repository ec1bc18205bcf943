#!/usr/bin/env python3
"""Loader throughput: how close SplitBinaryReader gets to reading the same files raw.

Builds (or reuses) a split-binary dataset with the criteo_t15 shape (13 float16 numerical
features, 26 categorical features with the narrowest integer dtypes of the t15 cardinalities,
a bool label), warms the page cache, then times

  raw       plain sequential reads of every file into one reused buffer (the ceiling; the
            fastest of a few buffer sizes),
  reader    SplitBinaryReader.get over every batch, in file order,
  shuffled  the same with a seeded shuffled batch order,
  tf.data   dataloader.BatchPipeline (tf.data over the same reader, with its dtype
            conversions and prefetch), when dataloader.py and TensorFlow import.

Each figure is the best of --repeats passes over the whole mapping. Bytes per second count
the bytes of the dataset files, so the reader's MB/s is directly comparable with raw.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow, if dataloader imports it
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from datasets import (DatasetError, SplitBinaryReader, SplitBinaryWriter,  # noqa: E402
                      SyntheticSource, check_mapping_files)
from feature_spec import FeatureSpec, FeatureSpecError  # noqa: E402

MAPPING = "train"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", default=None,
                   help="dataset directory to reuse, or to create if it is missing or empty "
                        "(default: a temporary directory, deleted afterwards)")
    p.add_argument("--rows", type=int, default=3_000_000,
                   help="rows of the train mapping to generate (default 3,000,000: ~270 MB)")
    p.add_argument("--batch_size", type=int, default=65536, help="reader batch size")
    p.add_argument("--repeats", type=int, default=10, help="passes per measurement (best kept)")
    p.add_argument("--raw_buffer_kb", default="256,1024,4096",
                   help="comma-separated buffer sizes (KiB) tried for the raw sequential reads; "
                        "the fastest is the raw figure (default 256,1024,4096)")
    p.add_argument("--skip_tfdata", action="store_true", help="do not try dataloader.py")
    return p.parse_args(argv)


def mapping_files(spec: FeatureSpec, mapping: str) -> list:
    files = spec.feature_files(mapping)
    paths = [files["label"]] + list(files["categorical"])
    if files["numerical"]:
        paths.insert(0, files["numerical"])
    return paths


def build_dataset(path: str, rows: int, batch_size: int = 65536) -> FeatureSpec:
    spec = FeatureSpec.get_variant("criteo_t15_synthetic")
    source = SyntheticSource(spec, batch_size, -(-rows // batch_size), seed=1)
    t0 = time.perf_counter()
    with SplitBinaryWriter(path, spec, overwrite=True) as writer:
        written = 0
        for i in range(len(source)):
            numerical, categorical, label = source.get(i)
            take = min(batch_size, rows - written)
            writer.write("train", numerical[:take], [c[:take] for c in categorical],
                         label[:take])
            written += take
        numerical, categorical, label = source.get(0)
        writer.write("test", numerical[:1024], [c[:1024] for c in categorical], label[:1024])
    print(f"generated {rows:,} rows in {time.perf_counter() - t0:.1f} s at {path}")
    return FeatureSpec.from_yaml(os.path.join(path, "feature_spec.yaml")).validate()


def reusable(path: str, rows: int):
    spec_path = os.path.join(path, "feature_spec.yaml")
    if not os.path.isfile(spec_path):
        return None
    try:
        spec = FeatureSpec.from_yaml(spec_path).validate()
        wanted = FeatureSpec.get_variant("criteo_t15_synthetic")
        if spec.cardinalities != wanted.cardinalities or \
                len(spec.numerical_features) != len(wanted.numerical_features):
            return None
        if check_mapping_files(spec, MAPPING) < rows:
            return None
        return spec
    except (FeatureSpecError, DatasetError):
        return None


def raw_pass(paths, buffer: bytearray) -> int:
    view, total = memoryview(buffer), 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                total += n
    return total


def reader_pass(reader: SplitBinaryReader, order) -> int:
    rows = 0
    for i in order:
        numerical, categorical, label = reader.get(int(i))
        rows += label.shape[0]
    return rows


def tfdata_pass(dataset) -> int:
    rows = 0
    for element in dataset:
        rows += int(element[0].shape[0])  # (numerical, categorical, label, global_rows)
    return rows


def best_time(fn, repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def try_tfdata(reader, spec):
    """The lead's tf.data pipeline (dataloader.BatchPipeline) over `reader`, if available."""
    try:
        import dataloader  # written by the lead; optional
        pipeline = dataloader.BatchPipeline(reader, spec.cardinalities)
        return pipeline.dataset(np.arange(len(reader))), "dataloader.BatchPipeline"
    except Exception as e:  # ImportError, TF failing to import, a changed API
        return None, f"dataloader.BatchPipeline unavailable ({type(e).__name__}: {e})"


def main(argv=None):
    args = parse_args(argv)
    own_tmp = args.data_dir is None
    data_dir = tempfile.mkdtemp(prefix="loader_bench-") if own_tmp else args.data_dir
    try:
        spec = reusable(data_dir, args.rows)
        if spec is None and not own_tmp and os.path.isdir(data_dir) and os.listdir(data_dir):
            print(f"error: {data_dir} is not empty and holds no reusable criteo_t15-shaped "
                  f"dataset of >= {args.rows} train rows; give an empty or new directory",
                  file=sys.stderr)
            return 2
        if spec is None:
            spec = build_dataset(os.path.join(data_dir, "data") if own_tmp else data_dir,
                                 args.rows, args.batch_size)
        else:
            print(f"reusing dataset at {data_dir}")
        paths = mapping_files(spec, MAPPING)
        total_bytes = sum(os.path.getsize(p) for p in paths)
        num_rows = check_mapping_files(spec, MAPPING)
        buffers = [bytearray(int(kb) << 10) for kb in args.raw_buffer_kb.split(",")]
        raw_pass(paths, buffers[0])  # warm the page cache
        raw_pass(paths, buffers[0])

        reader = SplitBinaryReader(spec, MAPPING, args.batch_size, drop_last=False)
        shuffled = SplitBinaryReader(spec, MAPPING, args.batch_size, drop_last=False,
                                     shuffle=True, seed=0)
        assert reader_pass(reader, range(len(reader))) == num_rows
        # Round-robin the variants so that a burst of load on the machine hits them alike.
        variants = [(f"raw{len(b) >> 10}", lambda b=b: raw_pass(paths, b)) for b in buffers]
        variants += [("reader", lambda: reader_pass(reader, range(len(reader)))),
                     ("shuffled", lambda: reader_pass(shuffled, shuffled.batch_order(0)))]
        best = {name: float("inf") for name, _ in variants}
        for _ in range(args.repeats):
            for name, fn in variants:
                best[name] = min(best[name], best_time(fn, 1)[0])
        raw_kb = min(buffers, key=lambda b: best[f"raw{len(b) >> 10}"]).__len__() >> 10
        results = [(f"raw read ({raw_kb} KiB buffer)", best[f"raw{raw_kb}"]),
                   ("SplitBinaryReader.get", best["reader"]),
                   ("  shuffled batch order", best["shuffled"])]
        if not args.skip_tfdata:
            dataset, how = try_tfdata(reader, spec)
            if dataset is not None:
                tfdata_pass(dataset)  # build graphs, first pass
                t, _ = best_time(lambda: tfdata_pass(dataset), max(1, args.repeats // 3))
                results.append(("tf.data BatchPipeline", t))
            else:
                print(f"tf.data pipeline skipped: {how}")

        raw_bps = total_bytes / results[0][1]
        print(f"\ndataset: {num_rows:,} rows x {total_bytes / num_rows:.0f} B/row = "
              f"{total_bytes / 1e6:.0f} MB in {len(paths)} files; batch {args.batch_size}; "
              f"best of {args.repeats} (tf.data: {max(1, args.repeats // 3)}); page cache warm")
        print(f"{'path':<30} {'time s':>8} {'samples/s':>14} {'MB/s':>9} {'vs raw':>7}")
        for name, t in results:
            bps = total_bytes / t
            print(f"{name:<30} {t:8.3f} {num_rows / t:14,.0f} {bps / 1e6:9,.0f} "
                  f"{bps / raw_bps:7.0%}")
        reader.close()
        shuffled.close()
        return 0
    finally:
        if own_tmp:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
