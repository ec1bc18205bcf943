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

Then the same for the columnar formats of the other families (skip with --skip_columnar):
a Wide & Deep-shaped parquet dataset (13 one-hot and 3 multi-hot (3 values) categorical
features, 13 numerical, label, display id) and a SIM-shaped TFRecord dataset (user, target
item and category, positive and negative histories of 100 items and categories, label):
raw read of the same files, ColumnarReader.get over every batch, and DictPipeline (tf.data).
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

from core.columnar import open_reader, write_columns  # noqa: E402
from core.feature_spec import FeatureSpec, FeatureSpecError  # noqa: E402
from core.sources import DatasetError  # noqa: E402
from datasets import (SplitBinaryReader, SplitBinaryWriter, SyntheticSource,  # noqa: E402
                      check_mapping_files)
from dlrm_contract import criteo_variant  # noqa: E402

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
    p.add_argument("--skip_columnar", action="store_true",
                   help="skip the parquet (Wide & Deep) and TFRecord (SIM) rows")
    p.add_argument("--parquet_rows", type=int, default=400_000,
                   help="rows of the Wide & Deep-shaped parquet dataset (default 400,000)")
    p.add_argument("--tfrecord_rows", type=int, default=40_000,
                   help="rows of the SIM-shaped TFRecord dataset (default 40,000)")
    return p.parse_args(argv)


def mapping_files(spec: FeatureSpec, mapping: str) -> list:
    files = spec.feature_files(mapping)
    paths = [files["label"]] + list(files["categorical"])
    if files["numerical"]:
        paths.insert(0, files["numerical"])
    return paths


def build_dataset(path: str, rows: int, batch_size: int = 65536) -> FeatureSpec:
    spec = criteo_variant("criteo_t15_synthetic")
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
        wanted = criteo_variant("criteo_t15_synthetic")
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


def wide_deep_shape() -> FeatureSpec:
    fs = {f"cat_{i}": {"dtype": "int32", "cardinality": 100_000} for i in range(13)}
    fs.update({f"multi_{i}": {"dtype": "int32", "cardinality": 10_000, "dimensions": [3]}
               for i in range(3)})
    fs.update({f"num_{i}": {"dtype": "float32"} for i in range(13)})
    fs.update(label={"dtype": "int8"}, display={"dtype": "int64"})
    cs = {"onehot_categorical": [f"cat_{i}" for i in range(13)],
          "multihot_categorical": [f"multi_{i}" for i in range(3)],
          "numerical": [f"num_{i}" for i in range(13)], "label": ["label"], "map": ["display"]}
    return FeatureSpec(fs, {"train": [], "test": []}, cs)


def sim_shape() -> FeatureSpec:
    items, categories = {"cardinality": 1_000_000}, {"cardinality": 5_000}
    fs = {"user": {"dtype": "int32", "cardinality": 200_000},
          "item": dict(items, dtype="int32"), "cat": dict(categories, dtype="int32"),
          "label": {"dtype": "int8"}}
    for side in ("pos", "neg"):
        fs[f"{side}_item"] = dict(items, dtype="int32", dimensions=[100])
        fs[f"{side}_cat"] = dict(categories, dtype="int32", dimensions=[100])
    cs = {"user_features": ["user"], "target_item_features": ["item", "cat"],
          "positive_history": ["pos_item", "pos_cat"],
          "negative_history": ["neg_item", "neg_cat"], "label": ["label"]}
    return FeatureSpec(fs, {"train": [], "test": []}, cs)


def random_columns(spec: FeatureSpec, rows: int, rng) -> dict:
    columns = {}
    for name, props in spec.feature_spec.items():
        width = spec.dimension(name)
        if width is not None:
            lengths = rng.integers(width // 2, width + 1, rows)
            flat = rng.integers(0, props["cardinality"], int(lengths.sum()))
            columns[name] = (flat, lengths)
        elif "cardinality" in props:
            columns[name] = rng.integers(0, props["cardinality"], rows)
        elif props["dtype"] == "float32":
            columns[name] = rng.normal(size=rows).astype(np.float32)
        else:
            columns[name] = rng.integers(0, 2, rows)
    return columns


def columnar_results(spec: FeatureSpec, fmt: str, rows: int, data_dir: str, args) -> list:
    """(name, seconds, rows, bytes) of raw, reader and tf.data passes over one dataset."""
    t0 = time.perf_counter()
    columns = random_columns(spec, rows, np.random.default_rng(0))
    out = write_columns(os.path.join(data_dir, fmt), spec,
                        {"train": columns, "test": random_columns(spec, 10,
                                                                  np.random.default_rng(1))},
                        fmt, rows_per_file=max(rows // 8, 1), overwrite=True)
    print(f"generated {rows:,} {fmt} rows in {time.perf_counter() - t0:.1f} s")
    paths = [os.path.join(out.base_directory, f) for f in out.source_spec[MAPPING][0]["files"]]
    size = sum(os.path.getsize(p) for p in paths)
    buffer = bytearray(4 << 20)
    raw_pass(paths, buffer)
    reader = open_reader(out, MAPPING, args.batch_size)
    results = [(f"{fmt}: raw read", best_time(lambda: raw_pass(paths, buffer), args.repeats)[0]),
               (f"{fmt}: ColumnarReader.get",
                best_time(lambda: [reader.get(i) for i in range(len(reader))],
                          max(1, args.repeats // 3))[0])]
    if not args.skip_tfdata:
        from core.pipelines import DictPipeline
        dataset = DictPipeline(reader, label_features=["label"]).epoch(0)
        sum(1 for _ in dataset)
        results.append((f"{fmt}: tf.data DictPipeline",
                        best_time(lambda: sum(1 for _ in dataset), max(1, args.repeats // 3))[0]))
    return [(name, t, rows, size) for name, t in results]


def print_table(title: str, results: list) -> None:
    print(f"\n{title}")
    print(f"{'path':<34} {'time s':>8} {'samples/s':>14} {'MB/s':>9} {'vs raw':>7}")
    raw_time = results[0][1]
    for name, t, rows, size in results:
        print(f"{name:<34} {t:8.3f} {rows / t:14,.0f} {size / t / 1e6:9,.0f} "
              f"{raw_time / t:7.0%}")


def run_columnar(args) -> None:
    data_dir = tempfile.mkdtemp(prefix="columnar_bench-")
    try:
        for title, spec, fmt, rows in [
                ("Wide & Deep-shaped parquet", wide_deep_shape(), "parquet", args.parquet_rows),
                ("SIM-shaped TFRecord", sim_shape(), "tfrecord", args.tfrecord_rows)]:
            results = columnar_results(spec, fmt, rows, data_dir, args)
            print_table(f"{title}: {rows:,} rows, {results[0][3] / rows:.0f} B/row on disk, "
                        f"batch {args.batch_size}", results)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


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
        if not args.skip_columnar:
            run_columnar(args)
        return 0
    finally:
        if own_tmp:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
