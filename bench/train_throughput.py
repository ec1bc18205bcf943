"""Training-step throughput on CPU: this project's DLRM vs a naive Keras DLRM, same run.

Shape: 26 tables x 100k rows x 128, bottom 13-512-256-128, top 480-1024-1024-512-256-1, SGD.
The naive baseline uses keras.layers.Embedding, keras Dense layers and a tf.function step
with keras' SGD optimizer. Both train on the same pre-generated synthetic batches, so the
input pipeline is not measured.

  .venv/bin/python bench/train_throughput.py [--batch_sizes 2048,16384] [--steps 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from datasets import SyntheticSource  # noqa: E402
from embedding import make_plan  # noqa: E402
from feature_spec import FeatureSpec  # noqa: E402
from interaction import dot_interact_tf  # noqa: E402
from lr_scheduler import LearningRateSchedule  # noqa: E402
from model import DLRM, ModelConfig  # noqa: E402
from trainer import Trainer  # noqa: E402

NUM_TABLES, ROWS, DIM, NUM_NUMERICAL = 26, 100_000, 128, 13
BOTTOM, TOP = (512, 256, 128), (1024, 1024, 512, 256, 1)


def batches(batch_size: int, count: int):
    spec = FeatureSpec.get_default(NUM_NUMERICAL, [ROWS] * NUM_TABLES)
    source = SyntheticSource(spec, batch_size, count, seed=1, signal_strength=1.0)
    out = []
    for i in range(count):
        numerical, categorical, label = source.get(i)
        out.append((tf.constant(numerical.astype(np.float32)),
                    tuple(tf.constant(c.astype(np.int32)) for c in categorical),
                    tf.constant(label.astype(np.float32)), tf.constant(batch_size, tf.int32)))
    return out


def ours(xla: bool, amp: bool = False):
    config = ModelConfig(NUM_NUMERICAL, (ROWS,) * NUM_TABLES, DIM, BOTTOM, TOP)
    model = DLRM(config, make_plan(config.cardinalities, DIM))
    trainer = Trainer(model, "sgd", LearningRateSchedule(0.1, 0, 0, 0), amp=amp, xla=xla)
    return lambda batch, step: trainer.train_step(batch, step)


def naive_keras():
    import keras
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
            logits = tf.squeeze(model([numerical] + list(categorical), training=True), 1)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_sizes", default="2048,16384")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--variants", default="ours,ours_xla,naive_keras")
    args = parser.parse_args()
    variants = {"ours": lambda: ours(False), "ours_xla": lambda: ours(True),
                "ours_amp_bf16": lambda: ours(False, amp=True), "naive_keras": naive_keras}
    chosen = args.variants.split(",")
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        data = batches(batch_size, 4)
        for name in chosen:
            step_fn = variants[name]()
            results[(name, batch_size)] = measure(step_fn, data, args.steps)
            print(f"  {name:14s} batch {batch_size:6d}: "
                  f"{results[(name, batch_size)]:10,.0f} samples/s", flush=True)
            del step_fn
    print("\nbatch    " + "".join(f"{n:>15s}" for n in chosen) + "   best ours / naive")
    for batch_size in sorted({b for _, b in results}):
        row = [results[(n, batch_size)] for n in chosen]
        ours_best = max(results[(n, batch_size)] for n in chosen if n.startswith("ours"))
        ratio = ours_best / results[("naive_keras", batch_size)] if "naive_keras" in chosen \
            else float("nan")
        print(f"{batch_size:<9d}" + "".join(f"{v:15,.0f}" for v in row) + f"   {ratio:.2f}x")


if __name__ == "__main__":
    main()
