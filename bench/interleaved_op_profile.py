"""Wide & Deep's or SIM's `ours` training step (the shapes bench/compare_commits.py runs) in two
persistent processes, each its own interpreter and checkout (e.g. TensorFlow 2.17.1 and 2.21),
alternating blocks of steps, so that the load of a shared machine falls on both alike. Prints
each side's wall and CPU ms per step (medians over the blocks; CPU time moves much less with
load than wall time), or with --ops the op time per step by op type or name (the TensorFlow
profiler's, summed over executor threads; per op, its minimum over the blocks: preemption only
adds time) and the largest differences.

  .venv/bin/python bench/interleaved_op_profile.py wd|sim --a PY_A REPO_A --b PY_B REPO_B
      [--blocks 12] [--steps 2] [--ops] [--by type|name] [--top 20]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def worker(repo: str, family: str) -> None:
    """Reads 'run K' / 'ops K' lines; answers each with one JSON line."""
    out, sys.stdout = sys.stdout, sys.stderr  # the protocol's lines only on stdout
    sys.path[:0] = [repo, os.path.join(repo, "bench")]
    os.chdir(repo)
    from core import runtime
    runtime.configure()
    import tensorflow as tf
    if family == "wd":
        import wd_train_throughput as w
        from wide_and_deep.contract import embedding_dims, reference_spec
        from wide_and_deep.model import WideDeepConfig
        spec = reference_spec(0.1)
        step = w.ours(spec, WideDeepConfig.from_spec(spec, embedding_dims(spec)))
        data = w.batches(spec, 4096, 4)
        run = lambda i: step(data[i % 4], i)  # noqa: E731
    else:
        import sim_train_throughput as s
        data = [s.batch(1024, k) for k in range(4)]
        run, _ = s.ours(argparse.Namespace(model_type="sim"), data)
    from train_throughput import op_times
    i = 4
    for j in range(i):
        run(j)
    print(json.dumps({"tf": tf.__version__}), file=out, flush=True)
    for line in sys.stdin:
        command, k = line.split()
        k = int(k)
        if command == "ops":
            times = op_times(lambda _, j: run(i + j), list(range(k)), k)
            answer = {"wall": times["wall_ms"], "ops": times["ops"]}
        else:
            wall, cpu = time.perf_counter(), time.process_time()
            for j in range(k):
                run(i + j)
            answer = {"wall": 1e3 * (time.perf_counter() - wall) / k,
                      "cpu": 1e3 * (time.process_time() - cpu) / k}
        i += k + 3
        print(json.dumps(answer), file=out, flush=True)


def op_table(blocks: list, by: str) -> dict:
    names = {name for b in blocks for name in b["ops"]}
    table = {}
    for name in names:
        key = name.rsplit(":", 1)[1] if by == "type" else name
        table[key] = table.get(key, 0.0) + min(b["ops"].get(name, 0.0) for b in blocks)
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("family", choices=["wd", "sim"])
    p.add_argument("--a", nargs=2, metavar=("PYTHON", "REPO"), required=True)
    p.add_argument("--b", nargs=2, metavar=("PYTHON", "REPO"), required=True)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--steps", type=int, default=2, help="steps per block")
    p.add_argument("--ops", action="store_true", help="op times (profiler) instead of CPU")
    p.add_argument("--by", choices=["type", "name"], default="type")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    sides = [subprocess.Popen([py, HERE, args.family, "--a", py, repo, "--b", py, repo,
                               "--worker", os.path.abspath(repo), args.family],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
             for py, repo in (args.a, args.b)]
    versions = [json.loads(s.stdout.readline())["tf"] for s in sides]
    results = [[], []]
    for block in range(args.blocks):
        for j in ((0, 1) if block % 2 == 0 else (1, 0)):
            sides[j].stdin.write(f"{'ops' if args.ops else 'run'} {args.steps}\n")
            sides[j].stdin.flush()
            results[j].append(json.loads(sides[j].stdout.readline()))
    for s in sides:
        s.stdin.close()
        s.wait()
    print(f"{args.family}: A = TensorFlow {versions[0]} ({args.a[1]}), B = TensorFlow "
          f"{versions[1]} ({args.b[1]}), {args.blocks} alternating blocks of {args.steps} steps")
    for key in ("wall",) if args.ops else ("wall", "cpu"):
        a, b = (statistics.median(r[key] for r in side) for side in results)
        print(f"  {key} ms per step, median: A {a:.1f}, B {b:.1f}, B/A {b / a:.3f}")
    if args.ops:
        a, b = op_table(results[0], args.by), op_table(results[1], args.by)
        print(f"  op ms per step (each op's minimum over the blocks): A {sum(a.values()):.1f}, "
              f"B {sum(b.values()):.1f}; largest differences:")
        keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))
        for key in keys[:args.top]:
            x, y = a.get(key, 0), b.get(key, 0)
            print(f"  {x:9.2f} {y:9.2f} {y - x:+9.2f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
