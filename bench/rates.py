"""What the training benchmarks share: the machine's matmul peak in float32 and bfloat16
(measured in its own process, under the toolkit's TensorFlow settings), a step's rate as a
fraction of the peak at its dtype, interleaved rounds of variants with their medians, and
the results file's run line (date, commit, TensorFlow, machine, load) and atomic write.

A variant whose name ends in `_bf16` computes in bfloat16; every other one in float32.

  .venv/bin/python bench/rates.py   # prints the peaks: {"float32": GFLOP/s, "bfloat16": ...}
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# BENCH_SMOKE=1 runs a bench at toy size (its workers inherit it): CI runs the READMEs'
# bench commands so (tests/test_bench_commands.py); the figures then mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE") == "1"
PEAK_SIZE = 128 if SMOKE else 4096
PEAK = "matmul_peak"  # interleaved(): the round's matmul peaks


def dtype_of(variant: str) -> str:
    return "bfloat16" if variant.endswith("_bf16") else "float32"


def matmul_peaks(size: int = PEAK_SIZE, repeats: int = 4, trials: int = 3) -> dict:
    """GFLOP/s of a chain of size^2 x size^2 matmuls in float32 and bfloat16 (TensorFlow,
    oneDNN), the fastest of `trials` (other load only slows it); each product feeds the
    next, so no two are the same computation to merge."""
    import tensorflow as tf
    peaks = {}
    for dtype in (tf.float32, tf.bfloat16):
        a = tf.cast(tf.random.normal([size, size]), dtype)
        b = tf.cast(tf.random.normal([size, size]) / size ** 0.5, dtype)  # keeps the scale

        @tf.function
        def chain(x, b):
            for _ in range(repeats):
                x = tf.matmul(x, b)
            return x
        chain(a, b).numpy()
        seconds = []
        for _ in range(trials):
            start = time.perf_counter()
            chain(a, b).numpy()
            seconds.append(time.perf_counter() - start)
        peaks[dtype.name] = 2 * size ** 3 * repeats / min(seconds) / 1e9
    return peaks


def measure_peaks() -> dict:
    """matmul_peaks() in a process of its own (no other variant's threads or memory)."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(f"error: the matmul peak measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_header(peaks: dict, flop_per_sample: float) -> str:
    return (f"matmul peak ({PEAK_SIZE}^2, this machine, its own process): float32 "
            f"{peaks['float32']:,.0f} GFLOP/s, bfloat16 {peaks['bfloat16']:,.0f} GFLOP/s; "
            f"step = {flop_per_sample / 1e6:.1f} MFLOP per sample (forward + backward)")


def peak_fraction(samples_per_second: float, flop_per_sample: float, peaks: dict,
                  dtype: str) -> str:
    rate = samples_per_second * flop_per_sample / 1e9
    return f"{rate:7,.0f} GFLOP/s = {100 * rate / peaks[dtype]:5.1f}% of the {dtype} peak"


def interleaved(variants: list, rounds: int, run, peak: bool = False) -> list:
    """[{variant: run(variant, round)} per round], the variants in the given order; peak: each
    round also measures the matmul peaks (under PEAK), in the rotation like a variant. The
    order rotates each round, so that no variant always runs first (after a quiet spell)
    and a change in the machine's load falls on all of them."""
    names = list(variants) + ([PEAK] if peak else [])
    results = []
    for round_ in range(rounds):
        shift = round_ % len(names)
        done = {v: measured_peaks(round_) if v == PEAK else run(v, round_)
                for v in names[shift:] + names[:shift]}
        results.append({v: done[v] for v in names})
    return results


def measured_peaks(round_: int) -> dict:
    peaks = measure_peaks()
    print(f"round {round_}: matmul peak float32 {peaks['float32']:,.0f} GFLOP/s, bfloat16 "
          f"{peaks['bfloat16']:,.0f} GFLOP/s", flush=True)
    return peaks


def medians(results: list, figure) -> dict:
    """{variant: median of figure(result) over the rounds of interleaved()}."""
    return {v: statistics.median(figure(r[v]) for r in results) for v in results[0]
            if v != PEAK}


def report_amp(results: list, figure, flop_per_sample: float) -> None:
    """The --amp comparison from interleaved(..., peak=True) rounds of ours, ours_amp_bf16,
    keras and keras_bf16 (figure: a result's training samples/s): bfloat16 / float32 of each
    implementation, ours / its Keras twin at each dtype (taken within each round, where runs
    close in time share the machine's load, then their median over the rounds and range),
    and each variant's best step as a fraction of the best matmul peak at its dtype."""
    rates = medians(results, figure)
    print(f"\nmedians over {len(results)} interleaved round(s), training samples/s: " +
          ", ".join(f"{v} {s:,.0f}" for v, s in rates.items()))

    def spread(values) -> str:
        return (f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)"
                if len(values) > 1 else f"{values[0]:.2f}x")

    def ratio(a, b) -> str:
        return spread([figure(r[a]) / figure(r[b]) for r in results])
    print(f"  bfloat16 / float32: ours {ratio('ours_amp_bf16', 'ours')}, Keras twin "
          f"{ratio('keras_bf16', 'keras')}")
    print(f"  ours / Keras twin: float32 {ratio('ours', 'keras')}, bfloat16 "
          f"{ratio('ours_amp_bf16', 'keras_bf16')}")
    # the machine is shared: load only slows a run down, so the best of the rounds (step
    # and peak alike) is the closest to what the machine does alone
    peaks = {dtype: max(r[PEAK][dtype] for r in results) for dtype in ("float32", "bfloat16")}
    print(peak_header(peaks, flop_per_sample) + f" (best of {len(results)} rounds)")
    for variant in rates:
        best = max(figure(r[variant]) for r in results)
        print(f"  {variant:14s} best {best:9,.0f} samples/s: " +
              peak_fraction(best, flop_per_sample, peaks, dtype_of(variant)))


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from core import runtime
    runtime.configure()  # the toolkit's settings (oneDNN on), as `ours` runs with
    print(json.dumps(matmul_peaks()))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_name() -> str:
    """/proc/cpuinfo's model name without the trademark marks ("Intel Xeon Processor")."""
    with open("/proc/cpuinfo") as f:
        name = next((line.split(":", 1)[1] for line in f if line.startswith("model name")),
                    "unknown CPU")
    return " ".join(re.sub(r"\((R|TM)\)", "", name).split())


def run_line(uptime_before: str) -> str:
    """`# date, commit, TensorFlow, CPU name, vCPUs (its bf16 kind); load before and now`."""
    import datetime
    import tensorflow as tf

    def shell(command):
        return subprocess.run(command, shell=True, cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    cpu = shell("grep -o -m1 'amx_bf16\\|avx512_bf16' /proc/cpuinfo") or "AVX2 only"
    return (f"# {datetime.date.today()}, commit {shell('git rev-parse --short HEAD')}, "
            f"TensorFlow {tf.__version__}, {cpu_name()}, {os.cpu_count()} vCPUs ({cpu}); load "
            f"before: {uptime_before}; after: {uptime()}")


def write_results(path: str, lines: list) -> None:
    """Replaces path whole (a failed write leaves the previous figures)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
