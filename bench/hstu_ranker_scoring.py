"""The HSTU ranker (`sim.main --model_type hstu`) scoring C = 100 candidates per history in one
pass (M-FALCON: `SimModel.score_candidates`, each candidate reads the history and itself)
against the per-candidate baseline a user without M-FALCON runs: the C (history, candidate)
pairs batched as C rows through the model's one-target prediction (what `sim.main`'s
SavedModel serves). Shape of the SIM family's data: Amazon Books table sizes, histories of
100 (random lengths 20-100, left-padded), two item features of 32 (width 64), 2 blocks, 1
head, the default classifier (200, 80); seeded initial weights (time does not depend on
their values).

Both are traced `tf.function`s called on the same requests, a request being B histories
(B = 1 and 16) with their C candidates; the baseline's C-fold rows are built before timing.
Each round times every (way, B) --calls times after a warm-up, the order rotating each round
(bench/rates.py); a call's time includes its result's copy to the host. Before timing, the
two ways' logits are checked equal (one pass = C rows). Printed: per (way, B) the median ms
per history and candidates/s over the rounds' per-round medians, and one pass / per candidate
(the median of the per-round ratios, and their range). Writes
bench/results/hstu_ranker_scoring.txt (not at BENCH_SMOKE=1, whose toy figures mean nothing).

  .venv/bin/python bench/hstu_ranker_scoring.py [--calls 20] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rates import (ROOT, SMOKE, interleaved, run_line, uptime,  # noqa: E402
                   write_results)

sys.path.insert(0, ROOT)
# Amazon Books preprocessed with 20+ reviews per user (users, items, categories)
USERS, ITEMS, CATEGORIES = (50, 300, 10) if SMOKE else (543060, 367983, 1601)
LENGTH, EMBEDDING, CANDIDATES = (10, 8, 20) if SMOKE else (100, 32, 100)
BATCHES = (1, 4) if SMOKE else (1, 16)
WAYS = ("one_pass", "per_candidate")
RESULTS = os.path.join(ROOT, "bench", "results", "hstu_ranker_scoring.txt")


def ranker():
    from sim.model import SimConfig, SimModel
    return SimModel(SimConfig(user_cardinalities=(USERS,),
                              item_cardinalities=(ITEMS, CATEGORIES), history_length=LENGTH,
                              model_type="hstu", embedding_dim=EMBEDDING, hstu_blocks=2,
                              hstu_heads=1, seed=0))


def requests(batch: int, count: int = 4) -> list:
    """{way: model inputs} of `count` requests of `batch` histories and their candidates:
    one_pass's target ids [B, C]; per_candidate's every history repeated C times, [B C]."""
    import tensorflow as tf
    rng = np.random.default_rng(batch)
    out = []
    for _ in range(count):
        lengths = rng.integers(min(20, LENGTH), LENGTH + 1, batch)
        padded = np.arange(LENGTH)[None] < (LENGTH - lengths)[:, None]  # left padding
        positive = [np.where(padded, 0, rng.integers(1, n + 1, (batch, LENGTH)))
                    for n in (ITEMS, CATEGORIES)]
        target = [rng.integers(1, n + 1, (batch, CANDIDATES)) for n in (ITEMS, CATEGORIES)]
        user = rng.integers(1, USERS + 1, batch)
        rows = np.repeat(np.arange(batch), CANDIDATES)

        def ids(arrays):
            return [tf.constant(a, tf.int64) for a in arrays]
        out.append({"one_pass": {"user": ids([user]), "target": ids(target),
                                 "positive": ids(positive)},
                    "per_candidate": {"user": ids([user[rows]]),
                                      "target": ids([t.reshape(-1) for t in target]),
                                      "positive": ids([p[rows] for p in positive])}})
    return out


def scorers(model) -> dict:
    """{way: traced function of model inputs -> logits}."""
    import tensorflow as tf
    one_pass = tf.function(model.score_candidates, autograph=False)
    per_candidate = tf.function(
        lambda inputs: model.forward(model.lookup(inputs, training=False))[0], autograph=False)
    return {"one_pass": one_pass, "per_candidate": per_candidate}


def check_equal(score: dict, loads: dict) -> float:
    """The largest |one pass - per candidate| over every request's logits; fails beyond
    float32 rounding."""
    worst = 0.0
    for batch, load in loads.items():
        for request in load:
            together = score["one_pass"](request["one_pass"]).numpy()
            alone = score["per_candidate"](request["per_candidate"]).numpy()
            np.testing.assert_allclose(together, alone.reshape(batch, CANDIDATES), rtol=1e-4,
                                       atol=1e-5)
            assert together.std() > 0, "every candidate got the same logit: a vacuous check"
            worst = max(worst, float(np.abs(together - alone.reshape(batch, -1)).max()))
    return worst


def timed(score, load: list, calls: int, warmup: int = 3) -> float:
    """Median seconds per call, cycling the requests."""
    for i in range(warmup):
        score(load[i % len(load)]).numpy()
    seconds = []
    for i in range(calls):
        start = time.perf_counter()
        score(load[i % len(load)]).numpy()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def table(runs: list) -> list:
    lines = [f"{'way':<14} {'B':>3} {'ms/history':>11} {'candidates/s':>13}"]
    for batch in BATCHES:
        for way in WAYS:
            seconds = statistics.median(r[f"{way}@{batch}"] for r in runs)
            lines.append(f"{way:<14} {batch:>3} {1e3 * seconds / batch:11.2f} "
                         f"{batch * CANDIDATES / seconds:13,.0f}")
        ratios = [r[f"per_candidate@{batch}"] / r[f"one_pass@{batch}"] for r in runs]
        lines.append(f"B = {batch}: one pass scores {statistics.median(ratios):.2f}x the "
                     f"per-candidate candidates/s (rounds: {min(ratios):.2f}-{max(ratios):.2f}x)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="timed calls per (way, B) per "
                        "round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uptime_before = uptime()
    from core import runtime
    runtime.configure()
    score = scorers(ranker())
    loads = {b: requests(b) for b in BATCHES}
    worst = check_equal(score, loads)
    print(f"one pass = per candidate: largest logit difference {worst:.1e}")
    runs = interleaved([f"{w}@{b}" for b in BATCHES for w in WAYS], args.rounds, lambda v, _: (
        timed(score[v.split("@")[0]], [r[v.split("@")[0]] for r in loads[int(v.split("@")[1])]],
              args.calls)))
    lines = table(runs)
    print("\n".join(lines))
    if SMOKE:
        return
    header = [f"# bench/hstu_ranker_scoring.py --calls {args.calls} --rounds {args.rounds}",
              run_line(uptime_before),
              f"# HSTU ranker, Amazon Books tables, histories of {LENGTH}, width "
              f"{2 * EMBEDDING}, 2 blocks, 1 head; {CANDIDATES} candidates per history; "
              f"one_pass: score_candidates; per_candidate: {CANDIDATES} (history, candidate) "
              f"rows; medians over {args.rounds} rounds of each round's median of {args.calls} "
              f"calls; largest logit difference between the two {worst:.1e}"]
    write_results(RESULTS, header + lines)


if __name__ == "__main__":
    main()
