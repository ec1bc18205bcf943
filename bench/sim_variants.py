"""Variants of this project's SIM family against its default on the same TFRecords: each
variant is extra `python -m sim.main` flags (e.g. `--architecture compact`, `--table_updates
dense`), run interleaved with the default round by round at side_by_side.sh's shape and
seeds (round r: --seed r), and summarized as the peer's summarize.py summarizes both sides
there (final test AUC; rows of the last epoch / its wall time). Prints, per model, the
median AUC and samples/s of each variant and its ratio to the default's.

  python bench/sim_variants.py --data DIR --batch 256 [--models din,dien,sim] [--rounds 2]
      [--epochs 3] [--variant compact="--architecture compact"]
      [--variant dense_tables="--table_updates dense"] [--out bench/results/sim_variants.txt]
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_vs_reference import (PEER_SCRIPTS, ROOT, SHAPE, fail, machine, median,  # noqa: E402
                              train_records, uptime)


def run(args, model: str, flags: list, seed: int, out: str, rows: int) -> tuple:
    """(test AUC, last-epoch samples/s) of one training run."""
    os.makedirs(out, exist_ok=True)
    cmd = [os.path.join(ROOT, ".venv/bin/python"), "-m", "sim.main", "--cpu", "--dataset_dir",
           args.data, "--model_type", model, "--global_batch_size", str(args.batch),
           "--epochs", str(args.epochs), "--seed", str(seed), *SHAPE, "--gsu_top_k", "50",
           "--results_dir", out, *flags]
    with open(os.path.join(out, "stdout.log"), "w") as log:
        if subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode:
            return None, None
    summary = subprocess.run([sys.executable, os.path.join(PEER_SCRIPTS, "summarize.py"),
                              "proj", os.path.join(out, "log.json"), str(rows)],
                             capture_output=True, text=True).stdout.split("\t")
    return summary[0], summary[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--models", default="din,dien,sim")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--variant", action="append", default=[],
                   help='NAME="FLAGS" (repeatable); the default runs as "default"')
    p.add_argument("--work", default="/tmp/sim_variants")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sim_variants.txt"))
    args = p.parse_args()
    if not os.path.isfile(os.path.join(args.data, "feature_spec.yaml")):
        fail(f"--data {args.data}: no feature_spec.yaml")
    variants = {"default": []}
    for item in args.variant:
        name, _, flags = item.partition("=")
        variants[name] = shlex.split(flags)
    rows = train_records(args.data)
    results = {}
    lines = [f"# sim_variants: {args.data} ({rows} training records), batch {args.batch}, "
             f"{args.rounds} rounds, {args.epochs} epochs, medians",
             f"# machine: {machine()}", f"# load before: {uptime()}",
             f"# started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"]
    for r in range(1, args.rounds + 1):
        for model in args.models.split(","):
            for name, flags in variants.items():
                got = run(args, model, flags, r, os.path.join(args.work, f"{model}_{name}_r{r}"),
                          rows)
                print(f"round {r} {model} {name}: AUC {got[0]}, samples/s {got[1]}", flush=True)
                results.setdefault((model, name), []).append(got)
    for model in args.models.split(","):
        base = median(g[1] for g in results[(model, "default")])
        for name, flags in variants.items():
            auc = median(g[0] for g in results[(model, name)])
            rate = median(g[1] for g in results[(model, name)])
            lines.append(f"{model:4s} {name:14s} AUC {auc:.4f}  samples/s {rate:9,.0f}  "
                         f"{rate / base:5.2f}x  ({' '.join(flags) or 'default flags'})")
    lines.append(f"# load after: {uptime()}")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
