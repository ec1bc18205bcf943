"""Real Criteo rows end to end: preprocessing throughput, then DLRM vs logistic regression AUC.

  .venv/bin/python bench/criteo_real_auc.py [--workdir DIR] [--frequency_threshold 2] ...

1. Days from the real sample rows (shared/data/criteo): day_0 = kaggle_train_scattered.txt
   (4,949 rows), day_1 = head10k lines 1-6000, day_2 = head10k lines 6001-10000. Days 0-1 are
   the training set; day_2's first half is the validation set, its second half the test set.
2. preproc/prepare_dataset.sh CPU <T> with Spark local[1] and local[2]; prints rows/s of
   each (whole run including the Spark start, and the pipeline stages alone) and checks that
   both give byte-identical datasets.
3. main.py --mode train for one epoch on the dataset (evaluated on the test set; the final
   `auc` of its DLLogger log), and in the same run a scikit-learn LogisticRegression on the
   same split: the transformed numerical features + one-hot of the categorical ids, its C
   chosen on the validation set. Prints both test AUCs and their difference.
4. --amp: the same DLRM run (same seed, same steps) again with --amp forced to bfloat16
   (DLRM_CPU_AMP=bfloat16, on any CPU); prints both test AUCs and bfloat16 - float32.

These samples are tiny (about 11k training rows): the AUCs say that the real-data path works
end to end, not how DLRM compares on the full Criteo data.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from core import runtime  # noqa: E402

DEFAULT_DATA = next((d for d in (os.path.join(ROOT, "shared", "data", "criteo"),
                                 os.path.join(os.path.dirname(ROOT), "shared", "data", "criteo"),
                                 "/work/shared/data/criteo") if os.path.isdir(d)),
                    "/work/shared/data/criteo")


def add_dlrm_arguments(p) -> None:
    """The DLRM training flags dlrm() reads (shared with bench/criteo_one_pass.py)."""
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--bottom_mlp_dims", default="64,32,16")
    p.add_argument("--top_mlp_dims", default="64,32,1")
    p.add_argument("--learning_rate", type=float, default=0.001)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=DEFAULT_DATA)
    p.add_argument("--workdir", default=None, help="default: a temporary directory, removed")
    p.add_argument("--frequency_threshold", type=int, default=2)
    p.add_argument("--cores", default="1,2", help="Spark core counts to time")
    p.add_argument("--memory", default="2g")
    add_dlrm_arguments(p)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--skip_dlrm", action="store_true", help="only preprocessing and LR")
    p.add_argument("--amp", action="store_true",
                   help="also train DLRM with --amp in bfloat16 and compare the test AUCs")
    p.add_argument("--throughput_copies", type=int, default=0,
                   help="also time preprocessing on day files holding the real lines this many "
                        "times over (throughput only; 0: off)")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def read_lines(path):
    with open(path) as f:
        return f.read().split("\n")[:-1]


def make_days(data_dir, raw_dir, copies=1):
    head = read_lines(os.path.join(data_dir, "kaggle_train_head10k.txt"))
    scattered = read_lines(os.path.join(data_dir, "kaggle_train_scattered.txt"))
    days = [scattered, head[:6000], head[6000:]]
    os.makedirs(raw_dir, exist_ok=True)
    for d, lines in enumerate(days):
        with open(os.path.join(raw_dir, f"day_{d}"), "w") as f:
            for _ in range(copies):
                f.write("\n".join(lines) + "\n")
    return sum(len(d) for d in days) * copies


def digest(directory):
    h = hashlib.sha256()
    for base, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            with open(os.path.join(base, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


def preprocess(work, cores, threshold, memory, raw="raw"):
    tag = f"{raw}_cores{cores}"
    env = dict(os.environ, download_dir=os.path.join(work, raw),
               spark_output_path=os.path.join(work, tag, "spark"),
               conversion_intermediate_dir=os.path.join(work, tag, "intermediate"),
               final_output_dir=os.path.join(work, tag, "dataset"),
               TOTAL_CORES=str(cores), TOTAL_MEMORY=memory, SPARK_LOG_LEVEL="ERROR",
               PYTHON=sys.executable)
    load_before = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.run(["bash", os.path.join(ROOT, "preproc", "prepare_dataset.sh"), "CPU",
                           str(threshold)], env=env, capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"preprocessing failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    with open(os.path.join(env["spark_output_path"], "summary.json")) as f:
        summary = json.load(f)
    stages = sum(v for k, v in summary["seconds"].items() if k != "spark_start")
    return {"cores": cores, "lines": summary["lines"], "wall_s": round(wall, 2),
            "stages_s": round(stages, 2), "lines_per_s": round(summary["lines"] / wall, 1),
            "lines_per_s_stages": round(summary["lines"] / stages, 1),
            "seconds": summary["seconds"], "rows": summary["rows"],
            "cardinalities": summary["cardinalities"],
            "dataset": env["final_output_dir"], "digest": digest(env["final_output_dir"]),
            # the machine's 1-minute load average before and after: other work on the same
            # cores makes the core-count comparison meaningless when it is high
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def load_split(dataset, mapping):
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(dataset, "feature_spec.yaml"))
    files = spec.feature_files(mapping)
    numerical = np.fromfile(files["numerical"], dtype=np.float16).reshape(-1, 13)
    label = np.fromfile(files["label"], dtype=spec.dtype(spec.label_feature))
    categorical = [np.fromfile(path, dtype=spec.dtype(name)) for name, path in
                   zip(spec.categorical_features, files["categorical"])]
    return numerical.astype(np.float32), categorical, label.astype(np.int64), spec.cardinalities


def logistic_regression(dataset, seed):
    """Test AUC of LogisticRegression on numerical + one-hot ids; C chosen on validation."""
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    def design(mapping):
        numerical, categorical, label, cards = load_split(dataset, mapping)
        offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
        cols = np.stack([c.astype(np.int64) + o for c, o in zip(categorical, offsets)], 1)
        rows = np.repeat(np.arange(len(label)), cols.shape[1])
        onehot = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols.ravel())),
                               shape=(len(label), int(sum(cards))))
        return sp.hstack([sp.csr_matrix(numerical), onehot]).tocsr(), label

    x_train, y_train = design("train")
    x_valid, y_valid = design("validation")
    x_test, y_test = design("test")
    start = time.time()
    best = None
    for c in (0.01, 0.03, 0.1, 0.3, 1.0):
        model = LogisticRegression(C=c, max_iter=5000, solver="lbfgs", random_state=seed)
        model.fit(x_train, y_train)
        auc = roc_auc_score(y_valid, model.predict_proba(x_valid)[:, 1])
        if best is None or auc > best[0]:
            best = (auc, c, model)
    valid_auc, c, model = best
    test_auc = roc_auc_score(y_test, model.predict_proba(x_test)[:, 1])
    return {"test_auc": float(test_auc), "validation_auc": float(valid_auc), "C": c,
            "features": int(x_train.shape[1]), "train_rows": int(x_train.shape[0]),
            "test_rows": int(x_test.shape[0]), "seconds": round(time.time() - start, 1)}


def dlrm(dataset, work, args, amp=False):
    """main.py's final test AUC; amp: with --amp, in bfloat16 whatever the CPU."""
    log_path = os.path.join(work, "dlrm_log.json")
    if os.path.exists(log_path):
        os.remove(log_path)
    command = [sys.executable, os.path.join(ROOT, "main.py"), "--dataset_path", dataset,
               "--mode", "train", "--epochs", "1", "--batch_size", str(args.batch_size),
               "--embedding_dim", str(args.embedding_dim),
               "--bottom_mlp_dims", args.bottom_mlp_dims, "--top_mlp_dims", args.top_mlp_dims,
               "--learning_rate", str(args.learning_rate), "--optimizer", "adam",
               "--warmup_steps", "0", "--decay_steps", "0", "--seed", str(args.seed),
               "--log_path", log_path, "--cpu"] + (["--amp"] if amp else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if amp:
        env[runtime.CPU_AMP_VARIABLE] = "bfloat16"
    start = time.time()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"main.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    final = None
    with open(log_path) as f:
        for line in f:
            if line.startswith("DLLL "):
                record = json.loads(line[5:])
                if isinstance(record.get("data"), dict) and "auc" in record["data"]:
                    final = record["data"]  # the last one is the final evaluation
    if final is None:
        sys.exit(f"no auc in {log_path}")
    return {"test_auc": float(final["auc"]), "train_loss": float(final["train_loss"]),
            "seconds": round(seconds, 1), "command": " ".join(command[1:])}


def main():
    args = parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="criteo_real_auc.")
    os.makedirs(work, exist_ok=True)
    try:
        lines = make_days(args.data_dir, os.path.join(work, "raw"))
        print(f"[bench] {lines} real lines -> day_0 (scattered 4949), day_1 (head 1-6000), "
              f"day_2 (head 6001-10000; validation | test)", flush=True)
        runs = []
        for cores in [int(c) for c in args.cores.split(",")]:
            r = preprocess(work, cores, args.frequency_threshold, args.memory)
            runs.append(r)
            print(f"[bench] preprocessing local[{cores}]: {r['lines']} lines, {r['wall_s']} s "
                  f"wall ({r['lines_per_s']} rows/s incl. Spark start), stages "
                  f"{r['stages_s']} s ({r['lines_per_s_stages']} rows/s); per stage "
                  f"{r['seconds']}; load average before/after {r['load']}", flush=True)
        throughput = []
        if args.throughput_copies > 0:
            n = make_days(args.data_dir, os.path.join(work, "raw_copies"), args.throughput_copies)
            for cores in [int(c) for c in args.cores.split(",")]:
                r = preprocess(work, cores, args.frequency_threshold, args.memory, "raw_copies")
                throughput.append(r)
                print(f"[bench] preprocessing {n} lines ({args.throughput_copies} copies) "
                      f"local[{cores}]: {r['wall_s']} s wall ({r['lines_per_s']} rows/s incl. "
                      f"Spark start), stages {r['stages_s']} s ({r['lines_per_s_stages']} "
                      f"rows/s); per stage {r['seconds']}; load average before/after "
                      f"{r['load']}", flush=True)
                shutil.rmtree(os.path.join(work, f"raw_copies_cores{cores}"), ignore_errors=True)
        identical = len({r["digest"] for r in runs}) == 1
        masters = ", ".join(f"local[{r['cores']}]" for r in runs)
        print(f"[bench] datasets from {masters} byte-identical: {identical}", flush=True)
        dataset = runs[-1]["dataset"]
        print(f"[bench] rows {runs[-1]['rows']}, frequency threshold {args.frequency_threshold},"
              f" cardinalities {runs[-1]['cardinalities']}", flush=True)

        lr = logistic_regression(dataset, args.seed)
        print(f"[bench] logistic regression: test AUC {lr['test_auc']:.4f} (C={lr['C']} chosen "
              f"on validation, validation AUC {lr['validation_auc']:.4f}; {lr['features']} "
              f"features, {lr['seconds']} s)", flush=True)
        result = {"preprocessing": [{k: v for k, v in r.items() if k != "dataset"}
                                    for r in runs],
                  "throughput_copies": [{k: v for k, v in r.items() if k != "dataset"}
                                        for r in throughput],
                  "identical_across_cores": identical, "logistic_regression": lr,
                  "frequency_threshold": args.frequency_threshold}
        if args.skip_dlrm or not os.path.isfile(os.path.join(ROOT, "main.py")):
            print("[bench] DLRM skipped" + ("" if args.skip_dlrm else " (no main.py)"))
        else:
            d = dlrm(dataset, work, args)
            result["dlrm"] = d
            print(f"[bench] DLRM (1 epoch, {d['seconds']} s): test AUC {d['test_auc']:.4f}",
                  flush=True)
            print(f"[bench] command: python {d['command']}", flush=True)
            print(f"[bench] test AUC  DLRM {d['test_auc']:.4f}  logistic regression "
                  f"{lr['test_auc']:.4f}  difference (DLRM - LR) "
                  f"{d['test_auc'] - lr['test_auc']:+.4f}", flush=True)
            if args.amp:
                a = result["dlrm_amp"] = dlrm(dataset, work, args, amp=True)
                print(f"[bench] DLRM --amp (DLRM_CPU_AMP=bfloat16, same seed and steps, "
                      f"{a['seconds']} s): test AUC float32 {d['test_auc']:.5f}  bfloat16 "
                      f"{a['test_auc']:.5f}  difference (bfloat16 - float32) "
                      f"{a['test_auc'] - d['test_auc']:+.5f}; the epoch's training loss "
                      f"float32 {d['train_loss']:.6f}, bfloat16 {a['train_loss']:.6f}",
                      flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0 if identical else 1
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
