"""Training samples/s and inference latency of SIM: this toolkit's implementation vs a naive
Keras one of the same model (Keras Embedding, Dense, GRU and an RNN cell for AUGRU, Keras
Adam, default settings), on the reference shape (histories of 100, embedding 16, GSU 200,
stage two 200,80, aux 100,50, Amazon Books table sizes). Each variant runs in its own process
on the same random batches; the driver prints both and the ratio.

--amp adds `ours_amp_bf16` (ours with --amp forced to bfloat16, DLRM_CPU_AMP=bfloat16, on
any CPU) and `keras_bf16` (the Keras twin under Keras' `mixed_bfloat16` policy), runs
--rounds interleaved rounds (the order rotates each round) and prints the medians,
bfloat16 / float32 of each, ours / Keras at each dtype, and each step as a fraction of the
machine's matmul peak at its dtype (bench/rates.py), the FLOP counted on the Keras twin's
matmuls (ours skips some of them: the query's share of each activation unit's first layer is
applied once per row, so its fraction is of the same work, done with fewer operations).

  python bench/sim_train_throughput.py [--batch_size 1024] [--steps 30] [--threads 0]
      [--amp] [--rounds 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from core import runtime  # noqa: E402
from rates import interleaved, medians, report_amp  # noqa: E402

# Table sizes of Amazon Books preprocessed with 20+ reviews per user (users, items,
# categories); the tables' size is what separates sparse row updates from dense ones.
USERS, ITEMS, CATEGORIES, HISTORY, LONG = 543060, 367983, 1601, 100, 90
# The Keras twin's widths (ours is configured alike: SimConfig's defaults)
EMBEDDING, STATE, TOP_K = 16, 32, 20  # STATE: the GRUs' width, an item's (2 embeddings)
ATTENTION, GSU, TOP, AUX = (80, 40), (200,), (200, 80), (100, 50)
VARIANTS, AMP_VARIANTS = ("ours", "keras"), ("ours", "ours_amp_bf16", "keras", "keras_bf16")
WORKER_FLAGS = ("batch_size", "steps", "warmup", "inference_steps", "threads", "model_type")


def flop_per_sample() -> float:
    """Multiply-adds of the Keras twin's matmuls per row (GRU, AUGRU, the scoring MLPs over
    their behaviours, the heads), x2 for FLOP, x3 for forward + backward."""
    def mlp(width, widths):
        return sum(a * b for a, b in zip([width, *widths], [*widths, 1]))
    item, short = STATE, HISTORY - LONG
    gru = short * 3 * (item * STATE + STATE * STATE)  # three gates, input and recurrent
    augru = short * 3 * (STATE * STATE + STATE * STATE)
    aux = 2 * (short - 1) * mlp(STATE + item, AUX)  # positive and negative next items
    short_attention = short * mlp(4 * item, ATTENTION)
    gsu = LONG * mlp(4 * item, GSU) + mlp(EMBEDDING + 3 * item, GSU)  # scores, then the head
    long_attention = TOP_K * mlp(4 * item, ATTENTION)
    top = mlp(EMBEDDING + 5 * item, TOP)
    return 3 * 2 * (gru + augru + aux + short_attention + gsu + long_attention + top)


def batch(size: int, seed: int):
    import tensorflow as tf

    from sim.synthetic import generate
    cols = generate(size * 5 // 4 + 5, ITEMS, CATEGORIES, HISTORY, "long", seed)["train"]
    t = {k: tf.constant(v[0][:size] if isinstance(v, tuple) else v[:size]) for k, v in
         cols.items()}
    inputs = {"user": [t["user_id"] % USERS + 1], "target": [t["item_id"], t["cat_id"]],
              "positive": [t["hist_item_id"], t["hist_cat_id"]],
              "negative": [t["neg_hist_item_id"], t["neg_hist_cat_id"]]}
    return inputs, tf.cast(t["label"], tf.float32)


def ours(args, batches, amp=False):
    import tensorflow as tf

    from core.parallel.comm import make_communicator
    from sim.model import SimConfig, SimModel
    from sim.trainer import SimTrainer
    # The Keras twin is the compact architecture scoring with the activation unit: so is
    # ours here.
    config = SimConfig((USERS,), (ITEMS, CATEGORIES), HISTORY, long_seq_length=LONG,
                       model_type=args.model_type, item_item_interaction="activation_unit",
                       architecture="compact")
    trainer = SimTrainer(SimModel(config), make_communicator(), amp=amp)
    rows = tf.constant(int(batches[0][1].shape[0]), tf.int32)

    def step(i):
        inputs, label = batches[i % len(batches)]
        return float(trainer.train_step((inputs, label, rows), i))

    no_label = tf.zeros([0])  # predict reads the inputs alone
    return step, lambda inputs: trainer.predict((inputs, no_label, rows)).numpy()


def keras_variant(args, batches, policy=None):
    """policy: Keras' global dtype policy (under a mixed one, the casts a user must add where
    raw TensorFlow ops meet the layers' outputs)."""
    import keras
    import tensorflow as tf
    if policy:
        keras.mixed_precision.set_global_policy(policy)

    class AUGRUCell(keras.layers.Layer):
        """A Keras GRU cell whose update gate is scaled by the attention (last input)."""

        def __init__(self, units, **kw):
            super().__init__(**kw)
            self.units, self.state_size = units, units
            self.cell = keras.layers.GRUCell(units)

        def build(self, shape):
            self.cell.build((shape[0], shape[-1] - 1))

        def call(self, inputs, states):
            x, a = inputs[:, :-1], inputs[:, -1:]
            h = states[0]
            candidate, _ = self.cell(x, [h])
            return h + a * (candidate - h), [h + a * (candidate - h)]

    def mlp(widths):
        return keras.Sequential([keras.layers.Dense(w, activation="relu") for w in widths]
                                + [keras.layers.Dense(1)])

    class KerasSim(keras.Model):
        def __init__(self):
            super().__init__()
            # ids 1..cardinality, 0 = padding: cardinality + 1 rows
            self.user = keras.layers.Embedding(USERS + 1, EMBEDDING)
            self.item = keras.layers.Embedding(ITEMS + 1, EMBEDDING)
            self.cat = keras.layers.Embedding(CATEGORIES + 1, EMBEDDING)
            self.gru = keras.layers.GRU(STATE, return_sequences=True)
            self.augru = keras.layers.RNN(AUGRUCell(STATE))
            self.short_att, self.long_att = mlp(ATTENTION), mlp(ATTENTION)
            self.gsu, self.gsu_head = mlp(GSU), mlp(GSU)
            self.aux, self.top = mlp(AUX), mlp(TOP)

        def embed(self, ids):
            return keras.layers.concatenate([self.item(ids[0]), self.cat(ids[1])])

        def scores(self, net, q, keys):
            q = tf.broadcast_to(q[:, None], tf.shape(keys))
            return tf.squeeze(net(tf.concat([q, keys, q - keys, q * keys], -1)), -1)

        def call(self, x):
            pos = x["positive"]  # left-padded with 0, most recent last
            short = self.embed([p[:, LONG:] for p in pos])
            short_neg = self.embed([n[:, LONG:] for n in x["negative"]])
            short_mask = pos[0][:, LONG:] > 0
            long = self.embed([p[:, :LONG] for p in pos])
            long_mask = pos[0][:, :LONG] > 0
            q = self.embed(x["target"])
            user = self.user(x["user"][0])
            states = self.gru(short, mask=short_mask)
            aux_in = lambda e: tf.concat([states[:, :-1], e[:, 1:]], -1)  # noqa: E731
            pair = tf.cast(short_mask[:, :-1] & short_mask[:, 1:], states.dtype)
            aux = tf.reduce_sum(pair * (tf.nn.softplus(-tf.squeeze(self.aux(aux_in(short)), -1))
                                        + tf.nn.softplus(tf.squeeze(self.aux(aux_in(short_neg)),
                                                                    -1))), 1)
            att = tf.nn.softmax(tf.where(short_mask, self.scores(self.short_att, q, states),
                                         -1e9))
            interest = self.augru(tf.concat([states, att[..., None]], -1), mask=short_mask)
            s = tf.where(long_mask, self.scores(self.gsu, q, long), -1e9)
            gsu_pool = tf.reduce_sum(tf.nn.softmax(s)[..., None] * long, 1)
            gsu = tf.squeeze(self.gsu_head(tf.concat([user, q, gsu_pool, q * gsu_pool], -1)), -1)
            top = tf.math.top_k(s, TOP_K).indices
            sel = tf.gather(long, top, batch_dims=1)
            sel_mask = tf.cast(tf.gather(long_mask, top, batch_dims=1), sel.dtype)
            w = self.scores(self.long_att, q, sel) * sel_mask
            esu = tf.reduce_sum(w[..., None] * sel, 1)
            feats = tf.concat([user, q, interest, esu, q * interest, q * esu], -1)
            logit = tf.squeeze(self.top(feats), -1)
            return [tf.cast(t, tf.float32) for t in (logit, gsu, aux)]  # float32 loss

    model = KerasSim()
    optimizer = keras.optimizers.Adam(0.01)

    @tf.function
    def train(inputs, label):
        with tf.GradientTape() as tape:
            logit, gsu, aux = model(inputs)
            bce = lambda z: tf.nn.sigmoid_cross_entropy_with_logits(label, z)  # noqa: E731
            loss = tf.reduce_mean(bce(logit) + bce(gsu) + aux)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    predict = tf.function(lambda inputs: tf.sigmoid(model(inputs)[0]))
    return (lambda i: float(train(*batches[i % len(batches)])),
            lambda inputs: predict(inputs).numpy())


