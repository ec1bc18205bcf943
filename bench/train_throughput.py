"""Training-step throughput on CPU: this project's DLRM vs a naive Keras DLRM, same run.

Shape: 26 tables x 100k rows x 128, bottom 13-512-256-128, top 480-1024-1024-512-256-1, SGD.
The naive baseline uses keras.layers.Embedding, keras Dense layers and a tf.function step
with keras' SGD optimizer, under TensorFlow's default settings; `naive_keras_onednn` is the
same model with oneDNN forced on, to show how much of the gain is that setting alone, and
`naive_keras_bf16` the same model under Keras' `mixed_bfloat16` policy (what a user who just
sets it gets). `ours_amp_bf16` is `--amp` forced to bfloat16 (DLRM_CPU_AMP=bfloat16) whatever
the CPU. Each run also measures the machine's matmul peak (bench/rates.py: a chain of 4096^2
matmuls in float32 and bfloat16, its own process) and prints every variant's step as a fraction of the peak at its
dtype (FLOP per sample from the shape, forward + backward).
`--worker ours_inference` (a worker only, not in the table below) times `ours`'s forward pass
(the trainer's predict, what evaluation and serving run) on the same batches: the DLRM
inference figure of bench/compare_commits.py.
`ours_dynamic` is `ours` with every table dynamic (open vocabulary, capacity 100k rows, ids
as scattered 64-bit values): its ratio to `ours` is what learning the ids costs; the run then
also measures the id -> row map's memory per entry.
Every variant runs in its own process (its own TensorFlow settings, no shared memory) on
the same pre-generated synthetic batches, so the input pipeline is not measured.

  .venv/bin/python bench/train_throughput.py [--batch_sizes 2048,16384] [--steps 20] [--rounds 3]
  .venv/bin/python bench/train_throughput.py --profile --variants ours --steps 5
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from rates import SMOKE, dtype_of, measure_peaks, peak_fraction, peak_header  # noqa: E402
VARIANTS = ("ours", "ours_xla", "ours_amp_bf16", "naive_keras", "naive_keras_onednn",
            "naive_keras_bf16", "ours_dynamic")


def configure_environment(variant: str) -> None:
    """Settings for the worker process, before TensorFlow is imported."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if variant.startswith("ours"):
        from core import runtime
        runtime.configure()  # what main.py runs with
        if variant == "ours_amp_bf16":
            os.environ[runtime.CPU_AMP_VARIABLE] = "bfloat16"
    elif variant == "naive_keras_onednn":
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    else:
        os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)  # TensorFlow's own default


NUM_TABLES, ROWS, DIM, NUM_NUMERICAL = 26, 1_000 if SMOKE else 100_000, 8 if SMOKE else 128, 13
HASH = -7046029254386353131  # an odd 64-bit multiplier: distinct ids stay distinct
BOTTOM, TOP = ((16, DIM), (16, 1)) if SMOKE else ((512, 256, 128), (1024, 1024, 512, 256, 1))


def flop_per_sample() -> float:
    """Multiply-adds of the MLPs and the interaction (its batched Gram matrix), x2 for FLOP,
    x3 for forward + backward (two matmuls per matmul in the backward)."""
    widths = [16, *BOTTOM]  # 13 numerical features padded to 16
    top_in = DIM + NUM_TABLES * (NUM_TABLES + 1) // 2 + 1  # 480, padded as the model does
    macs = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    macs += sum(a * b for a, b in zip([top_in, *TOP[:-1]], TOP))
    macs += (NUM_TABLES + 1) ** 2 * DIM
    return 3 * 2 * macs


def batches(batch_size: int, count: int, hashed_ids: bool = False):
    """Synthetic batches; hashed_ids: ids as scattered int64 values (for dynamic tables)."""
    import numpy as np
    import tensorflow as tf
    from datasets import SyntheticSource
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default(NUM_NUMERICAL, [ROWS] * NUM_TABLES)
    source = SyntheticSource(spec, batch_size, count, seed=1, signal_strength=1.0)
    out = []
    for i in range(count):
        numerical, categorical, label = source.get(i)
        out.append((tf.constant(numerical.astype(np.float32)),
                    tuple(tf.constant(c.astype(np.int64) * HASH if hashed_ids else
                                      c.astype(np.int32)) for c in categorical),
                    tf.constant(label.astype(np.float32)), tf.constant(batch_size, tf.int32)))
    return out


