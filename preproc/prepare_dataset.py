"""Raw Criteo click logs (day_0 .. day_K) -> split-binary dataset with feature_spec.yaml.

Usually started by preproc/prepare_dataset.sh; see preproc/README.md for the rules and for
running on a cluster. Two engines write byte-identical output: Spark (the default, local mode
or a cluster) and `--engine local`, polars in this process (preproc/local_engine.py). Spark's
stages:

  1 parse         text -> parquet (spark_output_path/parsed): fields split, numbers transformed
  2 positions     line position of every row in its day file (exact, without a global sort)
  3 dictionaries  per-feature value -> id tables from the training days
                  (spark_output_path/models/feature=<i>/)
  4 apply         ids replace raw values; rows range-sorted by (day, line), one parquet
                  directory per split (conversion_intermediate_dir/transformed)
  5 convert       parquet -> split binary + feature_spec.yaml in final_output_dir (a temp dir
                  renamed into place)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from core.cli import run_cli  # noqa: E402
from core.feature_spec import DynamicSpec  # noqa: E402
from core.spark import HUGE_METHODS, start_spark, stop_spark  # noqa: E402
from preproc.spark_data_utils import (PreprocError, NUMERICAL_COLUMNS,  # noqa: E402
                                      CATEGORICAL_COLUMNS, COMBINED_DICTIONARY_MAX, RARE_ID,
                                      FIRST_HALF_SPLIT, SECOND_HALF_SPLIT,
                                      apply_dictionaries, combined_features,
                                      build_dictionaries, line_offsets, parse_days,
                                      with_positions, write_transformed)
from preproc.convert_to_binary import convert, open_writer  # noqa: E402

MODES = ("CPU", "DGX2")
ENGINES = ("spark", "local")
DEFAULTS = {
    "download_dir": "/data/dlrm/criteo",
    "spark_output_path": "/data/dlrm/spark/output",
    "conversion_intermediate_dir": "/data/dlrm/intermediate_binary",
    "final_output_dir": "/data/dlrm/binary_dataset",
}
DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")


def log(message: str) -> None:
    print(f"[preproc] {message}", flush=True)


# ---- configuration ----------------------------------------------------------------------
def default_memory() -> str:
    """Three quarters of the machine's memory, in GiB, as a Spark size."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return f"{max(1, int(total * 0.75) >> 30)}g"
    except (ValueError, OSError, AttributeError):
        return "4g"


def spark_size(value: str) -> str:
    """'16' (GiB, the seed's convention) or a Spark size like '16g', '512m' -> Spark size."""
    value = str(value).strip().lower()
    if re.fullmatch(r"\d+", value):
        return f"{value}g"
    if re.fullmatch(r"\d+[kmgt]b?", value):
        return value.rstrip("b")
    raise PreprocError(f"memory size {value!r} not understood; use a number of GiB or e.g. 16g")


def find_days(download_dir: str, num_days=None) -> list:
    """Paths of day_0 .. day_K (plain or .gz) in download_dir, checked to be complete."""
    if not os.path.isdir(download_dir):
        raise PreprocError(f"download_dir {download_dir} does not exist (expected the raw "
                           f"Criteo files day_0 ... day_K there)")
    found = {}
    for name in os.listdir(download_dir):
        m = DAY_FILE.match(name)
        if m:
            day = int(m.group(1))
            if day in found:
                raise PreprocError(f"{download_dir}: both {os.path.basename(found[day])} and "
                                   f"{name} present; keep one of them")
            found[day] = os.path.join(download_dir, name)
    count = num_days if num_days is not None else len(found)
    if count < 2:
        raise PreprocError(f"{download_dir}: found {len(found)} day file(s) "
                           f"({', '.join(sorted(os.path.basename(p) for p in found.values())) or 'none'}); "
                           f"need at least day_0 and day_1 (the last day is split into test "
                           f"and validation)")
    missing = [f"day_{d}" for d in range(count) if d not in found]
    if missing:
        raise PreprocError(f"{download_dir}: missing day file(s) {', '.join(missing[:8])}"
                           f"{' ...' if len(missing) > 8 else ''}; expected day_0 ... "
                           f"day_{count - 1} (unpacked, or .gz)")
    extra = sorted(d for d in found if d >= count)
    if extra and num_days is None:  # cannot happen: count = len(found) and no gaps
        raise PreprocError(f"{download_dir}: unexpected day files {extra}")
    paths = [found[d] for d in range(count)]
    empty = [os.path.basename(p) for p in paths if os.path.getsize(p) == 0]
    if empty:
        raise PreprocError(f"{download_dir}: empty day file(s) {', '.join(empty)}")
    return paths


