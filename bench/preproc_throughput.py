"""Criteo preprocessing throughput: Spark pipeline next to the in-process engine (polars).

  .venv/bin/python bench/preproc_throughput.py [--lines 1210000] [--cores 2] \
      [--baseline_commit REV] [--workdir DIR] [--json PATH]

1. Day files made of the real Criteo rows (shared/data/criteo: head10k + scattered, 14,949
   rows) repeated until --lines, cut into --days equal day files.
2. preproc/prepare_dataset.sh CPU <T> with each engine, one after the other on the same input:
   `spark` (local[--cores]) and `local` (polars in one process); with --baseline_commit also
   the Spark pipeline of that commit (from `git archive`), to get before/after in one run.
3. Per run: lines/s of every stage (lines / stage seconds), of the whole run with and without
   Spark's start-up, and the peak RSS of the process tree (driver + JVM). Checks that the
   engines' datasets are byte-identical (the baseline's too, which differ only where the
   rules changed since).

Set-up: polars comes from requirements.txt; when the interpreter lacks it, it is installed
once into build/bench_deps (never into the virtualenv) and put on the runs' PYTHONPATH.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPS = os.path.join(ROOT, "build", "bench_deps")
DATA = next((d for d in (os.path.join(ROOT, "shared", "data", "criteo"),
                         os.path.join(os.path.dirname(ROOT), "shared", "data", "criteo"),
                         "/work/shared/data/criteo") if os.path.isdir(d)),
            "/work/shared/data/criteo")
REAL_FILES = ("kaggle_train_head10k.txt", "kaggle_train_scattered.txt")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=1_210_000,
                   help="at least this many lines in all (whole copies of the real rows)")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--frequency_threshold", type=int, default=3)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--memory", default="4g", help="Spark driver memory")
    p.add_argument("--engines", default="spark,local")
    p.add_argument("--baseline_commit", default=None,
                   help="also time the Spark pipeline of this git commit")
    p.add_argument("--data_dir", default=DATA)
    p.add_argument("--workdir", default=None, help="default: a temporary directory, removed")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def polars_path() -> str:
    """'' when the interpreter has polars, else build/bench_deps (installed on first use)."""
    probe = subprocess.run([sys.executable, "-c", "import polars"], capture_output=True)
    if probe.returncode == 0:
        return ""
    pin = next(line.strip() for line in open(os.path.join(ROOT, "requirements.txt"))
               if line.startswith("polars=="))
    probe = subprocess.run([sys.executable, "-c", "import polars"], capture_output=True,
                           env=dict(os.environ, PYTHONPATH=DEPS))
    if probe.returncode != 0:
        print(f"[bench] installing {pin} into {DEPS}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", DEPS,
                        pin], check=True)
    return DEPS


def make_days(data_dir: str, directory: str, lines: int, days: int) -> int:
    real = []
    for name in REAL_FILES:
        with open(os.path.join(data_dir, name), "rb") as f:
            real += f.read().split(b"\n")[:-1]
    rows = real * math.ceil(lines / len(real))
    bounds = [len(rows) * d // days for d in range(days + 1)]
    os.makedirs(directory, exist_ok=True)
    for d in range(days):
        with open(os.path.join(directory, f"day_{d}"), "wb") as f:
            f.write(b"\n".join(rows[bounds[d]:bounds[d + 1]]) + b"\n")
    return len(rows)


def run_measured(cmd: list, env: dict, log_path: str) -> tuple:
    """Run cmd; returns (seconds, CPU seconds, peak RSS in MiB) of its process tree, sampled
    every 0.1 s. CPU seconds matter on a shared machine, where wall time also counts the
    neighbours' work."""
    started, peak, cpu = time.time(), 0, {}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            rss = 0
            try:
                for p in [root] + root.children(recursive=True):
                    with p.oneshot():
                        rss += p.memory_info().rss
                        cpu[p.pid] = sum(p.cpu_times()[:2])
            except psutil.Error:
                pass
            peak = max(peak, rss)
            time.sleep(0.1)
    if proc.returncode != 0:
        with open(log_path) as f:
            raise SystemExit(f"[bench] {' '.join(cmd[:3])} failed:\n{f.read()[-3000:]}")
    return time.time() - started, sum(cpu.values()), peak / 2 ** 20