def ours(xla: bool, amp: bool = False, dynamic: bool = False, inference: bool = False):
    from core.feature_spec import DynamicSpec
    from core.optimizers import LearningRateSchedule
    from core.parallel.placement import make_plan
    from model import DLRM, ModelConfig
    from trainer import DlrmTrainer
    config = ModelConfig(NUM_NUMERICAL, (ROWS,) * NUM_TABLES, DIM, BOTTOM, TOP,
                         dynamic=(DynamicSpec(),) * NUM_TABLES if dynamic else ())
    model = DLRM(config, make_plan(config.cardinalities, DIM))
    trainer = DlrmTrainer(model, "sgd", LearningRateSchedule(0.1, 0, 0, 0), amp=amp, xla=xla)
    if inference:
        return lambda batch, _: trainer.predict(batch)
    return lambda batch, step: trainer.train_step(batch, step)


def naive_keras(policy: str = None):
    import keras
    import tensorflow as tf
    from interaction import dot_interact_tf
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    numerical_in = keras.Input((NUM_NUMERICAL,))
    categorical_in = [keras.Input((), dtype="int32") for _ in range(NUM_TABLES)]
    x = keras.layers.ZeroPadding1D((0, 3))(keras.layers.Reshape((NUM_NUMERICAL, 1))(numerical_in))
    x = keras.layers.Flatten()(x)
    for width in BOTTOM:
        x = keras.layers.Dense(width, activation="relu")(x)
    embedded = [keras.layers.Embedding(ROWS, DIM)(c) for c in categorical_in]
    stacked = keras.layers.Lambda(lambda t: tf.stack(t, axis=1))([x] + embedded)
    interaction = keras.layers.Lambda(lambda t: dot_interact_tf(t[0], t[1]))([stacked, x])
    y = interaction
    for i, width in enumerate(TOP):
        y = keras.layers.Dense(width, activation="relu" if i < len(TOP) - 1 else None)(y)
    model = keras.Model([numerical_in] + categorical_in, y)
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(numerical, categorical, label):
        with tf.GradientTape() as tape:
            logits = tf.cast(tf.squeeze(model([numerical] + list(categorical), training=True), 1),
                             tf.float32)  # float32 under a mixed policy, as Keras advises
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(label, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return lambda batch, _: float(step(batch[0], batch[1], batch[2]))


def measure(step_fn, data, steps: int, warmup: int = 3) -> float:
    for i in range(warmup):
        step_fn(data[i % len(data)], i)
    start = time.perf_counter()
    for i in range(steps):
        step_fn(data[i % len(data)], warmup + i)
    elapsed = time.perf_counter() - start
    return steps * int(data[0][0].shape[0]) / elapsed


def worker(variant: str, batch_size: int, steps: int, profile: bool = False):
    configure_environment(variant)
    builders = {"ours": lambda: ours(False), "ours_xla": lambda: ours(True),
                "ours_amp_bf16": lambda: ours(False, amp=True), "naive_keras": naive_keras,
                "naive_keras_onednn": naive_keras,
                "naive_keras_bf16": lambda: naive_keras("mixed_bfloat16"),
                "ours_dynamic": lambda: ours(False, dynamic=True),
                "ours_inference": lambda: ours(False, inference=True)}
    if variant == "map_memory":
        return map_bytes_per_entry()
    step_fn, data = builders[variant](), batches(batch_size, 4, variant == "ours_dynamic")
    if profile:
        return op_times(step_fn, data, steps)
    return measure(step_fn, data, steps)


def map_bytes_per_entry(entries: int = NUM_TABLES * ROWS) -> float:
    """Resident bytes a dynamic table's map takes per id (as many ids as the tables' rows)."""
    import numpy as np
    import tensorflow as tf
    from core.dynamic import DynamicTable

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    table = DynamicTable(entries + 1)
    ids = tf.constant(np.arange(entries, dtype=np.int64) * HASH)
    table.lookup(ids[:10])  # the runtime's own allocations before the baseline
    before = resident()
    table.rows.insert(ids, tf.range(1, entries + 1, dtype=tf.int64))
    return (resident() - before) / entries


def op_times(step_fn, data, steps: int) -> dict:
    """{"wall_ms": per step, "ops": {"name:type": ms per step}} from a TensorFlow profiler
    trace of `steps` steps (after warm-up). An op's time is its wall time on its executor
    thread (its work on the intra-op pool included)."""
    import glob
    import tempfile
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    for i in range(3):  # warm-up: tracing
        step_fn(data[i % len(data)], i)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for i in range(steps):
            step_fn(data[i % len(data)], i)
        wall = time.perf_counter() - start
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
            space.ParseFromString(f.read())
    ops = {}
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # the executor's threads
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if re.fullmatch(r"[^:]+:[^:]+", name):  # "op_name:op_type", not a marker
                    ops[name] = ops.get(name, 0.0) + event.duration_ps / 1e9 / steps
    return {"wall_ms": 1e3 * wall / steps, "ops": ops}


# pieces of the `ours` step, by op name (model.py's name scopes; the tape names an op's
# gradient after it) or op type; the first match wins
PIECES = (("sparse SGD update, 26 tables", r":(ResourceScatter|ResourceSparseApply)"),
          ("embedding lookup + its gradient", r"embeddings/|:ResourceGather|Unpack"),
          ("bottom MLP fwd+bwd", r"bottom_mlp/"),
          ("interaction fwd+bwd", r"interaction(_grad)?/"),
          ("top MLP fwd+bwd", r"top_mlp/"),
          ("loss", r"logistic_loss|loss/"),
          ("dense SGD update", r":(AssignSubVariableOp|ResourceApplyGradientDescent|Mul)$"),
          ("other", r""))


def print_profile(variant: str, batch_size: int, times: dict) -> None:
    ops, by_piece, by_type = times["ops"], {}, {}
    for name, ms in ops.items():
        piece = next(p for p, pattern in PIECES if re.search(pattern, name))
        by_piece.setdefault(piece, {}).setdefault(name.rsplit(":", 1)[1], 0.0)
        by_piece[piece][name.rsplit(":", 1)[1]] += ms
        by_type[name.rsplit(":", 1)[1]] = by_type.get(name.rsplit(":", 1)[1], 0.0) + ms
    total = sum(ops.values())
    print(f"\n{variant}, batch {batch_size}: {times['wall_ms']:.1f} ms per step (wall), "
          f"{total:.1f} ms of op time per step (summed over executor threads)")
    order = [p for p, _ in PIECES] if variant.startswith("ours") else []
    for piece in order:
        types = by_piece.get(piece, {})
        ms = sum(types.values())
        top = ", ".join(f"{t} {v:.1f}" for t, v in sorted(types.items(), key=lambda x: -x[1])[:4])
        print(f"  {piece:34s}{ms:9.1f} ms {100 * ms / total:5.1f}%   {top}")
    print("  by op type: " + ", ".join(f"{t} {v:.1f} ms ({100 * v / total:.0f}%)"
                                       for t, v in sorted(by_type.items(), key=lambda x: -x[1])
                                       if v >= 0.01 * total))


def run_worker(name: str, batch_size: int, steps: int, profile: bool = False):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name,
                           "--batch_sizes", str(batch_size), "--steps", str(steps)]
                          + (["--profile"] if profile else []), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} at batch {batch_size} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(results: dict, chosen: list) -> None:
    """Medians over the rounds and ours / each other variant (ratio of the medians)."""
    print("\nmedians, samples/s\nbatch    " + "".join(f"{n:>19s}" for n in chosen))
    for batch_size in sorted({b for _, b in results}):
        medians = {n: statistics.median(results[(n, batch_size)]) for n in chosen}
        print(f"{batch_size:<9d}" + "".join(f"{medians[n]:19,.0f}" for n in chosen))
        if "ours" in medians:
            print("  ours / " + ", ".join(f"{n} {medians['ours'] / medians[n]:.2f}x"
                                          for n in chosen if n != "ours"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_sizes", default="2048,16384")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds; each runs every variant once, in turn (interleaved), so "
                             "a change in the machine's load falls on all of them")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {VARIANTS}")
    parser.add_argument("--profile", action="store_true",
                        help="instead of throughput: where each variant's step spends its time "
                             "(TensorFlow profiler; the `ours` step by piece, ms and share)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, int(args.batch_sizes), args.steps, args.profile)))
        return
    chosen = args.variants.split(",")
    unknown = set(chosen) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown variant(s) {sorted(unknown)}; choose from {VARIANTS}")
    if args.profile:
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            for name in chosen:
                print_profile(name, batch_size, run_worker(name, batch_size, args.steps, True))
        return
    results = {}
    for round_ in range(args.rounds):
        # the order rotates each round: no variant always runs first (after a quiet spell)
        order = chosen[round_ % len(chosen):] + chosen[:round_ % len(chosen)]
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            for name in order:
                value = run_worker(name, batch_size, args.steps)
                results.setdefault((name, batch_size), []).append(value)
                print(f"  round {round_ + 1} {name:18s} batch {batch_size:6d}: "
                      f"{value:10,.0f} samples/s", flush=True)
    report(results, chosen)
    peaks = measure_peaks()
    print("\n" + peak_header(peaks, flop_per_sample()))
    for (name, batch_size), values in sorted(results.items()):
        print(f"  {name:18s} batch {batch_size:6d}: " + peak_fraction(
            statistics.median(values), flop_per_sample(), peaks, dtype_of(name)))
    if "ours_dynamic" in chosen:
        map_bytes = run_worker("map_memory", 0, 0)
        print(f"\ndynamic tables: memory per row = vector {DIM * 4} B (+ {DIM * 4} B per "
              f"optimizer slot: SGD none, Adam 2) + row -> id and last use 16 B + map entry "
              f"{map_bytes:.0f} B (measured: resident growth over {NUM_TABLES * ROWS:,} "
              f"inserted ids)")


if __name__ == "__main__":
    main()