def env_int(name: str, default=None):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise PreprocError(f"environment variable {name} must be an integer, found "
                           f"{value!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="prepare_dataset",
        description="Raw Criteo click logs (day_0 .. day_K) -> split-binary DLRM dataset. "
                    "Days 0..K-1 train; day K: first half validation, second half test.")
    p.add_argument("--engine", default=env("PREPROC_ENGINE") or "spark",
                   help="spark (default: local mode, or a cluster with --master) or local "
                        "(polars in this process, one machine; see preproc/README.md)")
    p.add_argument("--mode", default="CPU", help="CPU (Spark on CPUs) or DGX2 (Spark with "
                   "the RAPIDS accelerator; needs --rapids_jar / RAPIDS_JAR)")
    p.add_argument("--frequency_threshold", type=int, default=env_int("frequency_threshold", 0),
                   help="categorical values seen fewer times than this in the training days "
                        "share id 0 (0 or 1: keep every value)")
    p.add_argument("--dynamic_capacity", type=int, default=env_int("dynamic_capacity", 0),
                   help="one pass, no dictionaries (engine local): raw values as int64 ids of "
                        "dynamic tables of this many rows, min_count = the frequency threshold "
                        "(0: the dictionary route)")
    for name, default in DEFAULTS.items():
        p.add_argument(f"--{name}", default=env(name, default))
    p.add_argument("--num_days", type=int, default=None,
                   help="use day_0 .. day_{N-1} (default: all day files found, no gaps)")
    p.add_argument("--master", default=env("SPARK_MASTER") or None,
                   help="Spark master URL (default: local[TOTAL_CORES])")
    p.add_argument("--cores", type=int, default=env_int("TOTAL_CORES") or os.cpu_count())
    p.add_argument("--memory", default=env("TOTAL_MEMORY") or default_memory(),
                   help="driver memory in local mode / executor memory on a cluster "
                        "(GiB number or Spark size)")
    p.add_argument("--driver_memory", default=env("DRIVER_MEMORY") or None,
                   help="driver memory on a cluster (default 4g)")
    p.add_argument("--executor_cores", type=int, default=env_int("EXECUTOR_CORES"),
                   help="cores per executor on a cluster")
    p.add_argument("--shuffle_partitions", type=int,
                   default=env_int("SHUFFLE_PARTITIONS"),
                   help="spark.sql.shuffle.partitions (default 2 x cores, at least 4)")
    p.add_argument("--rapids_jar", default=env("RAPIDS_JAR") or None,
                   help="rapids-4-spark jar for --mode DGX2")
    p.add_argument("--combined_dictionary_max", type=int,
                   default=env_int("COMBINED_DICTIONARY_MAX", COMBINED_DICTIONARY_MAX),
                   help="features whose dictionaries together hold at most this many values "
                        "share one broadcast lookup table; the others get a join each")
    p.add_argument("--spark_conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting (repeatable)")
    p.add_argument("--clean_intermediate", action="store_true",
                   help="delete the parsed and transformed parquet after success (the "
                        "dictionaries in spark_output_path/models are kept)")
    p.add_argument("--summary_json", default=None,
                   help="also write the summary here (default spark_output_path/summary.json)")
    return p.parse_args(argv)