def tree_digest(directory: str) -> str:
    h = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(directory)):
        dirs.sort()
        for name in sorted(files):
            with open(os.path.join(base, name), "rb") as f:
                h.update(os.path.relpath(os.path.join(base, name), directory).encode())
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def baseline_checkout(commit: str, directory: str) -> str:
    """The preproc/ of `commit` (with the modules it imports) in directory; its script."""
    os.makedirs(directory, exist_ok=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "preproc", "datasets.py",
                              "feature_spec.py", "progress.py"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    return os.path.join(directory, "preproc", "prepare_dataset.sh")


def run_engine(name: str, script: str, args, work: str, env: dict) -> dict:
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    run_env = dict(env, spark_output_path=os.path.join(out, "spark"),
                   conversion_intermediate_dir=os.path.join(out, "intermediate"),
                   final_output_dir=os.path.join(out, "dataset"))
    engine = [] if name.startswith("spark") else ["--engine", "local"]
    print(f"[bench] {name} ...", flush=True)
    seconds, cpu, peak = run_measured(["bash", script, "CPU", str(args.frequency_threshold),
                                  *engine], run_env, os.path.join(work, f"{name}.log"))
    with open(os.path.join(out, "spark", "summary.json")) as f:
        summary = json.load(f)
    result = {"name": name, "wall_s": round(seconds, 2), "cpu_s": round(cpu, 1),
              "peak_rss_mib": round(peak),
              "stages_s": summary["seconds"], "lines": summary["lines"],
              "digest": tree_digest(run_env["final_output_dir"])}
    shutil.rmtree(out)  # the next run gets the disk and the page cache
    return result


def table(results: list, lines: int) -> str:
    stages = ["spark_start", "parse", "positions", "dictionaries", "apply", "convert"]
    local = next((r for r in results if r["name"] == "local"), None)
    head = ["run"] + [f"{s} l/s" for s in stages[1:]] + ["total l/s", "w/o start l/s",
                                                          "vs local", "CPU s", "peak RSS MiB"]
    rows = [head]
    for r in results:
        sec = r["stages_s"]
        start = sec.get("spark_start", 0.0)
        work = sum(v for k, v in sec.items() if k != "spark_start")
        rate = lines / r["wall_s"]
        rows.append([r["name"]] + [f"{lines / sec[s]:,.0f}" if sec.get(s) else "-"
                                   for s in stages[1:]]
                    + [f"{rate:,.0f}", f"{lines / max(r['wall_s'] - start, 1e-9):,.0f}",
                       f"{rate / (lines / local['wall_s']):.2f}" if local else "-",
                       f"{r['cpu_s']:.0f}", f"{r['peak_rss_mib']:,}"])
        rows[-1][0] += f" ({r['wall_s']:.1f} s, start {start:.1f} s, stages {work:.1f} s)"
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def main():
    args = parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="preproc_bench_")
    try:
        env = dict(os.environ, TOTAL_CORES=str(args.cores), TOTAL_MEMORY=args.memory,
                   PYTHON=sys.executable, SPARK_LOG_LEVEL="ERROR",
                   download_dir=os.path.join(work, "raw"))
        deps = polars_path()
        if deps:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (deps, env.get("PYTHONPATH")) if p)
        lines = make_days(args.data_dir, env["download_dir"], args.lines, args.days)
        print(f"[bench] {lines:,} lines in {args.days} day files, threshold "
              f"{args.frequency_threshold}, {args.cores} cores", flush=True)
        runs = [(name, os.path.join(ROOT, "preproc", "prepare_dataset.sh"))
                for name in args.engines.split(",")]
        if args.baseline_commit:
            runs.insert(0, (f"spark@{args.baseline_commit[:10]}",
                            baseline_checkout(args.baseline_commit,
                                              os.path.join(work, "baseline"))))
        results = [run_engine(name, script, args, work, env) for name, script in runs]
        print(table(results, lines))
        digests = {r["name"]: r["digest"] for r in results}
        same = {name: d == digests.get("spark") for name, d in digests.items()}
        print(f"[bench] byte-identical to spark's dataset: {same}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"lines": lines, "cores": args.cores, "results": results,
                           "identical_to_spark": same}, f, indent=1)
        if not all(v for k, v in same.items() if not k.startswith("spark@")):
            raise SystemExit("[bench] the engines' datasets differ")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
