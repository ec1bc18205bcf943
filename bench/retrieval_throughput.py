"""Training steps/s of this toolkit's SASRec and HSTU (RetrievalTrainer over Encoder: the
cross-entropy over all items of each real (history, next item) pair) against a naive Keras
twin of each, on Amazon Beauty's shape: 12,101 items, histories of 50, width 64, 2 blocks,
1 head, batch 128, dropout 0.2, Adam.

The twins are what a user writes first: keras.layers.Embedding for items and positions,
keras.layers.MultiHeadAttention blocks under a causal mask (SASRec) or a Keras layer doing
HSTU's equations (retrieval/model.py) the plain way, Keras Adam, and the logits over the
whole catalogue at every one of the batch's [b, L] positions, the loss masked to the real
pairs. Beauty's histories are short (median ~6 of 51 positions), so most of those logits
are of padding: ours scores the real pairs only.

The same step at another commit (--baseline, default 5373d81: the step before the tiled
softmax) runs in each round beside ours, in a git worktree of that commit with its own
kernels built (bench/compare_commits.py's checkout), and so does a full evaluation of
Beauty's 22,363 users (HSTU, both commits: ours ranks under both protocols in its one pass,
the baseline ranks over every item only).

Rows are seeded random histories whose real lengths follow Beauty's (2 + geometric(0.2),
clipped to 3..51: median 6, mean 7), ids uniform in 1..12,101, left-padded with 0. Each
variant runs in its own process; the order rotates each round (bench/rates.py), each round
also measures the float32 matmul peak; the driver prints medians, ours / twin within each
round, each step as a fraction of the peak, and writes bench/results/retrieval_throughput.txt
(not at BENCH_SMOKE=1, whose toy figures mean nothing).

  .venv/bin/python bench/retrieval_throughput.py [--steps 20] [--warmup 3] [--rounds 3]
      [--baseline 5373d81]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rates import (PEAK, PEAK_SIZE, ROOT, SMOKE, cpu_name, interleaved,  # noqa: E402
                   medians)

ITEMS, LENGTH, WIDTH, BLOCKS, HEADS = (300, 10, 16, 2, 1) if SMOKE else (12101, 50, 64, 2, 1)
DROPOUT, LR = 0.2, 1e-3
USERS, EVAL_BATCH = (50, 16) if SMOKE else (22363, 1024)  # Beauty's users; main.py's default
MODELS = ("sasrec", "hstu")
KINDS = ("ours", "keras", "base")  # base: ours at --baseline
VARIANTS = tuple(f"{kind}_{m}" for m in MODELS for kind in KINDS) + ("eval_ours", "eval_base")
RESULTS = os.path.join(ROOT, "bench", "results", "retrieval_throughput.txt")
FLOP_NOTE = ("FLOP counted on the useful work, x2 per multiply-add, x3 for forward + backward: "
             "the logits of the real pairs (pairs x items x width) and, per block, the "
             "projections of the real positions (SASRec q, k, v, o, 2 feed-forward: 6 width^2; "
             "HSTU uvqk, o: 5 width^2) and attention QK^T and AV over each real query's real "
             "keys (2 x width each); padding counted nowhere")


def batches(batch_size: int, count: int = 4, seed: int = 0) -> list:
    """int64 [b, L + 1] rows, the same in every process."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = np.clip(2 + rng.geometric(0.2, batch_size), 3, LENGTH + 1)
        ids = rng.integers(1, ITEMS + 1, (batch_size, LENGTH + 1))
        ids[np.arange(LENGTH + 1)[None] < (LENGTH + 1 - lengths)[:, None]] = 0  # left padding
        out.append(ids)
    return out