def check_config(args) -> dict:
    """Everything that can be checked before Spark starts; returns the Spark settings."""
    if args.mode not in MODES:
        raise PreprocError(f"mode must be one of {', '.join(MODES)}, found {args.mode!r}")
    if args.engine not in ENGINES:
        raise PreprocError(f"engine must be one of {', '.join(ENGINES)}, found {args.engine!r}")
    if args.engine == "local" and args.mode != "CPU":
        raise PreprocError("engine local runs on the CPU only: use mode CPU, or engine spark "
                           "for DGX2")
    if args.dynamic_capacity < 0 or (args.dynamic_capacity and args.engine != "local"):
        raise PreprocError(f"--dynamic_capacity (the one-pass route) needs a capacity >= 1 "
                           f"and --engine local, found {args.dynamic_capacity} with engine "
                           f"{args.engine}")
    if args.frequency_threshold < 0:
        raise PreprocError(f"frequency_threshold must be >= 0, found {args.frequency_threshold}")
    if args.cores < 1:
        raise PreprocError(f"cores must be >= 1, found {args.cores}")
    if args.num_days is not None and args.num_days < 2:
        raise PreprocError(f"num_days must be >= 2, found {args.num_days}")
    args.days = find_days(args.download_dir, args.num_days)
    paths = {k: os.path.abspath(getattr(args, k)) for k in DEFAULTS}
    for a in ("spark_output_path", "conversion_intermediate_dir", "final_output_dir"):
        if paths[a] == paths["download_dir"] or \
                paths["download_dir"].startswith(paths[a] + os.sep):
            raise PreprocError(f"{a} {paths[a]} would overwrite the raw data in download_dir")
    if paths["final_output_dir"] in (paths["spark_output_path"],
                                     paths["conversion_intermediate_dir"]):
        raise PreprocError("final_output_dir must differ from the intermediate directories")

    memory = spark_size(args.memory)
    partitions = args.shuffle_partitions or max(4, 2 * args.cores)
    conf = {
        "spark.app.name": "criteo-preprocessing",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.ui.enabled": os.environ.get("SPARK_UI_ENABLED", "false"),
        # Spark's progress bar only where someone watches a terminal
        "spark.ui.showConsoleProgress": "true" if sys.stderr.isatty() else "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.compression.codec": "snappy",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.sql.ansi.enabled": "false",
        # the generated code of the 40-column parse and of the 26 lookups has methods over
        # HotSpot's 8000-byte JIT limit: without this they run interpreted (measured: the
        # parse takes 1.7x the CPU time)
        "spark.driver.extraJavaOptions": HUGE_METHODS,
        "spark.executor.extraJavaOptions": HUGE_METHODS,
    }
    if args.master is None or args.master.startswith("local"):
        conf["spark.master"] = args.master or f"local[{args.cores}]"
        conf["spark.driver.memory"] = memory
    else:
        conf["spark.master"] = args.master
        conf["spark.driver.memory"] = spark_size(args.driver_memory or "4g")
        conf["spark.executor.memory"] = memory
        conf["spark.cores.max"] = str(args.cores)
        if args.executor_cores:
            conf["spark.executor.cores"] = str(args.executor_cores)
    if os.environ.get("SPARK_LOCAL_DIRS"):
        conf["spark.local.dir"] = os.environ["SPARK_LOCAL_DIRS"]
    if args.mode == "DGX2":
        if not args.rapids_jar:
            raise PreprocError("mode DGX2 runs Spark with the RAPIDS accelerator: set RAPIDS_JAR "
                               "(or --rapids_jar) to the rapids-4-spark_2.12 jar matching this "
                               "Spark, or use mode CPU")
        if not os.path.isfile(args.rapids_jar):
            raise PreprocError(f"RAPIDS jar not found: {args.rapids_jar}")
        conf.update({
            "spark.jars": os.path.abspath(args.rapids_jar),
            "spark.plugins": "com.nvidia.spark.SQLPlugin",
            "spark.rapids.sql.enabled": "true",
            "spark.rapids.sql.concurrentGpuTasks": os.environ.get("CONCURRENT_GPU_TASKS", "2"),
            "spark.rapids.memory.pinnedPool.size": os.environ.get("PINNED_POOL_SIZE", "2g"),
            "spark.sql.files.maxPartitionBytes": "512m",
            "spark.rapids.sql.explain": os.environ.get("RAPIDS_EXPLAIN", "NONE"),
        })
        if not conf["spark.master"].startswith("local"):
            per_task = 1.0 / (args.executor_cores or 1)
            conf.update({"spark.executor.resource.gpu.amount": "1",
                         "spark.task.resource.gpu.amount": f"{per_task:g}"})
            if os.environ.get("GPU_DISCOVERY_SCRIPT"):
                conf["spark.executor.resource.gpu.discoveryScript"] = \
                    os.environ["GPU_DISCOVERY_SCRIPT"]
    for item in args.spark_conf:
        if "=" not in item:
            raise PreprocError(f"--spark_conf expects KEY=VALUE, found {item!r}")
        key, value = item.split("=", 1)
        conf[key.strip()] = value.strip()
    return conf


# ---- pipeline ---------------------------------------------------------------------------
class Stages:
    """Progress lines and seconds of the stages."""

    def __init__(self, count: int):
        self.count, self.number, self.timings = count, 0, {}

    def start(self, name: str, detail: str = "") -> float:
        self.number += 1
        log(f"stage {self.number}/{self.count} {name}{': ' + detail if detail else ''} ...")
        return time.time()

    def done(self, name: str, t0: float, detail: str = "") -> None:
        self.timings[name] = round(time.time() - t0, 3)
        log(f"  {name} done in {self.timings[name]:.1f} s"
            f"{' (' + detail + ')' if detail else ''}")


