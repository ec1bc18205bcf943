"""Hybrid-parallel throughput on this machine: 1 vs N processes (horovodrun, Gloo, CPU) for
table-wise, row-wise and column-wise placements of the same model, interleaved rounds,
medians; and the bytes rank 0 sends through all-to-all per step: computed from the placement
plan and measured by the communicator (sizes of the tensors handed to Horovod, both
directions).

  .venv/bin/python bench/hybrid_throughput.py [--processes 1,2] [--shardings table_wise,row_wise,column_wise]
      [--batch_size 4096] [--steps 40] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core.dllog import read_log  # noqa: E402
from core.parallel.placement import local_rows, make_plan  # noqa: E402


def run(processes: int, sharding: str, args, log: str) -> dict:
    cardinalities = ",".join([str(args.rows)] * args.tables)
    main_args = ["main.py", "--dataset_type", "synthetic", "--cpu",
                 "--synthetic_dataset_cardinalities", cardinalities,
                 "--synthetic_dataset_power_law_alpha", "1.0",  # uniform ids, as the plan assumes
                 "--embedding_dim", str(args.dim), "--bottom_mlp_dims", f"512,256,{args.dim}",
                 "--batch_size", str(args.batch_size), "--learning_rate", "0.1",
                 "--warmup_steps", "0", "--decay_steps", "0", "--sharding", sharding,
                 "--synthetic_dataset_train_batches", str(args.steps), "--print_freq",
                 str(max(args.steps // 4, 1)), "--synthetic_dataset_valid_batches", "1",
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
        sys.exit(f"error: run with {processes} process(es), {sharding}, failed:\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    progress = [r["data"] for r in read_log(log)
                if r["type"] == "LOG" and r["step"] and "samples_per_second" in r["data"]]
    steady = progress[1:] or progress  # the first interval includes tracing
    return {"samples_per_second": statistics.median(p["samples_per_second"] for p in steady),
            "alltoall_measured": steady[-1].get("alltoall_bytes_per_step_rank0", 0)}


def computed_bytes(plan, batch: int) -> float:
    """Bytes rank 0 sends per step by the plan: the vector all-to-all of table and column
    pieces, and for row-wise tables its rows' ids asked elsewhere (id and gradient) plus the
    vectors others ask of its rows, with ids uniform over the rows."""
    sent = plan.alltoall_bytes_sent(0, batch) if plan.world_size > 1 else 0
    row_bytes = plan.dim * 4
    for t in plan.row_wise:
        rows, mine = plan.cardinalities[t], plan.pieces_of(t)[0].row_count
        asked_away = local_rows(batch, 0, plan.world_size) * (rows - mine) / rows
        asked_here = (batch - local_rows(batch, 0, plan.world_size)) * mine / rows
        sent += asked_away * (8 + row_bytes) + asked_here * row_bytes
    return sent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--shardings", default="table_wise,row_wise,column_wise")
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    worlds = [int(p) for p in args.processes.split(",")]
    shardings = args.shardings.split(",")
    cases = [(1, "table_wise")] if 1 in worlds else []
    cases += [(n, s) for n in worlds if n > 1 for s in shardings]
    results = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):  # interleaved: load drifts hit every case alike
            for n, sharding in cases:
                r = run(n, sharding, args, os.path.join(tmp, f"log_{n}_{sharding}.json"))
                results[(n, sharding)].append(r)
                print(f"  round {round_ + 1}: {n} process(es) {sharding}: "
                      f"{r['samples_per_second']:,.0f} samples/s", flush=True)
    base = statistics.median(r["samples_per_second"] for r in results[cases[0]])
    print(f"\n{args.tables} tables x {args.rows:,} x {args.dim}, global batch {args.batch_size}, "
          f"medians of {args.rounds} interleaved rounds")
    print("processes  sharding     samples/s  vs 1 proc  all-to-all bytes/step rank 0: "
          "computed  measured")
    for (n, sharding), runs in results.items():
        speed = statistics.median(r["samples_per_second"] for r in runs)
        plan = make_plan([args.rows] * args.tables, args.dim, n, sharding=sharding)
        print(f"{n:9d}  {sharding:<11}  {speed:9,.0f}  {speed / base:8.2f}x  "
              f"{computed_bytes(plan, args.batch_size):>33,.0f}  "
              f"{runs[-1]['alltoall_measured']:>9,.0f}")


if __name__ == "__main__":
    main()
