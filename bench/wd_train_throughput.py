"""Training samples/s of this Wide & Deep against a naive Keras implementation of the same
model (Keras Embedding/Dense layers, Keras Ftrl/RMSprop, default TensorFlow settings), on
the reference shape (~92 M parameters). Each variant runs in its own process on the same
random batches (uniform ids, multi-hot lengths 0..3); the order rotates each round. Besides
samples/s (wall time) each variant's CPU seconds per step (all its threads, thread pools'
spin-waits included) are printed: how much of the cores a step used. Both move with the
load of a shared machine (the Keras twin's CPU time by up to 1.6x between runs): compare
within a round.

--amp adds `ours_amp_bf16` (ours with --amp forced to bfloat16, DLRM_CPU_AMP=bfloat16, on
any CPU) and `keras_bf16` (the Keras twin under Keras' `mixed_bfloat16` policy), then prints
the medians, bfloat16 / float32 of each, ours / Keras at each dtype, and each step as a
fraction of the machine's matmul peak at its dtype (bench/rates.py; FLOP of the deep MLP).

  .venv/bin/python bench/wd_train_throughput.py [--batch_size 16384] [--steps 5] [--scale 1]
      [--rounds 2] [--amp]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from rates import interleaved, report_amp  # noqa: E402

VARIANTS, AMP_VARIANTS = ("ours", "keras"), ("ours", "ours_amp_bf16", "keras", "keras_bf16")


def batches(spec, batch_size: int, count: int):
    import numpy as np
    import tensorflow as tf
    from core.sources import length_key
    from wide_and_deep.contract import MULTIHOT_CHANNEL, ONEHOT_CHANNEL
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        b = {f: tf.constant(rng.integers(0, spec.cardinality(f), batch_size))
             for f in spec.channel(ONEHOT_CHANNEL)}
        for f in spec.channel(MULTIHOT_CHANNEL):
            b[f] = tf.constant(rng.integers(0, spec.cardinality(f), (batch_size, 3)))
            b[length_key(f)] = tf.constant(rng.integers(0, 4, batch_size), tf.int32)
        for f in spec.channel("numerical"):
            b[f] = tf.constant(rng.standard_normal(batch_size), tf.float32)
        b["clicked"] = tf.constant(rng.random(batch_size) < 0.2, tf.float32)
        b["__global_rows"] = tf.constant(batch_size, tf.int32)
        out.append(b)
    return out


def flop_per_sample(config) -> float:
    """Multiply-adds of the deep MLP x2 for FLOP, x3 for forward + backward (the tables'
    lookups and the wide sum do no matmul)."""
    widths = [config.deep_input_width, *config.hidden_units, 1]
    return 3 * 2 * sum(a * b for a, b in zip(widths[:-1], widths[1:]))


def ours(spec, config, amp=False):
    from core.parallel.comm import make_communicator
    from core.optimizers import LearningRateSchedule
    from wide_and_deep.model import WideDeepModel
    from wide_and_deep.trainer import WideDeepTrainer
    model = WideDeepModel(config)
    trainer = WideDeepTrainer(model, make_communicator(), "clicked", 0.02,
                              LearningRateSchedule(0.00012, warmup_steps=0, decay_steps=0),
                              amp=amp)
    return trainer.train_step


def naive_keras(spec, config, policy=None):
    """The same model written the obvious Keras way; policy: Keras' global dtype policy
    (under a mixed one, the casts a user must add where raw TensorFlow ops meet layers)."""
    import keras
    import tensorflow as tf
    from core.sources import length_key
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    wide_emb = {t.name: keras.layers.Embedding(t.cardinality, 1) for t in config.tables}
    deep_emb = {t.name: keras.layers.Embedding(t.cardinality, t.dim) for t in config.tables}
    mlp = [keras.layers.Dense(u, activation="relu") for u in config.hidden_units]
    drop = keras.layers.Dropout(config.dropout)
    out = keras.layers.Dense(1)
    bias = tf.Variable(tf.zeros([1]))

    def pooled(layer, t, batch):
        e = layer(batch[t.name])
        if t.hotness is None:
            return e
        mask = tf.sequence_mask(batch[length_key(t.name)], t.hotness, e.dtype)
        return tf.reduce_sum(e * mask[:, :, None], axis=1)

    def forward(batch):
        wide = tf.add_n([pooled(wide_emb[t.name], t, batch)[:, 0] for t in config.tables])
        numerical = tf.stack([batch[f] for f in config.numerical], 1)
        x = tf.concat([tf.cast(numerical, mlp[0].compute_dtype)] +
                      [pooled(deep_emb[t.name], t, batch) for t in config.tables], axis=1)
        for layer in mlp:
            x = drop(layer(x), training=True)
        return tf.cast(wide + out(x)[:, 0], tf.float32) + bias  # float32 logits

    forward(batches(spec, 2, 1)[0])  # build the layers
    wide_vars = [bias] + [layer.embeddings for layer in wide_emb.values()]
    deep_vars = [layer.embeddings for layer in deep_emb.values()] + \
        [v for layer in mlp + [out] for v in layer.trainable_variables]
    ftrl = keras.optimizers.Ftrl(0.02)
    rms = keras.optimizers.RMSprop(0.00012, rho=0.5)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                batch["clicked"], forward(batch)))
        grads = tape.gradient(loss, wide_vars + deep_vars)
        ftrl.apply_gradients(zip(grads[:len(wide_vars)], wide_vars))
        rms.apply_gradients(zip(grads[len(wide_vars):], deep_vars))
        return loss

    return lambda batch, i: float(step(batch))


def measure(variant: str, batch_size: int, steps: int, warmup: int, scale: float) -> dict:
    from core import runtime
    if variant.startswith("ours"):
        runtime.configure()  # the toolkit's settings; the naive variant keeps TF's defaults
    if variant == "ours_amp_bf16":
        os.environ[runtime.CPU_AMP_VARIABLE] = "bfloat16"  # on any CPU
    from wide_and_deep.model import WideDeepConfig, parameter_count
    from wide_and_deep.contract import embedding_dims, reference_spec
    spec = reference_spec(scale)
    config = WideDeepConfig.from_spec(spec, embedding_dims(spec))
    step = {"ours": lambda: ours(spec, config),
            "ours_amp_bf16": lambda: ours(spec, config, amp=True),
            "keras": lambda: naive_keras(spec, config),
            "keras_bf16": lambda: naive_keras(spec, config, "mixed_bfloat16")}[variant]()
    data = batches(spec, batch_size, 4)
    for i in range(warmup):
        step(data[i % 4], i)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(data[i % 4], warmup + i)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"variant": variant, "samples_per_second": steps * batch_size / elapsed,
            "cpu_seconds_per_step": cpu / steps,
            "parameters": parameter_count(config), "batch_size": batch_size, "steps": steps,
            "flop_per_sample": flop_per_sample(config)}


def run_variant(variant: str, args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--variant", variant] +
                         [f"--{k}={getattr(args, k)}" for k in
                          ("batch_size", "steps", "warmup", "scale")],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=16384)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="reference cardinalities x scale")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of every variant, interleaved so that load drifts hit all")
    p.add_argument("--amp", action="store_true",
                   help="also ours --amp (bfloat16) and Keras under mixed_bfloat16")
    p.add_argument("--variant", choices=AMP_VARIANTS, help="internal: run one variant")
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args.variant, args.batch_size, args.steps, args.warmup,
                                 args.scale)))
        return 0

    def run(variant, round_):
        r = run_variant(variant, args)
        print(f"round {round_}: {variant:13s} {r['samples_per_second']:>10,.0f} samples/s, "
              f"{r['cpu_seconds_per_step']:.2f} CPU s per step ({r['parameters']:,} "
              f"parameters, batch {args.batch_size})", flush=True)
        return r
    results = interleaved(AMP_VARIANTS if args.amp else VARIANTS, args.rounds, run, args.amp)
    ratios = [r["ours"]["samples_per_second"] / r["keras"]["samples_per_second"]
              for r in results]
    print(f"speed-up over naive Keras: median {np.median(ratios):.2f}x over "
          f"{args.rounds} rounds (min {min(ratios):.2f}x, max {max(ratios):.2f}x; "
          f"target >= 1.5x)")
    cpu = [r["keras"]["cpu_seconds_per_step"] / r["ours"]["cpu_seconds_per_step"]
           for r in results]
    print(f"CPU time per step, naive Keras / ours: median {np.median(cpu):.2f}x (min "
          f"{min(cpu):.2f}x, max {max(cpu):.2f}x; the process's CPU seconds, all threads, "
          f"spin-waits included)")
    if args.amp:
        report_amp(results, lambda r: r["samples_per_second"],
                   results[0]["ours"]["flop_per_sample"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