def dataset_metadata(args, lines: int, malformed: int) -> dict:
    """feature_spec.yaml's metadata: the same for both engines (their outputs are compared
    byte for byte)."""
    test_day = len(args.days) - 1
    return {
        "source": "raw Criteo click logs, preproc/prepare_dataset.sh",
        "days": len(args.days),
        "train_days": list(range(test_day)),
        "test_validation_day": test_day,
        "frequency_threshold": args.frequency_threshold,
        "rare_id": RARE_ID,
        "numerical_transform": "ln(max(x, 0) + 2); empty or non-integer -> x = 0",
        "raw_numerical": NUMERICAL_COLUMNS,
        "raw_categorical": CATEGORICAL_COLUMNS,
        "lines": lines,
        "malformed_lines": malformed,
    }


def run_spark(args, conf: dict, spark=None) -> dict:
    """Spark's five stages; returns the figures for the summary."""
    stages = Stages(5)
    spark_out = os.path.abspath(args.spark_output_path)
    parsed_dir = os.path.join(spark_out, "parsed")
    models_dir = os.path.join(spark_out, "models")
    sorted_dir = os.path.join(spark_out, "models_sorted")
    transformed_dir = os.path.join(os.path.abspath(args.conversion_intermediate_dir),
                                   "transformed")
    test_day = len(args.days) - 1
    t0 = time.time()
    own_spark = spark is None
    if own_spark:
        log(f"starting Spark ({conf['spark.master']}, memory {conf.get('spark.driver.memory')})")
        spark = start_spark(conf)
    else:
        for key in ("spark.sql.shuffle.partitions", "spark.sql.session.timeZone",
                    "spark.sql.ansi.enabled"):
            spark.conf.set(key, conf[key])
    stages.timings["spark_start"] = round(time.time() - t0, 3)
    partitions = int(conf["spark.sql.shuffle.partitions"])
    try:
        t0 = stages.start("parse", f"text -> {parsed_dir}")
        parse_days(spark, args.days).write.mode("overwrite").parquet(parsed_dir)
        parsed = spark.read.parquet(parsed_dir)
        stages.done("parse", t0)

        t0 = stages.start("positions")
        deltas, lines_per_day, malformed = line_offsets(parsed)
        total_lines = sum(lines_per_day.values())
        stages.done("positions", t0, f"{total_lines} lines, {malformed} malformed and dropped")
        rows = with_positions(spark, parsed, deltas, lines_per_day, test_day, partitions)

        t0 = stages.start("dictionaries", f"threshold {args.frequency_threshold} -> {models_dir}")
        train = rows.filter(rows["split"] == "train")
        cardinalities = build_dictionaries(spark, train, args.frequency_threshold, models_dir,
                                           sorted_dir)
        shutil.rmtree(sorted_dir, ignore_errors=True)
        stages.done("dictionaries", t0, f"cardinalities {cardinalities}")

        combined = combined_features(cardinalities, args.combined_dictionary_max)
        t0 = stages.start("apply", f"{len(combined)} features through the combined lookup "
                                   f"table, {sum(c > 1 for c in cardinalities) - len(combined)} "
                                   f"joined alone -> {transformed_dir}")
        transformed = apply_dictionaries(spark, rows, models_dir, cardinalities,
                                         args.combined_dictionary_max)
        write_transformed(transformed, transformed_dir, partitions)
        stages.done("apply", t0)
    finally:
        if own_spark:
            stop_spark(spark)

    t0 = stages.start("convert", f"-> {args.final_output_dir}")
    spec, split_rows = convert(transformed_dir, args.final_output_dir, cardinalities,
                               dataset_metadata(args, total_lines, malformed), progress=log)
    stages.done("convert", t0)
    if args.clean_intermediate:
        shutil.rmtree(parsed_dir, ignore_errors=True)
        shutil.rmtree(transformed_dir, ignore_errors=True)
    return {"lines": total_lines, "malformed_lines": malformed, "rows": split_rows,
            "cardinalities": cardinalities, "spec": spec, "seconds": stages.timings,
            "master": conf["spark.master"], "models_dir": models_dir}


