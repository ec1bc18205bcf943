"""Where a SIM / DIEN / DIN training step's time goes on CPU, at NVIDIA's shape (history 100,
long part 90, embedding 16, widths 200; 200,80; 100,50): the whole step, then each piece
alone, forward + backward, compiled as the step is (tf.function): the lookups with their
sparse gradients and the optimizer's row updates, the attention units, the GRU and AUGRU
loops, DIEN's auxiliary loss, the GSU scoring + top-k, the stage-two MLP; and the input
pipeline's own rate on a dataset (rows/s through DictPipeline, no model).

  python bench/sim_step_profile.py --dataset_dir DATA [--batch_sizes 256,4096]
      [--models din,dien,sim] [--steps 20] [--xla] [--pipeline] [--ops]
      [--architecture reference|compact]

Prints one JSON line per (model, batch size, piece): milliseconds per step (median).
--ops also traces the whole step with the TensorFlow profiler and prints its op time by op
type (summed over the executor threads, so it may exceed the wall time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from core import runtime  # noqa: E402


def median_ms(fn, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def pipeline_rate(spec, batch_size: int) -> float:
    """Rows/s of one pass of the training data through the reader pipeline alone."""
    from core.pipelines import DictPipeline
    from core.parallel.comm import make_communicator
    from sim.data import open_mapping
    import tensorflow as tf
    pipe = DictPipeline(open_mapping(spec, "train", batch_size, make_communicator(True)),
                        (spec.label_feature,), -1, tf.data.AUTOTUNE)
    start, rows = time.perf_counter(), 0
    for batch in pipe.epoch(0):
        rows += int(batch[DictPipeline.GLOBAL_ROWS])
    return rows / (time.perf_counter() - start)


def batches(spec, batch_size: int, count: int):
    from core.pipelines import DictPipeline
    from core.parallel.comm import make_communicator
    from sim.data import label, model_inputs, open_mapping
    pipe = DictPipeline(open_mapping(spec, "train", batch_size, make_communicator(True)),
                        (spec.label_feature,))
    return [(model_inputs(spec, b), label(spec, b)) for b in pipe.epoch(0).take(count)]


def pieces(model, inputs, compute_dtype):
    """name -> function of no argument running that piece forward + backward."""
    import tensorflow as tf

    from sim import blocks
    c = model.config
    embedded = model.lookup(inputs)
    e = {k: tf.identity(v) for k, v in embedded.items()}

    def grad_of(f, variables, tensors=()):
        @tf.function
        def run():
            with tf.GradientTape() as tape:
                tape.watch(list(tensors))
                out = f()
            return tape.gradient(out, list(variables) + list(tensors))
        return run

    def lookup_and_update():
        tables = list(model.tables().values())
        with tf.GradientTape() as tape:
            out = model.lookup(inputs)
            total = tf.add_n([tf.reduce_sum(v) for k, v in out.items() if "mask" not in k])
        for table, g in zip(tables, tape.gradient(total, tables)):
            table.scatter_sub(tf.IndexedSlices(g.values * 1e-9, g.indices))

    out = {"lookups + sparse table update": tf.function(lookup_and_update)}
    target = e["target"]
    if c.model_type == "din":
        u = blocks.dot_product if c.dot else model.short_attention
        out[f"attention ({c.item_item_interaction}) over 100"] = grad_of(
            lambda: tf.reduce_sum(blocks.attention_pool(u, target, e["history"],
                                                        e["history_mask"], compute_dtype,
                                                        normalize=c.dot)[0]),
            [] if c.dot else u.trainable_variables, [target, e["history"]])
    else:
        short, mask = e["short"], e["short_mask"]
        att = tf.nn.softmax(tf.random.normal(tf.shape(mask)))
        if c.reference:  # the blocks read time-major [S, B, ...] (the GRU's H-wide states)
            short = blocks.time_major(short)
            states = tf.identity(model.gru(short, compute_dtype))
            gru = lambda: model.gru(short, compute_dtype)  # noqa: E731
            augru = lambda: model.augru(states, tf.transpose(att), compute_dtype)  # noqa: E731
            aux = lambda: blocks.reference_auxiliary_loss(  # noqa: E731
                model.aux_mlp, states, short, blocks.time_major(e["short_negative"]), mask,
                compute_dtype)
        else:
            states = short
            gru = lambda: model.gru(short, mask, compute_dtype)  # noqa: E731
            augru = lambda: model.augru(short, mask, compute_dtype, att)[:, -1]  # noqa: E731
            aux = lambda: blocks.auxiliary_loss(  # noqa: E731
                model.aux_mlp, short, short, e["short_negative"], mask, compute_dtype)
        out["GRU over 10"] = grad_of(lambda: tf.reduce_sum(gru()),
                                     model.gru.trainable_variables, [short])
        out["AUGRU over 10"] = grad_of(lambda: tf.reduce_sum(augru()),
                                       model.augru.trainable_variables, [states])
        out["aux loss"] = grad_of(lambda: tf.reduce_sum(aux()),
                                  model.aux_mlp.trainable_variables, [states])
        out["DIEN attention"] = grad_of(
            lambda: tf.reduce_sum(model.short_attention(target, states, compute_dtype)),
            model.short_attention.trainable_variables, [target, states])
    if c.model_type == "sim":
        long, lmask = e["long"], e["long_mask"]
        out["GSU scorer over 90 + top-k"] = grad_of(
            lambda: tf.reduce_sum(model._search(e, compute_dtype)[0]),
            list(v for k, v in model.dense_variables().items()
                 if k.split("/")[0] in ("gsu_scorer", "long_attention", "gsu_head")),
            [target, long])
    out["forward + backward (dense part)"] = grad_of(
        lambda: tf.reduce_sum(model.forward(e, compute_dtype)[0]),
        list(model.dense_variables().values()), [v for k, v in e.items() if "mask" not in k])
    return out


def op_types(step, data, steps: int, top: int = 12) -> dict:
    """{"wall_ms", "op_ms", "by_type": {op type: ms per step}} of the `top` op types."""
    from train_throughput import op_times
    times = op_times(lambda batch, i: step(), data, steps)
    by_type = {}
    for name, ms in times["ops"].items():
        kind = name.rsplit(":", 1)[1]
        by_type[kind] = by_type.get(kind, 0.0) + ms
    ranked = sorted(by_type.items(), key=lambda kv: -kv[1])[:top]
    return {"wall_ms": round(times["wall_ms"], 2), "op_ms": round(sum(by_type.values()), 2),
            "by_type": {k: round(v, 2) for k, v in ranked}}


def profile(spec, model_type: str, batch_size: int, steps: int, xla: bool, ops: bool,
            architecture: str):
    import tensorflow as tf

    from core.parallel.comm import make_communicator
    from sim.data import model_shape
    from sim.model import SimConfig, SimModel
    from sim.trainer import SimTrainer
    config = SimConfig(**model_shape(spec), model_type=model_type, long_seq_length=90,
                       gsu_top_k=50, architecture=architecture)
    model = SimModel(config)
    trainer = SimTrainer(model, make_communicator(True), xla=xla)
    data = batches(spec, batch_size, 4)
    counter = iter(range(10 ** 9))

    rows_t = tf.constant(batch_size, tf.int32)

    def step():  # the engine's SIM batch: (inputs, label, global rows); the loss read back
        inputs, label = data[next(counter) % len(data)]
        float(trainer.train_step((inputs, label, rows_t), 0))

    rows = [{"piece": "whole train step", "ms": median_ms(step, steps)}]
    rows.append({"piece": "predict", "ms": median_ms(
        lambda: trainer.predict((data[0][0], data[0][1], rows_t)).numpy(), steps)})
    for name, fn in pieces(model, data[0][0], trainer.compute_dtype).items():
        rows.append({"piece": name, "ms": median_ms(fn, steps)})
    for r in rows:
        print(json.dumps({"model": model_type, "architecture": architecture,
                          "batch": batch_size, **r,
                          "ms": round(r["ms"], 2)}), flush=True)
    if ops:
        print(json.dumps({"model": model_type, "batch": batch_size, "piece": "op types",
                          **op_types(step, data, steps)}), flush=True)


def main():
    runtime.configure()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset_dir", required=True)
    p.add_argument("--batch_sizes", default="256,4096")
    p.add_argument("--models", default="din,dien,sim")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--xla", action="store_true")
    p.add_argument("--architecture", default="reference", choices=["reference", "compact"])
    p.add_argument("--pipeline", action="store_true", help="also time the input pipeline")
    p.add_argument("--ops", action="store_true",
                   help="also the whole step's op time by op type (TensorFlow profiler)")
    a = p.parse_args()
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    spec = load_spec(a.dataset_dir, SIM_CONTRACT)
    for b in (int(x) for x in a.batch_sizes.split(",")):
        if a.pipeline:
            print(json.dumps({"batch": b, "piece": "input pipeline alone",
                              "rows_per_s": round(pipeline_rate(spec, b))}), flush=True)
        for m in a.models.split(","):
            profile(spec, m, b, a.steps, a.xla, a.ops, a.architecture)


if __name__ == "__main__":
    main()
