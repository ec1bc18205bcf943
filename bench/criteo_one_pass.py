"""Real Criteo rows, two routes: the dictionary route (count the values, then write ids) and
the one-pass route (raw values as int64 ids of dynamic tables, no dictionaries); both
preprocessing times and DLRM's test AUC on the same split, over several seeds.

  .venv/bin/python bench/criteo_one_pass.py [--rounds 3] [--seeds 12345,1,2,3]
      [--frequency_threshold 2] [--dynamic_capacity 65536]

Days as in bench/criteo_real_auc.py (about 11k training rows, 2,000 test rows). Three
trainings per seed, same flags: `dictionary`; `one_pass` (every table of --dynamic_capacity
rows, min_count = the threshold); `one_pass_sized` (the one-pass data with each table's
capacity set to the dictionary's cardinality: the same initial scale, since tables start
uniform in +-sqrt(1/rows), which isolates what learning the ids costs from that scale).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from criteo_real_auc import (DEFAULT_DATA, ROOT, add_dlrm_arguments, dlrm,  # noqa: E402
                             make_days)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=DEFAULT_DATA)
    p.add_argument("--workdir", default=None, help="default: a temporary directory, removed")
    p.add_argument("--frequency_threshold", type=int, default=2)
    p.add_argument("--dynamic_capacity", type=int, default=65536)
    p.add_argument("--rounds", type=int, default=3, help="preprocessing timings (interleaved)")
    p.add_argument("--seeds", default="12345,1,2,3")
    add_dlrm_arguments(p)
    return p.parse_args()


def preprocess(raw: str, out: str, threshold: int, capacity: int = 0) -> float:
    """Seconds of preproc/prepare_dataset.py --engine local (capacity > 0: one pass)."""
    command = [sys.executable, os.path.join(ROOT, "preproc", "prepare_dataset.py"),
               "--engine", "local", "--frequency_threshold", str(threshold),
               "--download_dir", raw, "--final_output_dir", out,
               "--spark_output_path", out + "_work", "--conversion_intermediate_dir",
               out + "_work"]
    if capacity:
        command += ["--dynamic_capacity", str(capacity)]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"preprocessing failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def sized_like(one_pass: str, dictionary: str, out: str) -> str:
    """A spec over the one-pass files whose capacities are the dictionary's cardinalities."""
    with open(os.path.join(dictionary, "feature_spec.yaml")) as f:
        cards = {k: v.get("cardinality") for k, v in yaml.safe_load(f)["feature_spec"].items()}
    with open(os.path.join(one_pass, "feature_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    for name, props in spec["feature_spec"].items():
        if "cardinality" in props:
            props["cardinality"] = max(cards[name], 2)  # a row for an id besides the rare row
    for chunks in spec["source_spec"].values():
        for chunk in chunks:
            chunk["files"] = [os.path.join(one_pass, p) for p in chunk["files"]]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)
    return out


def main():
    args = parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="criteo_one_pass.")
    try:
        raw = os.path.join(work, "raw")
        lines = make_days(args.data_dir, raw)
        times = {"dictionary": [], "one_pass": []}
        for _ in range(args.rounds):
            times["dictionary"].append(preprocess(raw, os.path.join(work, "dictionary"),
                                                  args.frequency_threshold))
            times["one_pass"].append(preprocess(raw, os.path.join(work, "one_pass"),
                                                args.frequency_threshold,
                                                args.dynamic_capacity))
        print(f"[bench] preprocessing {lines} lines, medians of {args.rounds} interleaved "
              f"runs (whole process, Python start included): dictionary route "
              f"{statistics.median(times['dictionary']):.2f} s, one pass "
              f"{statistics.median(times['one_pass']):.2f} s")
        datasets = {"dictionary": os.path.join(work, "dictionary"),
                    "one_pass": os.path.join(work, "one_pass"),
                    "one_pass_sized": sized_like(os.path.join(work, "one_pass"),
                                                 os.path.join(work, "dictionary"),
                                                 os.path.join(work, "one_pass_sized"))}
        aucs = {name: [] for name in datasets}
        for seed in (int(s) for s in args.seeds.split(",")):
            args.seed = seed
            for name, path in datasets.items():
                aucs[name].append(dlrm(path, work, args)["test_auc"])
                print(f"[bench] seed {seed} {name:15s} test AUC {aucs[name][-1]:.4f}",
                      flush=True)
        medians = {name: statistics.median(v) for name, v in aucs.items()}
        print("[bench] median test AUC: " + ", ".join(f"{n} {m:.4f}" for n, m in medians.items()))
        for name in ("one_pass", "one_pass_sized"):
            print(f"[bench] {name} - dictionary: {medians[name] - medians['dictionary']:+.4f}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