def run_one_pass(args) -> dict:
    """The local engine's dictionary-free route; returns the figures for the summary."""
    from preproc.local_engine import run_one_pass as one_pass
    stages = Stages(1)
    capacities = [args.dynamic_capacity] * len(CATEGORICAL_COLUMNS)
    dynamic = DynamicSpec(min_count=max(args.frequency_threshold, 1))
    started = stages.start("one pass", f"raw values as int64 ids of dynamic tables "
                                       f"(capacity {args.dynamic_capacity}, min_count "
                                       f"{dynamic.min_count}) -> {args.final_output_dir}")
    figures = one_pass(args.days, lambda: open_writer(
        args.final_output_dir, capacities, dataset_metadata(args, None, None), dynamic),
        progress=log)
    stages.done("one pass", started)
    return dict(figures, cardinalities=capacities, seconds=stages.timings,
                master="local (polars, in process, one pass)", models_dir=None)


def run_polars(args) -> dict:
    """The local engine's two passes; returns the figures for the summary."""
    from preproc.local_engine import run_local
    stages = Stages(2)
    models_dir = os.path.join(os.path.abspath(args.spark_output_path), "models")
    started = {"dictionaries": stages.start("dictionaries", f"count the training days, "
                                            f"threshold {args.frequency_threshold} -> "
                                            f"{models_dir}")}

    def open_dataset_writer(cardinalities, lines, malformed):
        stages.done("dictionaries", started["dictionaries"], f"cardinalities {cardinalities}")
        started["apply"] = stages.start("apply", f"ids, split-binary rows -> "
                                                 f"{args.final_output_dir}")
        return open_writer(args.final_output_dir, cardinalities,
                           dataset_metadata(args, lines, malformed))

    figures = run_local(args.days, args.frequency_threshold, models_dir, open_dataset_writer,
                        progress=log)
    stages.done("apply", started["apply"])
    return dict(figures, seconds=stages.timings, master="local (polars, in process)",
                models_dir=models_dir)


def run(args, spark=None) -> dict:
    """Run every stage; returns the summary. `spark`: an existing session to reuse (tests)."""
    conf = check_config(args)
    started = time.time()
    test_day = len(args.days) - 1
    log(f"engine {args.engine}, mode {args.mode}, frequency threshold "
        f"{args.frequency_threshold}, {len(args.days)} day files in {args.download_dir}: "
        f"days 0..{test_day - 1} train, day {test_day} {FIRST_HALF_SPLIT}/{SECOND_HALF_SPLIT}")
    if args.dynamic_capacity:
        figures = run_one_pass(args)
    else:
        figures = run_polars(args) if args.engine == "local" else run_spark(args, conf, spark)
    total = time.time() - started
    summary = {
        "engine": args.engine,
        "mode": args.mode,
        "master": figures["master"],
        "frequency_threshold": args.frequency_threshold,
        "days": len(args.days),
        "lines": figures["lines"],
        "malformed_lines": figures["malformed_lines"],
        "rows": figures["rows"],
        "cardinalities": figures["cardinalities"],
        "dtypes": [str(figures["spec"].dtype(f)) for f in figures["spec"].categorical_features],
        "seconds": figures["seconds"],
        "seconds_total": round(total, 3),
        "rows_per_second": round(figures["lines"] / total, 1) if total > 0 else None,
        "final_output_dir": os.path.abspath(args.final_output_dir),
        "models_dir": figures["models_dir"],
    }
    print_summary(summary)
    summary_path = args.summary_json or os.path.join(os.path.abspath(args.spark_output_path),
                                                     "summary.json")
    os.makedirs(os.path.dirname(os.path.abspath(summary_path)), exist_ok=True)
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def print_summary(s: dict) -> None:
    log("summary")
    log(f"  lines read {s['lines']} ({s['malformed_lines']} malformed, dropped)")
    for mapping, n in s["rows"].items():
        log(f"  {mapping:<10} {n:>12} rows")
    log(f"  cardinalities (frequency threshold {s['frequency_threshold']}, id 0 = rare/unseen):")
    for i in range(0, len(s["cardinalities"]), 9):
        chunk = s["cardinalities"][i:i + 9]
        log("    " + " ".join(f"cat_{i + j}={c}" for j, c in enumerate(chunk)))
    log("  seconds per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in s["seconds"].items())
        + f"; total {s['seconds_total']:.1f} s ({s['rows_per_second']} lines/s)")
    log(f"  dataset: {s['final_output_dir']}")


def main(argv=None) -> int:
    return run_cli(lambda: run(parse_args(argv)), errors=(PreprocError,))


if __name__ == "__main__":
    sys.exit(main())
