"""This project's DIN, DIEN and SIM against NVIDIA's "SIM for TensorFlow 2" on the same CPU and
the same TFRecords: training through the peer's side_by_side.sh (interleaved runs, median test
AUC and median last-epoch training samples/s), then inference (`--mode inference` of both,
interleaved: samples/s and p99 latency), per model and batch size, medians over the rounds.

  bash /work/shared/peer/sim/setup_ref.sh              # once: the reference in /tmp/peer_sim
  python bench/sim_vs_reference.py --data 256=DIR --data 4096=DIR2 [--rounds 3] [--epochs 3]
      [--models din,dien,sim] [--label long] [--out bench/results/sim_vs_reference.txt]
      [--project .] [--baseline_project DIR] [--skip_training] [--skip_inference]

DIR: TFRecords written by the reference's preprocessing/parquet_to_tfrecord.py (see
sim/README.md, "Performance"). The table goes to stdout and to --out with the machine (lscpu
model name, cores) and the load (uptime before and after). Inference differs in method on
the two sides and is reported as each logs it: the reference times its whole loop over the
training data (reading included), ours times predict() on test batches already in memory.
The reference's DIN inference crashes as published (see REF_DIN_INFERENCE): it runs here with
the one offending argument dropped by the harness.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.environ.get("PEER", "/tmp/peer_sim")
PEER_SCRIPTS = os.environ.get("SIM_PEER_SCRIPTS", "/work/shared/peer/sim")
SHAPE = ("--long_seq_length 90 --embedding_dim 16 --stage_one_mlp_dims 200 --stage_two_mlp_dims "
         "200,80 --aux_mlp_dims 100,50 --optimizer adam --lr 0.01").split()
# metric names before and after the training engine's rename (either is read)
THROUGHPUT = ("mean_inference_throughput", "inference_samples_per_second")
P99_SECONDS = ("p99_inference_latency", "p99_latency_seconds")
# The reference's inference() calls model(..., compute_aux_loss=False), an argument its
# DINModel.call does not take (TypeError): for DIN the harness drops it, leaving the files as
# they are, so that DIN's inference has a reference figure at all.
REF_DIN_INFERENCE = """
from sim.models.din_model import DINModel
reference_call = DINModel.call
def call(self, inputs, training=False, compute_aux_loss=None):
    return reference_call(self, inputs, training=training)
DINModel.call = call
import main
main.main()
"""


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                  if line.startswith("Model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} logical CPUs"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def train_records(data: str) -> int:
    import yaml
    spec = yaml.safe_load(open(os.path.join(data, "feature_spec.yaml")))
    files = sorted({os.path.join(data, f) for ch in spec["source_spec"]["train"]
                    for f in ch["files"]})
    count = 0
    for path in files:  # TFRecord framing: length (8), its crc (4), data, data crc (4)
        with open(path, "rb") as f:
            while header := f.read(12):
                f.seek(int.from_bytes(header[:8], "little") + 4, 1)
                count += 1
    return count


def side_by_side(args, batch: int, data: str, out: str) -> list:
    """Rows of side_by_side.sh's results.tsv (its own progress goes to stdout)."""
    cmd = ["bash", os.path.join(PEER_SCRIPTS, "side_by_side.sh"), "--data", data,
           "--rounds", str(args.rounds), "--epochs", str(args.epochs), "--batch", str(batch),
           "--models", " ".join(args.models), "--out", out]
    subprocess.run(cmd, cwd=args.project, check=True)
    with open(os.path.join(out, "results.tsv")) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def final_record(log: str) -> dict:
    final = {}
    with open(log) as f:
        for line in f:
            line = line.strip()
            rec = json.loads(line[5:] if line.startswith("DLLL ") else line) if line else {}
            if isinstance(rec, dict) and rec.get("step") == [] and isinstance(rec.get("data"),
                                                                                  dict):
                final.update(rec["data"])
    return final


def inference_run(args, impl: str, project: str, model: str, batch: int, data: str,
                  seed: int, warmup: int, steps: int, out: str) -> tuple:
    """(samples/s, p99 latency in ms) of one `--mode inference` run."""
    os.makedirs(out, exist_ok=True)
    common = ["--mode", "inference", "--dataset_dir", data, "--model_type", model,
              "--global_batch_size", str(batch), "--seed", str(seed), *SHAPE,
              "--benchmark_warmup_steps", str(warmup), "--benchmark_steps", str(steps),
              "--results_dir", out]
    if impl == "ref":
        entry = ["-c", REF_DIN_INFERENCE] if model == "din" else ["main.py"]
        cmd = ["bash", "-c", '. "$0/refenv.sh" && cd "$REFDIR" && "$REFPY" "$@"',
               PEER, *entry, *common, "--affinity", "disabled", "--benchmark"]
        cwd = None
    else:
        cmd = [os.path.join(project, ".venv/bin/python"), "-m", "sim.main", "--cpu",
               *common, "--gsu_top_k", "50"]
        cwd = project
    with open(os.path.join(out, "stdout.log"), "w") as log:
        rc = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT).returncode
    final = final_record(os.path.join(out, "log.json")) if rc == 0 else {}
    if impl == "ref":
        return final.get("throughput"), final.get("latency_p99")
    rate = next((final[k] for k in THROUGHPUT if k in final), None)
    p99 = next((final[k] for k in P99_SECONDS if k in final), None)
    return rate, None if p99 is None else 1000 * p99


