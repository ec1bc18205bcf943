"""Bounded admission (issue 43): memory and checkpoints of dynamic tables with min_count > 1
on a stream of one-off ids, and the admissions the pending ring delays.

1. churn: DLRM (main.py) with every table dynamic, --dynamic_min_count 2, on split-binary
   data whose ids are random int64 values (all one-off); each run in its own process, --steps
   and 4x --steps: peak RSS (os.wait4) and each dynamic_<t>.npz of the final checkpoint.
   --repo DIR runs another checkout's main.py on the same data (e.g. one from before the
   ring, whose pending counts grew with every id).
2. admission: one DynamicTable against counts kept for every id: --popular ids, each in a
   batch with its own rate (2**-U(0, 5): once a batch to once in 32), among --noise one-off
   ids a batch; a popular id is admitted by the unbounded counts at its min_count-th
   occurrence. Early (must be 0), late and never admitted ids; lookups lost: occurrences
   read from the rare row that unbounded counts would have given a row.

  .venv/bin/python bench/dynamic_admission_memory.py [--steps 300] [--capacity 2000]
      [--tables 8] [--batch_size 1024] [--admission_steps 2000] [--repo DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NUM = 4  # numerical features
TEST_ROWS = 8192


def write_churn(path: str, args, steps: int) -> None:
    """Train rows for `steps` batches and a small test set, every id a fresh int64."""
    from core.feature_spec import FeatureSpec
    from datasets import SplitBinaryWriter
    rng = np.random.default_rng(0)
    spec = FeatureSpec.get_default(NUM, [args.capacity] * args.tables, label_dtype="bool")
    for name in spec.categorical_features:
        spec.feature_spec[name]["dtype"] = "int64"
    with SplitBinaryWriter(path, spec.with_dynamic(["all"])) as writer:
        for mapping, rows in (("train", steps * args.batch_size), ("test", TEST_ROWS)):
            writer.write(mapping, rng.standard_normal((rows, NUM)).astype(np.float16),
                         [rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
                          for _ in range(args.tables)], rng.random(rows) < 0.3)


def churn_run(repo: str, data: str, out: str, steps: int, args) -> tuple:
    """(peak RSS in bytes, sizes of dynamic_<t>.npz) of one training process."""
    ckpt = os.path.join(out, f"ckpt_{steps}")
    cmd = [sys.executable, "main.py", "--dataset_path", data, "--cpu", "--max_steps",
           str(steps), "--batch_size", str(args.batch_size), "--valid_batch_size", "4096",
           "--embedding_dim", "16", "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "32,1",
           "--dynamic_features", "all", "--dynamic_min_count", "2", "--print_freq",
           str(steps), "--benchmark_warmup_steps", "0", "--save_checkpoint_path", ckpt,
           "--log_path", os.path.join(out, f"log_{steps}.json")]
    with open(os.path.join(out, f"out_{steps}.txt"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the bench's
    if os.waitstatus_to_exitcode(status) != 0:
        last = (open(log.name).read().strip().splitlines() or ["no output"])[-1]
        sys.exit(f"error: {repo}: main.py failed after {steps} steps at most: {last}")
    sizes = [os.path.getsize(os.path.join(ckpt, f"dynamic_{t}.npz")) for t in range(args.tables)]
    return usage.ru_maxrss * 1024, sizes


def churn(args) -> None:
    repo = os.path.abspath(args.repo or ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        write_churn(data, args, 4 * args.steps)
        print(f"churn: {repo} main.py, {args.tables} tables of {args.capacity:,d} rows, batch "
              f"{args.batch_size:,d} of one-off int64 ids, --dynamic_min_count 2")
        runs = {steps: churn_run(repo, data, tmp, steps, args)
                for steps in (args.steps, 4 * args.steps)}
    for steps, (rss, sizes) in runs.items():
        print(f"  {steps:6,d} steps: peak RSS {rss / 2**20:8.1f} MB, dynamic_<t>.npz "
              f"{np.mean(sizes) / 2**10:9.1f} KB each")
    (rss1, sizes1), (rss4, sizes4) = runs[args.steps], runs[4 * args.steps]
    print(f"  4x / 1x steps: peak RSS {rss4 / rss1:.3f}x, dynamic_<t>.npz "
          f"{np.mean(sizes4) / np.mean(sizes1):.3f}x")


def batches(rng, popular: np.ndarray, rates: np.ndarray, noise: int, steps: int):
    """(batch, which popular ids it holds) of every step: popular ids by their rates among
    `noise` ids never seen before."""
    for step in range(steps):
        present = rng.random(len(popular)) < rates
        fresh = -(np.arange(noise, dtype=np.int64) + step * noise) - 1
        yield rng.permutation(np.concatenate([popular[present], fresh])), present


def admission(args, min_count: int) -> None:
    import tensorflow as tf
    from core.dynamic import DynamicTable
    from core.feature_spec import DynamicSpec
    rng = np.random.default_rng(min_count)
    popular = (np.arange(args.popular, dtype=np.int64) + 1) * 7919
    rates = 2.0 ** -rng.uniform(0, 5, args.popular)
    table = DynamicTable(args.capacity, DynamicSpec(min_count))
    train = tf.function(table.train_lookup, input_signature=[tf.TensorSpec([None], tf.int64)])
    seen = np.zeros(args.popular, np.int64)
    exact, ring = np.full(args.popular, -1), np.full(args.popular, -1)
    lost = occurrences = 0
    for step, (batch, present) in enumerate(batches(rng, popular, rates, args.noise,
                                                    args.admission_steps)):
        train(tf.constant(batch))
        seen += present
        exact[(exact < 0) & (seen >= min_count)] = step
        held = table.lookup(tf.constant(popular)).numpy() != 0
        ring[(ring < 0) & held] = step
        owed = present & (exact >= 0)  # unbounded counts would give these a row
        occurrences += int(owed.sum())
        lost += int((owed & ~held).sum())
    admitted = exact >= 0
    noise_admitted = int(table.admissions.numpy()) - int((ring >= 0).sum())  # one-off ids
    early = int((admitted & (ring >= 0) & (ring < exact)).sum()
                + ((~admitted) & (ring >= 0)).sum()) + noise_admitted
    late = int((admitted & ((ring > exact) | (ring < 0))).sum())
    never = int((admitted & (ring < 0)).sum())
    n = int(admitted.sum())
    distinct = args.noise * args.admission_steps + args.popular
    print(f"  min_count {min_count}: {distinct:,d} distinct ids; of {n:,d} ids unbounded "
          f"counts admit: early {early} ({100 * early / max(n, 1):.1f} %), late {late} "
          f"({100 * late / max(n, 1):.1f} %, never {never}); lookups lost "
          f"{100 * lost / max(occurrences, 1):.1f} %; pending ring "
          f"{table.pending_slots:,d} slots, state {table.pending_slots * 16 / 2**10:.0f} KB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="churn: the 1x run's steps")
    p.add_argument("--capacity", type=int, default=2000, help="rows of each table")
    p.add_argument("--tables", type=int, default=8, help="churn: dynamic tables")
    p.add_argument("--batch_size", type=int, default=1024, help="churn: rows a step")
    p.add_argument("--admission_steps", type=int, default=2000, help="admission: batches")
    p.add_argument("--popular", type=int, default=None,
                   help="admission: recurring ids (default capacity / 2: no row is evicted)")
    p.add_argument("--noise", type=int, default=None,
                   help="admission: one-off ids a batch (default capacity / 2: the default "
                        "ring holds 8 batches of them)")
    p.add_argument("--repo", default=None, help="churn: the checkout whose main.py runs")
    args = p.parse_args(argv)
    args.popular = args.popular or args.capacity // 2
    args.noise = args.noise or args.capacity // 2
    churn(args)
    from core import runtime
    runtime.configure()
    print(f"admission: capacity {args.capacity:,d}, {args.popular:,d} recurring ids, "
          f"{args.noise:,d} one-off ids a batch, {args.admission_steps:,d} batches, "
          f"pending_per_row default")
    for min_count in (2, 3):
        admission(args, min_count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