def flop_per_step(model: str, rows: list) -> float:
    """Mean over the batches of FLOP_NOTE's count."""
    projections = (6 if model == "sasrec" else 5) * WIDTH ** 2
    flops = []
    for ids in rows:
        pairs = (ids[:, :-1] > 0).sum(1)  # a left-padded row's every real position has a next
        keys = (pairs * (pairs + 1) // 2).sum()  # causal: query i sees keys 1..i
        mac = pairs.sum() * ITEMS * WIDTH + BLOCKS * (pairs.sum() * projections
                                                      + keys * 2 * WIDTH)
        flops.append(6 * mac)
    return float(np.mean(flops))


def ours(model: str, data: list):
    from core.parallel.comm import make_communicator
    from retrieval.batches import RowBatches
    from retrieval.model import Encoder, RetrievalConfig
    from retrieval.trainer import RetrievalTrainer
    config = RetrievalConfig(model=model, items=ITEMS, length=LENGTH, width=WIDTH,
                             blocks=BLOCKS, heads=HEADS, dropout=DROPOUT)
    comm = make_communicator()
    trainer = RetrievalTrainer(Encoder(config), comm, lambda step: LR)
    # the family's own step batches (whatever rides along with the ids)
    steps = [RowBatches({"item_ids": ids}, len(ids), comm).batch(np.arange(len(ids)))
             for ids in data]
    return lambda i: float(trainer.train_step(steps[i % len(steps)], i))


def evaluation(model: str):
    """A function timing one full evaluation of USERS histories (RetrievalTrainer.evaluate,
    the first call traced beforehand), in seconds."""
    from core.parallel.comm import make_communicator
    from retrieval.batches import RowBatches
    from retrieval.model import Encoder, RetrievalConfig
    from retrieval.trainer import RetrievalTrainer
    config = RetrievalConfig(model=model, items=ITEMS, length=LENGTH, width=WIDTH,
                             blocks=BLOCKS, heads=HEADS, dropout=DROPOUT)
    comm = make_communicator()
    trainer = RetrievalTrainer(Encoder(config), comm, lambda step: LR)
    rows = RowBatches({"item_ids": batches(USERS, 1, seed=1)[0]}, EVAL_BATCH, comm)
    trainer.evaluate(rows.epoch())

    def timed():
        start = time.perf_counter()
        trainer.evaluate(rows.epoch())
        return time.perf_counter() - start
    return timed


def keras_twin(model: str, data: list):
    import keras
    import tensorflow as tf

    def norm(**kw):
        return keras.layers.LayerNormalization(epsilon=1e-6, **kw)

    class SASRecBlock(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.norm_1, self.norm_2 = norm(), norm()
            self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)
            self.ffn_in = keras.layers.Dense(WIDTH, activation="relu")
            self.ffn_out = keras.layers.Dense(WIDTH)
            self.drop = keras.layers.Dropout(DROPOUT)

        def call(self, x, mask, training=False):
            h = self.norm_1(x)
            x = x + self.drop(self.attention(h, h, attention_mask=mask), training=training)
            h = self.drop(self.ffn_in(self.norm_2(x)), training=training)
            return x + self.drop(self.ffn_out(h), training=training)

    class HSTUBlock(keras.layers.Layer):
        """retrieval/model.py's equations, one head (the benchmark's shape)."""

        def __init__(self):
            super().__init__()
            self.norm, self.attended_norm = norm(center=False, scale=False), \
                norm(center=False, scale=False)
            self.uvqk = keras.layers.Dense(4 * WIDTH, activation="silu")
            self.out = keras.layers.Dense(WIDTH)
            self.drop = keras.layers.Dropout(DROPOUT)
            self.position_bias = self.add_weight(shape=(2 * LENGTH - 1,), initializer="zeros")

        def call(self, x, mask, training=False):
            u, v, q, k = tf.split(self.uvqk(self.norm(x)), 4, axis=-1)
            relative = tf.range(LENGTH)[None, :] - tf.range(LENGTH)[:, None] + LENGTH - 1
            scores = tf.matmul(q, k, transpose_b=True) + tf.gather(self.position_bias, relative)
            a = tf.nn.silu(scores) / LENGTH * tf.cast(mask, x.dtype)
            return x + self.out(self.drop(u * self.attended_norm(a @ v), training=training))

    class Twin(keras.Model):
        def __init__(self):
            super().__init__()
            self.items = keras.layers.Embedding(ITEMS + 1, WIDTH)
            self.positions = keras.layers.Embedding(LENGTH, WIDTH)
            self.drop = keras.layers.Dropout(DROPOUT)
            self.stack = [SASRecBlock() if model == "sasrec" else HSTUBlock()
                          for _ in range(BLOCKS)]
            self.final_norm = norm()

        def call(self, ids, training=False):
            causal = tf.linalg.band_part(tf.ones([LENGTH, LENGTH], tf.bool), -1, 0)
            mask = causal[None] & (ids > 0)[:, None, :]  # [b, query, key]
            x = self.items(ids) * WIDTH ** 0.5 + self.positions(tf.range(LENGTH))
            x = self.drop(x, training=training)
            for block in self.stack:
                x = block(x, mask, training=training)
            return self.final_norm(x)

    twin, optimizer, batch_size = Twin(), keras.optimizers.Adam(LR), len(data[0])
    twin(tf.zeros([1, LENGTH], tf.int64))  # build the variables outside the tf.function

    @tf.function
    def step(ids):
        history, following = ids[:, :-1], ids[:, 1:]
        with tf.GradientTape() as tape:
            vectors = twin(history, training=True)
            logits = tf.matmul(vectors, twin.items.embeddings[1:], transpose_b=True)  # [b,L,N]
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
                tf.maximum(following - 1, 0), logits)
            real = tf.cast((history > 0) & (following > 0), tf.float32)
            loss = tf.reduce_sum(loss * real) / batch_size
        grads = tape.gradient(loss, twin.trainable_variables)
        optimizer.apply_gradients(zip(grads, twin.trainable_variables))
        return loss

    steps = [tf.constant(ids) for ids in data]
    return lambda i: float(step(steps[i % len(steps)]))


