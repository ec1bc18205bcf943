"""Hybrid-parallel throughput on this machine: 1 vs N processes (horovodrun, Gloo, CPU), and
the bytes rank 0 sends through all-to-all per step: computed from the placement plan and
measured by the communicator (sizes of the tensors handed to Horovod, both directions).

  .venv/bin/python bench/hybrid_throughput.py [--processes 1,2] [--batch_size 4096] [--steps 40]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core.dllog import read_log  # noqa: E402
from core.parallel.placement import make_plan  # noqa: E402


def run(processes: int, args, log: str) -> dict:
    cardinalities = ",".join([str(args.rows)] * args.tables)
    main_args = ["main.py", "--dataset_type", "synthetic", "--cpu",
                 "--synthetic_dataset_cardinalities", cardinalities,
                 "--embedding_dim", str(args.dim), "--bottom_mlp_dims", f"512,256,{args.dim}",
                 "--batch_size", str(args.batch_size), "--learning_rate", "0.1",
                 "--warmup_steps", "0", "--decay_steps", "0",
                 "--synthetic_dataset_train_batches", str(args.steps), "--print_freq",
                 str(args.steps // 4), "--synthetic_dataset_valid_batches", "1",
                 "--valid_batch_size", str(args.batch_size), "--log_path", log]
    if processes == 1:
        cmd = [sys.executable, *main_args]
    else:
        cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np",
               str(processes), "-H", f"localhost:{processes}", "--gloo", sys.executable,
               *main_args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"run with {processes} process(es) failed:\n{proc.stdout[-2000:]}\n"
                 f"{proc.stderr[-2000:]}")
    progress = [r["data"] for r in read_log(log)
                if r["type"] == "LOG" and r["step"] and "samples_per_second" in r["data"]]
    steady = progress[1:] or progress  # the first interval includes tracing
    return {"samples_per_second": sum(p["samples_per_second"] for p in steady) / len(steady),
            "alltoall_measured": (steady[-1].get("alltoall_bytes_per_step_rank0"))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(p) for p in args.processes.split(",")):
            results[n] = run(n, args, os.path.join(tmp, f"log{n}.json"))
            print(f"  {n} process(es): {results[n]['samples_per_second']:,.0f} samples/s",
                  flush=True)
    base = results[min(results)]["samples_per_second"]
    print(f"\n{args.tables} tables x {args.rows:,} x {args.dim}, global batch {args.batch_size}")
    print("processes  samples/s  vs 1 proc  all-to-all bytes/step rank 0: computed  measured")
    for n, r in sorted(results.items()):
        plan = make_plan([args.rows] * args.tables, args.dim, n)
        computed = plan.alltoall_bytes_sent(0, args.batch_size) if n > 1 else 0
        measured = r["alltoall_measured"] if n > 1 else 0
        print(f"{n:9d}  {r['samples_per_second']:9,.0f}  {r['samples_per_second'] / base:8.2f}x"
              f"  {computed:>36,d}  {measured:>9,.0f}")


if __name__ == "__main__":
    main()
