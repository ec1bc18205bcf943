"""Serving one history at a time: the exported SavedModel's exact brute force over the whole
catalogue (`serving_default`, top k) against its `encode` query searched in the export's
approximate index (`--mode export --index faiss`, retrieval.serve's path), on the same
requests: the first --requests validation histories of --dataset_dir, batch 1, after a
warm-up, in alternating blocks of BLOCK requests per path (the order swapped each block): a
server runs one path, and request-by-request alternation would have the brute force's pass
over the catalogue evict the index's data from the caches before every index request. Prints each path's median and 90th-percentile latency,
their ratio, the index's recall@k from export and the overlap of the two top k on these
requests.

  .venv/bin/python bench/retrieval_serving.py --model_dir OUT --dataset_dir DATA
      [--requests 200] [--top_k 100]

Writes bench/results/retrieval_serving.txt (not at BENCH_SMOKE=1).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rates import ROOT, SMOKE, run_line, uptime, write_results  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "retrieval_serving.txt")
BLOCK = 20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True, help="retrieval.main's output dir, exported "
                   "with --index faiss")
    p.add_argument("--dataset_dir", required=True, help="its dataset (validation histories)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--top_k", type=int, default=100)
    args = p.parse_args(argv)
    before = uptime()
    sys.path.insert(0, ROOT)
    import tensorflow as tf
    from retrieval import data, index
    from retrieval.serve import Server
    server = Server(args.model_dir, args.top_k)
    if server.index is None:
        sys.exit(f"error: {args.model_dir} has no index: export it with --index faiss")
    histories = data.read_sequences(data.load(args.dataset_dir), "validation")["item_ids"]
    requests = [tf.constant(h[None, :-1]) for h in histories[:args.requests]]
    brute = server.model.signatures["serving_default"]
    k = min(args.top_k, int(brute.structured_outputs["top_k_ids"].shape[1]))

    def exact(ids):
        return brute(item_ids=ids)["top_k_ids"].numpy()[0, :k]

    server.k = k

    def approximate(ids):
        return server.top_k(ids.numpy())[0]
    for ids in requests[:10]:
        exact(ids), approximate(ids)
    paths, seconds, found = {"exact": exact, "index": approximate}, {}, {}
    for first in range(0, len(requests), BLOCK):
        order = list(paths) if first // BLOCK % 2 == 0 else list(paths)[::-1]
        for name in order:
            for i in range(first, min(first + BLOCK, len(requests))):
                start = time.perf_counter()
                found[name, i] = paths[name](requests[i])
                seconds.setdefault(name, []).append(time.perf_counter() - start)
    overlap = [np.intersect1d(found["exact", i], found["index", i]).size / k
               for i in range(len(requests))]
    meta = server.index[1]
    lines = [f"# command: .venv/bin/python bench/retrieval_serving.py "
             + " ".join(sys.argv[1:] if argv is None else argv),
             f"catalogue {meta['items']:,} items; {len(requests)} requests of one history, top "
             f"{k}; index: {index.summary(meta)}"]
    for name, values in seconds.items():
        ms = 1000 * np.array(values)
        lines.append(f"{name:5s}: median {np.median(ms):8.2f} ms, p90 "
                     f"{np.percentile(ms, 90):8.2f} ms per request")
    ratio = np.median(seconds["exact"]) / np.median(seconds["index"])
    lines.append(f"brute force / index (medians): {ratio:.1f}x; overlap of the two top {k} on "
                 f"these requests: {np.mean(overlap):.3f}")
    lines.append("target: recall@100 >= 0.95 at 1M items, the index >= 10x faster at batch 1")
    print("\n".join(lines))
    if SMOKE:
        print(f"BENCH_SMOKE=1: {os.path.relpath(RESULTS, ROOT)} left as it was")
        return 0
    write_results(RESULTS, [run_line(before), *lines])
    return 0


if __name__ == "__main__":
    sys.exit(main())
