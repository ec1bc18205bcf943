"""Training (and DLRM inference) samples/s of two commits, interleaved: each round runs every
family's benchmark once in a checkout of BEFORE and once in one of AFTER (alternating which
goes first), then prints the per-round figures, the medians and after/before.

  .venv/bin/python bench/compare_commits.py BEFORE AFTER [--rounds 3]
      [--families dlrm,dlrm_inference,wd,sim] [--before_python P] [--after_python P]

The checkouts are git worktrees under --workdir (kept for reuse). Each side runs under its
own interpreter (this one unless --before_python/--after_python name another: a commit that
changes the pinned TensorFlow is measured under each side's own .venv). Each figure is the
samples/s the family's own benchmark reports for its `ours` variant (dlrm_inference: DLRM's
forward pass, bench/train_throughput.py's `ours_inference` worker).
"""
from __future__ import annotations

import argparse
import os
import json
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# family -> (benchmark command in a checkout, the key of its figure in the JSON line the
# benchmark's worker prints last; None: the line is the figure)
BENCHES = {
    "dlrm": (["bench/train_throughput.py", "--worker", "ours", "--batch_sizes", "2048",
              "--steps", "10"], None),  # its worker prints the bare figure
    "dlrm_inference": (["bench/train_throughput.py", "--worker", "ours_inference",
                        "--batch_sizes", "2048", "--steps", "30"], None),
    "wd": (["bench/wd_train_throughput.py", "--variant", "ours", "--batch_size", "4096",
            "--steps", "4", "--warmup", "2", "--scale", "0.1"], "samples_per_second"),
    "sim": (["bench/sim_train_throughput.py", "--variant", "ours", "--steps", "10", "--warmup",
             "3", "--inference_steps", "20"], "train_samples_per_second"),
}


def checkout(commit: str, workdir: str, python: str) -> str:
    """A worktree of the commit with its own CPU kernels built (build/ is not in git: without
    them a checkout would measure the TensorFlow-op path of every kernel)."""
    path = os.path.join(workdir, commit)
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, commit],
                       check=True, capture_output=True)
    if os.path.isfile(os.path.join(path, "core", "fused_ops.py")):
        done = subprocess.run([python, "-m", "core.fused_ops", "--build"], cwd=path,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: building the kernels of {commit} in {path} failed: "
                             f"{done.stderr.strip().splitlines()[-1:]}")
    return path


def measure(tree: str, family: str, python: str) -> float:
    command, key = BENCHES[family]
    done = subprocess.run([python, *command], cwd=tree, capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"error: {family} benchmark failed in {tree}: "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    try:
        figure = json.loads(done.stdout.strip().splitlines()[-1])
        return float(figure if key is None else figure[key])
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"error: no '{key}' in the last line of the {family} benchmark's "
                         f"output in {tree}: {done.stdout[-300:]!r}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--families", default=",".join(BENCHES))
    p.add_argument("--before_python", default=sys.executable,
                   help="the interpreter of BEFORE's runs (default: this one)")
    p.add_argument("--after_python", default=sys.executable,
                   help="the interpreter of AFTER's runs (default: this one)")
    p.add_argument("--workdir", default="/tmp/compare_commits")
    args = p.parse_args()
    families = args.families.split(",")
    unknown = [f for f in families if f not in BENCHES]
    if unknown:
        raise SystemExit(f"error: --families: unknown {unknown}, expected some of "
                         f"{list(BENCHES)}")
    pythons = {"before": args.before_python, "after": args.after_python}
    trees = {side: checkout(commit, args.workdir, pythons[side])
             for side, commit in (("before", args.before), ("after", args.after))}
    figures = {(f, side): [] for f in families for side in trees}
    for r in range(args.rounds):
        for family in families:
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                figures[family, side].append(measure(trees[side], family, pythons[side]))
                print(f"round {r + 1} {family:14s} {side:6s} {figures[family, side][-1]:,.0f}",
                      flush=True)
    print(f"\n{args.before} -> {args.after}, {args.rounds} interleaved rounds, samples/s")
    for family in families:
        medians = {side: statistics.median(figures[family, side]) for side in trees}
        for side in trees:
            print(f"{family:14s} {side:6s} {', '.join(f'{v:,.0f}' for v in figures[family, side])}"
                  f"  median {medians[side]:,.0f}")
        print(f"{family:14s} after/before {medians['after'] / medians['before']:.2f}x")


if __name__ == "__main__":
    main()