def measure(args) -> dict:
    runtime.configure()
    if args.variant == "ours_amp_bf16":
        os.environ[runtime.CPU_AMP_VARIABLE] = "bfloat16"  # on any CPU
    import numpy as np
    import tensorflow as tf
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    batches = [batch(args.batch_size, s) for s in range(4)]
    step, predict = {"ours": lambda: ours(args, batches),
                     "ours_amp_bf16": lambda: ours(args, batches, amp=True),
                     "keras": lambda: keras_variant(args, batches),
                     "keras_bf16": lambda: keras_variant(args, batches, "mixed_bfloat16")
                     }[args.variant]()
    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    train_sps = args.steps * args.batch_size / (time.perf_counter() - start)
    infer = [batch(1024, 10 + s)[0] for s in range(2)]
    latencies = []
    for i in range(args.warmup + args.inference_steps):
        t0 = time.perf_counter()
        predict(infer[i % 2])
        if i >= args.warmup:
            latencies.append(time.perf_counter() - t0)
    return {"variant": args.variant, "train_samples_per_second": train_sps,
            "inference_p50_ms_batch1024": 1000 * float(np.percentile(latencies, 50)),
            "inference_p99_ms_batch1024": 1000 * float(np.percentile(latencies, 99))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=AMP_VARIANTS, help="run one variant (internal)")
    p.add_argument("--batch_size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--inference_steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: default)")
    p.add_argument("--model_type", choices=["sim", "din", "dien"], default="sim",
                   help="our model; the Keras comparison exists for sim only")
    p.add_argument("--amp", action="store_true",
                   help="also ours --amp (bfloat16) and Keras under mixed_bfloat16")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds of every variant, interleaved so that load drifts hit all")
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args)))
        return 0
    if args.model_type != "sim":  # no Keras twin of DIN / DIEN: our figures alone
        args.variant = "ours"
        print(json.dumps(measure(args)))
        return 0

    def run(variant, _round):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--variant", variant]
                             + [f"--{k}={getattr(args, k)}" for k in WORKER_FLAGS],
                             capture_output=True, text=True, check=True).stdout
        print(out.strip().splitlines()[-1], flush=True)
        return json.loads(out.strip().splitlines()[-1])
    results = interleaved(AMP_VARIANTS if args.amp else VARIANTS, args.rounds, run, args.amp)
    median = {key: medians(results, lambda r: r[key]) for key in
              ("train_samples_per_second", "inference_p50_ms_batch1024",
               "inference_p99_ms_batch1024")}
    ours, keras = ({k: m[v] for k, m in median.items()} for v in ("ours", "keras"))
    ratio = ours["train_samples_per_second"] / keras["train_samples_per_second"]
    print(f"training speed-up over naive Keras: {ratio:.2f}x (target >= 1.5x); inference at "
          f"batch 1024, p50 / p99: ours {ours['inference_p50_ms_batch1024']:.1f} / "
          f"{ours['inference_p99_ms_batch1024']:.1f} ms, keras "
          f"{keras['inference_p50_ms_batch1024']:.1f} / "
          f"{keras['inference_p99_ms_batch1024']:.1f} ms")
    if args.amp:
        report_amp(results, lambda r: r["train_samples_per_second"], flop_per_sample())
    return 0


if __name__ == "__main__":
    sys.exit(main())