def median(values):
    values = [float(v) for v in values if v not in (None, "", "None", "nan")]
    return statistics.median(values) if values else float("nan")


def training_table(rows: list, batch: int) -> list:
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        med = {impl: (median(r["test_auc"] for r in rows if r["model"] == model
                             and r["impl"] == impl and r["rc"] == "0"),
                      median(r["train_samples_per_s"] for r in rows if r["model"] == model
                             and r["impl"] == impl and r["rc"] == "0"))
               for impl in ("ref", "proj")}
        (ar, sr), (ap, sp) = med["ref"], med["proj"]
        lines.append(f"train  {model:4s} {batch:5d}  AUC {ar:.4f} / {ap:.4f} ({ap - ar:+.4f})  "
                     f"samples/s {sr:9,.0f} / {sp:9,.0f}  {sp / sr:5.2f}x")
    return lines


def inference_table(args, batch: int, data: str, work: str) -> list:
    rows = train_records(data)
    warmup = min(5, max(rows // batch - 3, 0))
    steps = max(min(args.inference_steps, rows // batch - warmup - 1), 1)
    impls = {"ref": None, "proj": args.project}
    if args.baseline_project:
        impls["base"] = args.baseline_project
    results = {}
    for r in range(1, args.rounds + 1):
        for model in args.models:
            for impl, project in impls.items():
                got = inference_run(args, impl, project, model, batch, data, r, warmup, steps,
                                    os.path.join(work, f"infer_{impl}_{model}_b{batch}_r{r}"))
                print(f"inference round {r} {model} {impl} batch {batch}: samples/s {got[0]}, "
                      f"p99 ms {got[1]}", flush=True)
                results.setdefault((model, impl), []).append(got)
    lines = []
    for model in args.models:
        med = {impl: (median(g[0] for g in results[(model, impl)]),
                      median(g[1] for g in results[(model, impl)])) for impl in impls}
        (sr, pr), (sp, pp) = med["ref"], med["proj"]
        line = (f"infer  {model:4s} {batch:5d}  samples/s {sr:9,.0f} / {sp:9,.0f}  "
                f"{sp / sr:5.2f}x   p99 ms {pr:8.1f} / {pp:8.1f}")
        if "base" in med:
            line += f"   baseline: samples/s {med['base'][0]:9,.0f}, p99 ms {med['base'][1]:8.1f}"
        lines.append(line + ("   (reference run failed: see its stdout.log)"
                             if sr != sr else ""))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", action="append", required=True,
                   help="BATCH=DIR: a batch size and the reference-made TFRecords to use at it")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--models", default="din,dien,sim")
    p.add_argument("--inference_steps", type=int, default=40)
    p.add_argument("--label", default="", help="names the run in the results file")
    p.add_argument("--out", help="results file (default bench/results/sim_vs_reference"
                                 "[_LABEL].txt)")
    p.add_argument("--project", default=ROOT, help="checkout of this project to measure")
    p.add_argument("--baseline_project", help="inference only: another checkout (e.g. the "
                                              "code before a change) measured in the same rounds")
    p.add_argument("--work", default=os.path.join(PEER, "sim_vs_reference"))
    p.add_argument("--skip_training", action="store_true")
    p.add_argument("--skip_inference", action="store_true")
    args = p.parse_args()
    args.models = args.models.split(",")
    if not os.path.isfile(os.path.join(PEER, "refenv.sh")):
        fail(f"the reference is not set up ({PEER}/refenv.sh missing): run "
             f"bash {PEER_SCRIPTS}/setup_ref.sh from the project root first")
    if not os.path.isfile(os.path.join(PEER_SCRIPTS, "side_by_side.sh")):
        fail(f"no side_by_side.sh in {PEER_SCRIPTS} (set SIM_PEER_SCRIPTS)")
    runs = []
    for item in args.data:
        batch, _, data = item.partition("=")
        if not batch.isdigit() or not os.path.isfile(os.path.join(data, "feature_spec.yaml")):
            fail(f"--data {item}: expected BATCH=DIR with DIR/feature_spec.yaml")
        runs.append((int(batch), data))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.project,
                            capture_output=True, text=True).stdout.strip()
    header = [f"# sim_vs_reference {args.label}: project {args.project} at {commit}, "
              f"{args.rounds} rounds, {args.epochs} epochs, medians",
              f"# machine: {machine()}", f"# load before: {uptime()}",
              f"# started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"]
    lines = []
    for batch, data in runs:
        lines.append(f"# batch {batch}: {data} ({train_records(data)} training records)")
        if not args.skip_training:
            rows = side_by_side(args, batch, data, os.path.join(args.work, f"train_b{batch}"))
            lines += training_table(rows, batch)
        if not args.skip_inference:
            lines += inference_table(args, batch, data, args.work)
    legend = ["# columns: reference / ours; speed-up = ours / reference",
              f"# load after: {uptime()}"]
    text = "\n".join(header + lines + legend) + "\n"
    print(text)
    out = args.out or os.path.join(ROOT, "bench", "results", "sim_vs_reference" +
                                   (f"_{args.label}" if args.label else "") + ".txt")
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