def measure(variant: str, batch_size: int, steps: int, warmup: int, tree: str) -> dict:
    """tree: the checkout whose toolkit runs (a base_ or eval_base variant's: --baseline's)."""
    sys.path.insert(0, tree)
    from core import runtime
    runtime.import_tensorflow()  # the toolkit's settings, the same for both; a faster import
    import tensorflow as tf
    kind, model = variant.split("_")
    if kind == "eval":
        timed = evaluation("hstu")
        seconds = min(timed() for _ in range(2))
        return {"variant": variant, "seconds": seconds, "users_per_second": USERS / seconds,
                "tensorflow": tf.__version__}
    step = (keras_twin if kind == "keras" else ours)(model, batches(batch_size))
    for i in range(warmup):
        step(i)
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    rate = steps / (time.perf_counter() - start)
    return {"variant": variant, "steps_per_second": rate,
            "histories_per_second": rate * batch_size, "tensorflow": tf.__version__}


def machine() -> str:
    return f"{cpu_name()}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of every variant, interleaved so that load drifts hit all")
    p.add_argument("--baseline", default="5373d81",
                   help="the commit whose step and evaluation run beside ours")
    p.add_argument("--workdir", default="/tmp/compare_commits",
                   help="where the baseline's worktree is made (kept for reuse)")
    p.add_argument("--variant", choices=VARIANTS, help="internal: run one variant")
    p.add_argument("--tree", default=ROOT, help="internal: the checkout the variant runs")
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args.variant, args.batch_size, args.steps, args.warmup,
                                 args.tree)))
        return 0
    from compare_commits import checkout
    # a toy run compares the tree with itself (no checkout, no build)
    base_tree = ROOT if SMOKE else checkout(args.baseline, args.workdir, sys.executable)

    load_before = open("/proc/loadavg").read().split()[:3]
    lines = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    def run(variant, round_):
        tree = base_tree if variant.startswith(("base", "eval_base")) else ROOT
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--variant", variant,
                              "--tree", tree]
                             + [f"--{k}={getattr(args, k)}" for k in
                                ("batch_size", "steps", "warmup")],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"error: {variant} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if "seconds" in r:
            say(f"round {round_}: {variant:12s} {r['seconds']:8.2f} s per evaluation "
                f"{r['users_per_second']:9,.0f} users/s")
        else:
            say(f"round {round_}: {variant:12s} {r['steps_per_second']:8.2f} steps/s "
                f"{r['histories_per_second']:9,.0f} histories/s")
        return r
    results = interleaved(VARIANTS, args.rounds, run, peak=True)
    lines.extend(f"round {i}: matmul peak float32 {r[PEAK]['float32']:,.0f} GFLOP/s"
                 for i, r in enumerate(results))  # rates.py printed them, unrecorded
    steps = medians(results, lambda r: r.get("steps_per_second", 0.0))
    # load only slows a run: the best round (step and peak alike) is the nearest to the
    # machine alone (bench/rates.py's convention)
    peak = max(r[PEAK]["float32"] for r in results)
    data = batches(args.batch_size)
    pairs = np.mean([(ids[:, :-1] > 0).sum() for ids in data])
    say(f"\nmedians over {args.rounds} interleaved round(s); batch {args.batch_size} of "
        f"{ITEMS:,} items, L {LENGTH}, width {WIDTH}, {BLOCKS} blocks, {HEADS} head(s), "
        f"{pairs:.0f} real pairs per batch ({pairs / args.batch_size:.1f} per history)")
    say(f"{'model':7s} {'variant':7s} {'steps/s':>8s} {'histories/s':>12s} "
        f"{'ours/twin (range)':>20s} {'GFLOP/step':>11s} {'best: % of fp32 peak':>21s}")
    def spread(a, b, figure) -> str:
        """a / b within each round: median (range)."""
        ratios = [figure(r[a]) / figure(r[b]) for r in results]
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
    rate = lambda r: r["steps_per_second"]  # noqa: E731
    names = {"ours": "ours", "keras": "twin", "base": args.baseline[:7]}
    for model in MODELS:
        flop = flop_per_step(model, data)
        for kind in KINDS:
            v = f"{kind}_{model}"
            best = max(r[v]["steps_per_second"] for r in results)
            ratio = spread(v, f"keras_{model}", rate) if kind == "ours" else ""
            say(f"{model:7s} {names[kind]:7s} {steps[v]:8.2f} "
                f"{steps[v] * args.batch_size:12,.0f} {ratio:>20s} {flop / 1e9:11.2f} "
                f"{100 * best * flop / 1e9 / peak:20.1f}%")
    for model in MODELS:
        say(f"training step, ours / {args.baseline} (same flags, within each round): "
            f"{model} {spread(f'ours_{model}', f'base_{model}', rate)}")
    seconds = {v: statistics.median(r[v]["seconds"] for r in results)
               for v in ("eval_ours", "eval_base")}
    say(f"evaluation of {USERS:,} users (HSTU, batches of {EVAL_BATCH}), median s: ours "
        f"{seconds['eval_ours']:.2f} (both protocols), {args.baseline} "
        f"{seconds['eval_base']:.2f} (every item only); {args.baseline} / ours "
        f"{spread('eval_base', 'eval_ours', lambda r: r['seconds'])}")
    say(f"targets: ours / twin >= 1.5x; ours / {args.baseline} >= 2.5x (training), >= 2x "
        f"(evaluation); ours >= 40% of the peak. float32 matmul peak ({PEAK_SIZE}^2 chain, "
        f"its own process, best of {args.rounds} rounds): {peak:,.0f} GFLOP/s")
    say(f"{FLOP_NOTE}.")
    if SMOKE:
        print(f"BENCH_SMOKE=1: toy sizes, {os.path.relpath(RESULTS, ROOT)} left as it was")
        return 0
    load_after = open("/proc/loadavg").read().split()[:3]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "retrieval"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    command = " ".join([os.path.relpath(sys.executable, ROOT), "bench/retrieval_throughput.py",
                        *(sys.argv[1:] if argv is None else argv)])
    now = datetime.datetime.now(datetime.timezone.utc)
    header = [
        f"# bench/retrieval_throughput.py, {now:%Y-%m-%d %H:%M} UTC: {machine()}, "
        f"TensorFlow {results[0]['ours_sasrec']['tensorflow']}",
        f"# command: {command}   (commit {commit}"
        f"{', retrieval/ with uncommitted changes' if dirty else ''})",
        f"# {args.steps} timed steps after {args.warmup} warm-up steps, each variant in its "
        f"own process; load average before {' '.join(load_before)}, after "
        f"{' '.join(load_after)}" + (" (the machine was SHARED with other work: single "
                                     "figures move between rounds; read the within-round "
                                     "ratios)" if float(load_before[0]) > 1 else ""),
    ]
    with open(RESULTS, "w") as f:
        f.write("\n".join(header + lines) + "\n")
    print(f"written: {os.path.relpath(RESULTS, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
