"""Serving latency of the two-stage SavedModel (recommend.main --mode export: retrieval's top
100 of the catalogue reranked by the HSTU ranker, one graph) beside retrieval's alone
(retrieval.main --mode export), at batch 1 and 64, on Amazon Beauty's shape: 12,101 items,
histories of 50, width 64, 2 blocks of each model. Weights are the models' seeded initial
ones (latency does not depend on their values).

Both SavedModels are written to a temporary directory and loaded in this process; each round
times every (model, batch) --requests times after a warm-up, the order rotating each round
(bench/rates.py); a request's time includes its result's copy to the host. Printed: p50 and
p99 per (model, batch) over all rounds' requests, and two-stage / retrieval at p50. Writes
bench/results/recommend_latency.txt (not at BENCH_SMOKE=1, whose toy figures mean nothing).

  .venv/bin/python bench/recommend_latency.py [--requests 200] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rates import (ROOT, SMOKE, interleaved, run_line, uptime,  # noqa: E402
                   write_results)

sys.path.insert(0, ROOT)
ITEMS, LENGTH, WIDTH, CANDIDATES = (300, 10, 16, 20) if SMOKE else (12101, 50, 64, 100)
BATCHES = (1, 64)
MODELS = ("retrieval", "two_stage")
RESULTS = os.path.join(ROOT, "bench", "results", "recommend_latency.txt")


def exported(directory: str) -> dict:
    """{model: serving function} of both SavedModels, written under directory."""
    import tensorflow as tf
    from recommend import export as two_stage
    from recommend.ranker import Ranker, RankerConfig
    from retrieval import export as retrieval_export
    from retrieval.model import Encoder, RetrievalConfig
    encoder = Encoder(RetrievalConfig(items=ITEMS, length=LENGTH, width=WIDTH, normalize=True,
                                      temperature=0.05))
    ranker = Ranker(RankerConfig(items=ITEMS, length=LENGTH, width=WIDTH),
                    encoder.items.numpy())
    paths = {m: os.path.join(directory, m) for m in MODELS}
    retrieval_export.export(encoder, paths["retrieval"], 10)
    two_stage.export(encoder, ranker, paths["two_stage"], CANDIDATES, 10)
    return {m: tf.saved_model.load(p).signatures["serving_default"] for m, p in paths.items()}


def requests(batch: int, count: int = 8) -> list:
    """Histories with Beauty's lengths (median 6), right-padded, as a client sends them."""
    import tensorflow as tf
    rng = np.random.default_rng(batch)
    out = []
    for _ in range(count):
        lengths = np.clip(2 + rng.geometric(0.2, batch), 1, LENGTH)
        ids = rng.integers(1, ITEMS + 1, (batch, LENGTH))
        ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
        out.append(tf.constant(ids, tf.int64))
    return out


def timed(serve, batches: list, count: int, warmup: int = 5) -> list:
    """Seconds per request, cycling the batches."""
    for i in range(warmup):
        serve(item_ids=batches[i % len(batches)])["top_k_ids"].numpy()
    seconds = []
    for i in range(count):
        start = time.perf_counter()
        serve(item_ids=batches[i % len(batches)])["top_k_ids"].numpy()
        seconds.append(time.perf_counter() - start)
    return seconds


def table(runs: list) -> list:
    lines = [f"{'model':<10} {'batch':>5} {'p50 ms':>8} {'p99 ms':>8}"]
    for batch in BATCHES:
        p50 = {}
        for model in MODELS:
            ms = 1e3 * np.concatenate([r[f"{model}@{batch}"] for r in runs])
            p50[model] = np.percentile(ms, 50)
            lines.append(f"{model:<10} {batch:>5} {p50[model]:8.2f} "
                         f"{np.percentile(ms, 99):8.2f}")
        lines.append(f"batch {batch}: two_stage / retrieval at p50 = "
                     f"{p50['two_stage'] / p50['retrieval']:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="timed requests per "
                        "(model, batch) per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uptime_before = uptime()
    with tempfile.TemporaryDirectory() as directory:
        serving = exported(directory)
        loads = {b: requests(b) for b in BATCHES}
        variants = [f"{m}@{b}" for b in BATCHES for m in MODELS]
        runs = interleaved(variants, args.rounds, lambda v, _: timed(
            serving[v.split("@")[0]], loads[int(v.split("@")[1])], args.requests))
    lines = table(runs)
    print("\n".join(lines))
    if SMOKE:
        return
    header = [f"# bench/recommend_latency.py --requests {args.requests} --rounds {args.rounds}",
              run_line(uptime_before),
              f"# {ITEMS:,} items, histories of {LENGTH}, width {WIDTH}; two-stage: top "
              f"{CANDIDATES} retrieved, reranked by the HSTU ranker; p50/p99 over "
              f"{args.rounds} x {args.requests} requests per row"]
    write_results(RESULTS, header + lines)


if __name__ == "__main__":
    main()
