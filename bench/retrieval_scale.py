"""The retrieval training step as the catalogue grows: HSTU at retrieval.main's defaults (width
64, 2 blocks, histories of 50, batch 128) under --loss sampled (128 uniform negatives), on
catalogues of 50k, 1M and 5M items.

Two updates of the item table per size, each variant in its own process, interleaved over the
rounds (bench/rates.py):
  rows_<size>:  the table's gradient is the rows the step read, updated lazily (Adam's
                moments of those rows only): retrieval.main --loss sampled today;
  dense_<size>: the same gradient made dense and every row updated (Adam over the whole
                table), as the sampled loss was trained before.
  split_5m:     rows, on 2 processes (horovodrun) with the table split by rows (--sharding
                row): each process holds half the rows and their moments, reads the others'
                from their owner; the same global batch.
Each variant reports steps/s and its processes' peak RSS (the largest). Histories are seeded
random rows of ids uniform over the catalogue, lengths 3 + geometric (mean 20), left-padded.

  .venv/bin/python bench/retrieval_scale.py [--steps 20] [--warmup 3] [--rounds 3]

Writes bench/results/retrieval_scale.txt (not at BENCH_SMOKE=1, whose toy sizes mean nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rates import ROOT, SMOKE, interleaved, run_line, uptime, write_results  # noqa: E402

SIZES = {"50k": 500, "1m": 2000, "5m": 5000} if SMOKE else \
    {"50k": 50_000, "1m": 1_000_000, "5m": 5_000_000}
LENGTH, BATCH, NEGATIVES = (10, 16, 8) if SMOKE else (50, 128, 128)
UPDATES = ("rows", "dense")
SPLIT = f"split_{list(SIZES)[-1]}"  # 2 processes, --sharding row, the largest catalogue
VARIANTS = tuple(f"{u}_{s}" for s in SIZES for u in UPDATES) + (SPLIT,)
RESULTS = os.path.join(ROOT, "bench", "results", "retrieval_scale.txt")


def batches(items: int, count: int = 4, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = np.minimum(3 + rng.geometric(1 / 18, BATCH) - 1, LENGTH + 1)
        ids = rng.integers(1, items + 1, (BATCH, LENGTH + 1))
        ids[np.arange(LENGTH + 1)[None] < (LENGTH + 1 - lengths)[:, None]] = 0
        out.append(ids)
    return out


def measure(variant: str, steps: int, warmup: int) -> dict:
    from core import runtime
    runtime.configure()
    from core.parallel.comm import make_communicator
    from core.parallel.rows import RowShards
    from retrieval.batches import RowBatches
    from retrieval.model import Encoder, RetrievalConfig
    from retrieval.trainer import RetrievalTrainer
    update, size = variant.split("_")
    items = SIZES[size]
    comm = make_communicator()
    shards = RowShards(comm, items + 1) if update == "split" else None
    model = Encoder(RetrievalConfig(model="hstu", items=items, length=LENGTH, dropout=0.2),
                    shards=shards)
    trainer = RetrievalTrainer(model, comm, lambda step: 1e-3, loss="sampled",
                               negatives="uniform", num_negatives=NEGATIVES)
    if update == "dense":
        trainer.row_updated = frozenset()
    data = [RowBatches({"item_ids": ids}, BATCH, comm).batch(np.arange(BATCH))
            for ids in batches(items)]
    for i in range(warmup):
        float(trainer.train_step(data[i % len(data)], i))
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        float(trainer.train_step(data[i % len(data)], i))
    seconds = time.perf_counter() - start
    return {"steps_per_second": steps / seconds,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", choices=VARIANTS, help="internal: run one variant")
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args.variant, args.steps, args.warmup)))
        return 0
    before, lines = uptime(), []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    def run(variant, round_):
        launcher = [] if variant != SPLIT else [
            os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2", "-H",
            "localhost:2", "--gloo"]
        out = subprocess.run([*launcher, sys.executable, os.path.abspath(__file__), "--variant",
                              variant, f"--steps={args.steps}", f"--warmup={args.warmup}"],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"error: {variant} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
        ranks = [json.loads(line[line.index("{"):]) for line in out.stdout.splitlines()
                 if "{" in line]  # horovodrun prefixes each rank's lines with [rank]<stdout>:
        r = {"steps_per_second": min(x["steps_per_second"] for x in ranks),
             "peak_rss_gib": max(x["peak_rss_gib"] for x in ranks)}
        say(f"round {round_}: {variant:9s} {r['steps_per_second']:7.2f} steps/s, peak RSS "
            f"{r['peak_rss_gib']:6.2f} GiB")
        return r
    results = interleaved(VARIANTS, args.rounds, run)
    rate = {v: statistics.median(r[v]["steps_per_second"] for r in results) for v in VARIANTS}
    rss = {v: max(r[v]["peak_rss_gib"] for r in results) for v in VARIANTS}
    say(f"\nmedians over {args.rounds} interleaved round(s); HSTU, batch {BATCH}, L {LENGTH}, "
        f"width 64, {NEGATIVES} uniform negatives")
    say(f"{'items':>10s} {'update':6s} {'steps/s':>8s} {'ms/step':>8s} {'peak RSS GiB':>13s}")
    for size, items in SIZES.items():
        for update in UPDATES + (("split",) if SPLIT.endswith(size) else ()):
            v = f"{update}_{size}"
            say(f"{items:10,d} {update:6s} {rate[v]:8.2f} {1000 / rate[v]:8.1f} {rss[v]:13.2f}")
    first, last = list(SIZES)[0], list(SIZES)[-1]
    for update in UPDATES:
        ratios = [r[f"{update}_{first}"]["steps_per_second"] /
                  r[f"{update}_{last}"]["steps_per_second"] for r in results]
        say(f"step time at {SIZES[last]:,} / at {SIZES[first]:,} items, {update} update "
            f"(within each round): {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}x)")
    say(f"peak RSS per process at {SIZES[last]:,} items, 2 processes split by rows / 1 process "
        f"(rows update): {rss[SPLIT] / rss[f'rows_{last}']:.2f}x")
    say(f"targets: rows update at {SIZES[last]:,} items <= 1.3x the step at {SIZES[first]:,}; "
        f"peak RSS split on 2 processes <= 0.6x one process's")
    if SMOKE:
        print(f"BENCH_SMOKE=1: toy sizes, {os.path.relpath(RESULTS, ROOT)} left as it was")
        return 0
    command = " ".join(["bench/retrieval_scale.py", *(sys.argv[1:] if argv is None else argv)])
    write_results(RESULTS, [run_line(before), f"# command: .venv/bin/python {command}",
                            *lines])
    return 0


if __name__ == "__main__":
    sys.exit(main())
