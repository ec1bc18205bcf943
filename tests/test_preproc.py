"""preproc/prepare_dataset.sh on real Criteo rows, checked against an independent pandas/numpy
computation of the documented rules (preproc/README.md).

The 10,000 real rows of kaggle_train_head10k.txt become day_0 / day_1 / day_2, plus two
hand-made lines at the end of day_0: one well-formed line with odd numbers (non-integer,
huge, negative) and one malformed line (39 fields) that must be dropped. Spark runs three
times in all (thresholds 0 and 2, and a re-run of 2), in a session-scoped fixture
(conftest.py's spark_runs).
"""
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import require_or_skip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "preproc", "prepare_dataset.sh")
DATA = next((d for d in (os.environ.get("CRITEO_SAMPLE_DIR", ""),
                         os.path.join(ROOT, "shared", "data", "criteo"),
                         os.path.join(os.path.dirname(ROOT), "shared", "data", "criteo"),
                         "/work/shared/data/criteo") if d and os.path.isdir(d)), "")
HEAD = os.path.join(DATA, "kaggle_train_head10k.txt")
DAY_BOUNDS = [0, 3334, 6667, 10000]

HAS_JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
JAVA_REASON = "Spark needs Java (a JRE on PATH or JAVA_HOME)"
DATA_REASON = "needs the real Criteo sample rows (shared/data/criteo)"

ODD_LINE = "\t".join(["1", "abc", "99999999999999999999", "-7", "", "+3", "1.5", "0", "-0",
                      "12", "3", "", "", "4"] + ["oddvalue"] * 26)
MALFORMED_LINE = "\t".join(["0"] + ["1"] * 13 + ["x"] * 25)
MAPPINGS = ("train", "test", "validation")


# ---- the independent reference ----------------------------------------------------------
def read_lines(path):
    with open(path) as f:
        return f.read().split("\n")[:-1]


def make_days(directory):
    """day_0 (+ the two hand-made lines), day_1.gz (compressed input), day_2."""
    lines = read_lines(HEAD)
    days = [lines[a:b] for a, b in zip(DAY_BOUNDS[:-1], DAY_BOUNDS[1:])]
    days[0] = days[0] + [ODD_LINE, MALFORMED_LINE]
    os.makedirs(directory, exist_ok=True)
    for d, rows in enumerate(days):
        text = ("\n".join(rows) + "\n").encode()
        if d == 1:
            with gzip.open(os.path.join(directory, f"day_{d}.gz"), "wb") as f:
                f.write(text)
        else:
            with open(os.path.join(directory, f"day_{d}"), "wb") as f:
                f.write(text)
    return days


def frame(lines):
    """Well-formed lines -> DataFrame of 40 string columns (label, I1..I13, C1..C26)."""
    fields = [line.split("\t") for line in lines]
    good = [f for f in fields if len(f) == 40 and f[0] in ("0", "1")]
    return pd.DataFrame(good, columns=["label"] + [f"I{i}" for i in range(1, 14)]
                        + [f"C{i}" for i in range(1, 27)])


def reference(days, threshold):
    """Expected splits computed with pandas/numpy from the rules, not from the Spark code."""
    train = frame([line for day in days[:-1] for line in day])
    last = days[-1]
    half = len(last) // 2
    # the last day: first half validation, second half the hold-out test set
    splits = {"train": train, "validation": frame(last[:half]), "test": frame(last[half:])}
    dictionaries, cards = [], []
    for i in range(1, 27):
        counts = train[f"C{i}"].value_counts()
        counts = counts[counts >= max(threshold, 1)]
        table = pd.DataFrame({"value": counts.index.to_numpy(), "n": counts.to_numpy()})
        # order: count descending, then value ascending (byte order == code point order)
        table = table.sort_values(["n", "value"], ascending=[False, True], kind="mergesort")
        dictionaries.append(dict(zip(table["value"], range(1, len(table) + 1))))
        cards.append(len(table) + 1)
    out = {}
    for name, df in splits.items():
        ints = df[[f"I{i}" for i in range(1, 14)]].apply(
            lambda col: pd.to_numeric(col.where(col.str.fullmatch(r"[+-]?\d+"), "0"),
                                      errors="coerce").astype(np.float64))
        numerical = np.log(np.clip(ints.to_numpy(), 0, 1e300) + 2)
        categorical = [df[f"C{i}"].map(dictionaries[i - 1]).fillna(0).astype(np.int64)
                       .to_numpy() for i in range(1, 27)]
        out[name] = {"numerical": numerical, "categorical": categorical,
                     "label": (df["label"] == "1").to_numpy(), "raw": df}
    return out, cards, dictionaries


def read_output(out_dir):
    with open(os.path.join(out_dir, "feature_spec.yaml")) as f:
        spec = yaml.safe_load(f)
    data = {}
    for mapping in MAPPINGS:
        base = os.path.join(out_dir, mapping)
        label = np.fromfile(os.path.join(base, "label.bin"), dtype=np.bool_)
        numerical = np.fromfile(os.path.join(base, "numerical.bin"), dtype=np.float16)
        categorical = [np.fromfile(os.path.join(base, f"cat_{i}.bin"),
                                   dtype=spec["feature_spec"][f"cat_{i}"]["dtype"])
                       for i in range(26)]
        data[mapping] = {"label": label, "numerical": numerical.reshape(-1, 13),
                         "categorical": categorical}
    return spec, data


def tree_digest(directory):
    """{relative path: sha256} of every file below directory."""
    digest = {}
    for base, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digest


def models_content(models_dir):
    """{feature dir: (rows sorted by id, number of parquet files)}: Spark's file names carry
    random ids, so the dictionaries are compared by content."""
    out = {}
    for name in sorted(os.listdir(models_dir)):
        path = os.path.join(models_dir, name)
        if os.path.isdir(path):
            table = pq.read_table(path).to_pandas().sort_values("id")
            files = [f for f in os.listdir(path) if f.endswith(".parquet")]
            out[name] = (list(map(tuple, table[["value", "id", "count"]].to_numpy().tolist())),
                         len(files))
    return out


def run_script(args, env_extra, check=True):
    require_or_skip(HAS_JAVA, JAVA_REASON)
    env = dict(os.environ, TOTAL_CORES="2", TOTAL_MEMORY="2g", SHUFFLE_PARTITIONS="4",
               SPARK_LOG_LEVEL="ERROR", PYTHON=sys.executable)
    env.update(env_extra)
    proc = subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"prepare_dataset.sh failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def dirs_env(root, tag):
    return {"download_dir": os.path.join(root, "raw"),
            "spark_output_path": os.path.join(root, tag, "spark"),
            "conversion_intermediate_dir": os.path.join(root, tag, "intermediate"),
            "final_output_dir": os.path.join(root, tag, "dataset")}


def spark_preproc_runs(root):
    """The script's Spark runs into directory root: conftest.py's `spark_runs`, once a
    session (test_preproc_cluster.py compares its cluster run with them)."""
    require_or_skip(os.path.isfile(HEAD), DATA_REASON)
    days = make_days(os.path.join(root, "raw"))
    result = {"root": root, "days": days}
    # threshold 0 also sends the features with the largest dictionaries through their own
    # joins (a small combined-table budget) and reads every plain day file in 64 KiB splits
    # (about 13 per file, as with big files); threshold 2 uses the defaults
    for threshold, tag, budget, extra in (
            (0, "t0", "3000", ["--spark_conf", "spark.sql.files.maxPartitionBytes=65536"]),
            (2, "t2", "", [])):
        env = dirs_env(root, tag)
        proc = run_script(["CPU", str(threshold), *extra],
                          dict(env, COMBINED_DICTIONARY_MAX=budget))
        with open(os.path.join(env["spark_output_path"], "summary.json")) as f:
            summary = json.load(f)
        result[threshold] = {"env": env, "stdout": proc.stdout, "summary": summary,
                             "output": read_output(env["final_output_dir"])}
    # re-run threshold 2 into the same directories
    env = result[2]["env"]
    result["before"] = {k: tree_digest(env[k]) for k in ("final_output_dir",)}
    result["models_before"] = models_content(os.path.join(env["spark_output_path"], "models"))
    result["rerun"] = run_script(["CPU", "2"], env)
    result["after"] = {k: tree_digest(env[k]) for k in ("final_output_dir",)}
    result["models_after"] = models_content(os.path.join(env["spark_output_path"], "models"))
    return result


@pytest.fixture(scope="module")
def expected(spark_runs):
    return {t: reference(spark_runs["days"], t) for t in (0, 2)}


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    """The local engine (in this process) on the same day files, thresholds 0 and 2, in 16 KiB
    blocks: many per day file, so count tables are merged and the last day's half falls
    inside a block."""
    require_or_skip(os.path.isfile(HEAD), DATA_REASON)
    require_or_skip(importlib.util.find_spec("polars") is not None,
                    "engine local needs polars (requirements.txt)")
    sys.path.insert(0, ROOT)
    from preproc import local_engine
    from preproc.prepare_dataset import main
    root = str(tmp_path_factory.mktemp("preproc_local"))
    result = {"days": make_days(os.path.join(root, "raw"))}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_engine, "BLOCK_BYTES", 16384)
        for threshold in (0, 2):
            env = dirs_env(root, f"t{threshold}")
            options = [a for k, v in env.items() for a in (f"--{k}", v)]
            assert main(["--engine", "local", "--frequency_threshold", str(threshold),
                         *options]) == 0
            result[threshold] = {"env": env, "output": read_output(env["final_output_dir"])}
    return result


# ---- tests ------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0, 2])
def test_rows_labels_and_spec(spark_runs, expected, threshold):
    spec, data = spark_runs[threshold]["output"]
    ref, cards, _ = expected[threshold]
    rows = {m: len(ref[m]["label"]) for m in MAPPINGS}
    # 3334 real + odd line (malformed dropped) + 3333 train; day_2: 1666 validation, 1667 test
    assert rows == {"train": 6668, "test": 1667, "validation": 1666}
    assert spec["metadata"]["rows"] == rows
    assert spec["metadata"]["malformed_lines"] == 1
    assert spec["metadata"]["frequency_threshold"] == threshold
    for mapping in MAPPINGS:
        assert len(data[mapping]["label"]) == rows[mapping]
        np.testing.assert_array_equal(data[mapping]["label"], ref[mapping]["label"])
    assert [spec["feature_spec"][f"cat_{i}"]["cardinality"] for i in range(26)] == cards
    for i, card in enumerate(cards):
        narrowest = next(t for t in ("int8", "int16", "int32", "int64")
                         if card - 1 <= np.iinfo(t).max)
        assert spec["feature_spec"][f"cat_{i}"]["dtype"] == narrowest
    assert all(spec["feature_spec"][f"num_{i}"]["dtype"] == "float16" for i in range(13))
    summary = spark_runs[threshold]["summary"]
    assert summary["rows"] == rows and summary["cardinalities"] == cards
    assert set(summary["seconds"]) >= {"parse", "positions", "dictionaries", "apply", "convert"}
    stdout = spark_runs[threshold]["stdout"]
    assert "summary" in stdout and "stage 5/5" in stdout
    if threshold == 0:  # the day files were read in many splits (one parquet file each)
        parsed = os.path.join(spark_runs[0]["env"]["spark_output_path"], "parsed")
        assert len([f for f in os.listdir(parsed) if f.endswith(".parquet")]) >= 20
    alone = int(re.search(r"(\d+) joined alone", stdout).group(1))
    assert alone > 0 if threshold == 0 else alone == 0  # both lookup paths ran


def test_threshold_shrinks_cardinalities(expected):
    cards0, cards2 = expected[0][1], expected[2][1]
    assert all(b <= a for a, b in zip(cards0, cards2)) and sum(cards2) < sum(cards0)


@pytest.mark.parametrize("threshold", [0, 2])
def test_categorical_ids_match_reference(spark_runs, expected, threshold):
    _, data = spark_runs[threshold]["output"]
    ref = expected[threshold][0]
    for mapping in MAPPINGS:
        for i in range(26):
            np.testing.assert_array_equal(data[mapping]["categorical"][i].astype(np.int64),
                                          ref[mapping]["categorical"][i],
                                          err_msg=f"{mapping} cat_{i}")


def ids_of(runs, threshold, mapping, feature, raw_value, expected):
    """Ids that the output gives to the rows whose raw value of C<feature+1> is raw_value."""
    rows = (expected[threshold][0][mapping]["raw"][f"C{feature + 1}"] == raw_value).to_numpy()
    assert rows.any(), (mapping, feature, raw_value)
    return set(runs[threshold]["output"][1][mapping]["categorical"][feature][rows].tolist())


def test_chosen_raw_values(spark_runs, expected):
    train = expected[0][0]["train"]["raw"]
    test = expected[0][0]["test"]["raw"]
    # the most frequent training value of each feature gets id 1 at every threshold
    for feature in (0, 5, 8, 19):
        top = train[f"C{feature + 1}"].value_counts()
        top = sorted(top[top == top.max()].index)[0]
        for t in (0, 2):
            assert ids_of(spark_runs, t, "train", feature, top, expected) == {1}
    # the missing value "" is a value of its own: same id as in the reference, not 0
    missing_feature = int(np.argmax([(train[f"C{i}"] == "").sum() for i in range(1, 27)]))
    for t in (0, 2):
        ref_id = expected[t][2][missing_feature][""]
        assert ref_id > 0
        assert ids_of(spark_runs, t, "train", missing_feature, "", expected) == {ref_id}
    # a value seen once in training: its own id at threshold 0, the shared id 0 at threshold 2
    counts = train["C4"].value_counts()
    once = sorted(counts[counts == 1].index)[0]
    assert ids_of(spark_runs, 0, "train", 3, once, expected) == {expected[0][2][3][once]} != {0}
    assert ids_of(spark_runs, 2, "train", 3, once, expected) == {0}
    # the hand-made line's categorical value occurs once: 0 at threshold 2
    assert ids_of(spark_runs, 2, "train", 25, "oddvalue", expected) == {0}
    # a test-day value never seen in training gets 0 at both thresholds
    seen = set(train["C3"])
    unseen = sorted(v for v in set(test["C3"]) if v not in seen)[0]
    for t in (0, 2):
        assert ids_of(spark_runs, t, "test", 2, unseen, expected) == {0}
    # ids are consecutive from 1 in the order of descending training count
    for t in (0, 2):
        d = expected[t][2][0]
        assert sorted(d.values()) == list(range(1, len(d) + 1))


@pytest.mark.parametrize("threshold", [0, 2])
def test_numerical_transform(spark_runs, expected, threshold):
    _, data = spark_runs[threshold]["output"]
    ref = expected[threshold][0]
    for mapping in MAPPINGS:
        got = data[mapping]["numerical"].astype(np.float64)
        want = ref[mapping]["numerical"]
        assert got.shape == want.shape
        assert np.isfinite(got).all() and (got >= 0).all()
        # float16 keeps 11 significant bits: relative error <= 2**-11 (+ float32 step)
        np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=1e-6, err_msg=mapping)
    # the hand-made line (last train row of day 0), before adding 2: abc -> 0, 1e20, -7 -> 0,
    # "" -> 0, +3 -> 3, 1.5 (not an integer) -> 0, -0 -> 0
    odd = data["train"]["numerical"][DAY_BOUNDS[1]].astype(np.float64)
    want = np.log(np.array([0, 1e20, 0, 0, 3, 0, 0, 0, 12, 3, 0, 0, 4]) + 2)
    np.testing.assert_allclose(odd, want, rtol=2 ** -10)
    assert data["train"]["label"][DAY_BOUNDS[1]]


def test_rerun_is_identical_and_replaces(spark_runs):
    assert spark_runs["before"] == spark_runs["after"]
    assert spark_runs["models_before"] == spark_runs["models_after"]
    files = spark_runs["after"]["final_output_dir"]
    assert sorted(files) == sorted(["feature_spec.yaml"] + [
        f"{m}/{n}" for m in MAPPINGS for n in ["label.bin", "numerical.bin"]
        + [f"cat_{i}.bin" for i in range(26)]])
    parent = os.path.dirname(spark_runs[2]["env"]["final_output_dir"])
    assert not [n for n in os.listdir(parent) if ".tmp" in n]  # no temp dirs left behind


def test_dataset_opens_with_the_library(spark_runs):
    sys.path.insert(0, ROOT)
    from core.sources import load_spec
    from dlrm_contract import DLRM_CONTRACT
    from datasets import SplitBinaryReader
    spec = load_spec(spark_runs[2]["env"]["final_output_dir"], DLRM_CONTRACT)
    reader = SplitBinaryReader(spec, "validation", batch_size=1000)
    numerical, categorical, label = reader.get(0)
    assert numerical.shape == (1000, 13) and len(categorical) == 26 and label.shape == (1000,)
    reader.close()


def test_dictionaries_saved(spark_runs):
    models = os.path.join(spark_runs[2]["env"]["spark_output_path"], "models")
    table = pq.read_table(os.path.join(models, "feature=0")).to_pandas()
    assert set(table.columns) >= {"value", "id", "count"}
    cards = spark_runs[2]["summary"]["cardinalities"]
    assert sorted(table["id"]) == list(range(1, cards[0]))
    assert (table["count"] >= 2).all()


def test_last_day_first_half_is_validation_second_half_test(spark_runs, local_runs):
    """As in the reference preprocessing: the first half of the last day (by line) is the
    validation set, the second half the hold-out test set. Expected values straight from the
    raw lines of day_2."""
    last = spark_runs["days"][2]
    half = len(last) // 2
    first = last[0].split("\t")
    for output in (spark_runs[0]["output"][1], local_runs[0]["output"][1]):
        assert len(output["validation"]["label"]) == half == 1666
        assert len(output["test"]["label"]) == len(last) - half == 1667
        assert output["validation"]["label"].tolist() == [l[0] == "1" for l in last[:half]]
        assert output["test"]["label"].tolist() == [l[0] == "1" for l in last[half:]]
        want = [np.log(max(int(x), 0) + 2) if x else np.log(2) for x in first[1:14]]
        np.testing.assert_allclose(output["validation"]["numerical"][0].astype(np.float64),
                                   want, rtol=2 ** -10)


@pytest.mark.parametrize("threshold", [0, 2])
def test_local_engine_matches_reference(local_runs, threshold):
    spec, data = local_runs[threshold]["output"]
    ref, cards, _ = reference(local_runs["days"], threshold)
    assert [spec["feature_spec"][f"cat_{i}"]["cardinality"] for i in range(26)] == cards
    assert spec["metadata"]["malformed_lines"] == 1
    for mapping in MAPPINGS:
        np.testing.assert_array_equal(data[mapping]["label"], ref[mapping]["label"])
        for i in range(26):
            np.testing.assert_array_equal(data[mapping]["categorical"][i].astype(np.int64),
                                          ref[mapping]["categorical"][i],
                                          err_msg=f"{mapping} cat_{i}")
        np.testing.assert_allclose(data[mapping]["numerical"].astype(np.float64),
                                   ref[mapping]["numerical"], rtol=2 ** -10, atol=1e-6)


@pytest.mark.parametrize("threshold", [0, 2])
def test_engines_write_identical_bytes(spark_runs, local_runs, threshold):
    spark_env, local_env = spark_runs[threshold]["env"], local_runs[threshold]["env"]
    assert tree_digest(local_env["final_output_dir"]) == \
        tree_digest(spark_env["final_output_dir"])
    spark_models = models_content(os.path.join(spark_env["spark_output_path"], "models"))
    local_models = models_content(os.path.join(local_env["spark_output_path"], "models"))
    assert {k: v[0] for k, v in local_models.items()} == \
        {k: v[0] for k, v in spark_models.items()}


def test_local_engine_line_ends(tmp_path, monkeypatch):
    """Lines end at \\n, \\r\\n or \\r, as in Spark's text reader, also across block
    boundaries and without a final line end; plain and gzip files read alike."""
    require_or_skip(importlib.util.find_spec("polars") is not None,
                    "engine local needs polars (requirements.txt)")
    from preproc import local_engine
    text = b"a\tb\r\nc\rdd\n\nee\r\nlast"
    want = ["a\tb", "c", "dd", "", "ee", "last"]
    (tmp_path / "day_0").write_bytes(text)
    with gzip.open(tmp_path / "day_1.gz", "wb") as f:
        f.write(text)
    for block in (1, 2, 3, 5, 64):
        monkeypatch.setattr(local_engine, "BLOCK_BYTES", block)
        for name in ("day_0", "day_1.gz"):
            got = [s for a in local_engine.read_lines(str(tmp_path / name))
                   for s in a.to_pylist()]
            assert got == want, (block, name)


def test_local_engine_rejects_non_utf8(tmp_path):
    require_or_skip(importlib.util.find_spec("polars") is not None,
                    "engine local needs polars (requirements.txt)")
    from preproc import local_engine
    from preproc.spark_data_utils import PreprocError
    (tmp_path / "day_0").write_bytes(b"0\tok\n1\t\xff\n")
    with pytest.raises(PreprocError, match=r"day_0: not UTF-8 text at byte 7"):
        list(local_engine.read_lines(str(tmp_path / "day_0")))


# ---- bad invocations (each fails before Spark starts) -----------------------------------
def bad_run(tmp_path, args, days=(0, 1, 2), extra_env=None):
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    for d in days:
        (raw / f"day_{d}").write_text("0" + "\t1" * 13 + "\ta" * 26 + "\n")
    env = dirs_env(str(tmp_path), "out")
    env.update(extra_env or {})
    return run_script(args, env, check=False)


def test_missing_day_file_is_a_clear_error(tmp_path):
    proc = bad_run(tmp_path, ["CPU", "0"], days=(0, 2))
    assert proc.returncode == 2
    assert "missing day file(s) day_1" in proc.stderr
    assert not os.path.exists(tmp_path / "out")


def test_too_few_days_is_a_clear_error(tmp_path):
    proc = bad_run(tmp_path, ["CPU", "0"], days=(0,))
    assert proc.returncode == 2 and "need at least day_0 and day_1" in proc.stderr
    proc = bad_run(tmp_path, ["CPU", "0"], extra_env={"download_dir": str(tmp_path / "nope")})
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["GPU", "3"], "mode must be CPU or DGX2, found 'GPU'"),
    (["CPU", "-1"], "frequency_threshold must be a non-negative integer"),
    (["CPU"], "expected 2 arguments"),
    (["DGX2", "3"], "set RAPIDS_JAR"),
])
def test_bad_arguments_are_clear_errors(tmp_path, args, message):
    proc = bad_run(tmp_path, args, extra_env={"RAPIDS_JAR": ""})
    assert proc.returncode == 2
    assert message in proc.stderr


def test_dgx2_with_missing_jar_file(tmp_path):
    proc = bad_run(tmp_path, ["DGX2", "3"], extra_env={"RAPIDS_JAR": str(tmp_path / "x.jar")})
    assert proc.returncode == 2 and "RAPIDS jar not found" in proc.stderr


def test_dgx2_spark_settings(tmp_path):
    """The RAPIDS settings of mode DGX2 (no GPU needed: only the configuration is built)."""
    sys.path.insert(0, ROOT)
    from preproc.prepare_dataset import check_config, parse_args
    raw = tmp_path / "raw"
    raw.mkdir()
    for d in range(2):
        (raw / f"day_{d}").write_text("0" + "\t1" * 13 + "\ta" * 26 + "\n")
    jar = tmp_path / "rapids-4-spark_2.12-24.08.1.jar"
    jar.write_bytes(b"jar")
    common = ["--download_dir", str(raw), "--rapids_jar", str(jar), "--cores", "4",
              "--memory", "8"]
    conf = check_config(parse_args(["--mode", "DGX2", *common]))
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    assert conf["spark.jars"] == str(jar) and conf["spark.rapids.sql.enabled"] == "true"
    assert conf["spark.master"] == "local[4]" and conf["spark.driver.memory"] == "8g"
    conf = check_config(parse_args(["--mode", "DGX2", *common, "--master", "spark://h:7077",
                                    "--executor_cores", "8"]))
    assert conf["spark.master"] == "spark://h:7077" and conf["spark.executor.memory"] == "8g"
    assert conf["spark.executor.resource.gpu.amount"] == "1"
    assert conf["spark.task.resource.gpu.amount"] == "0.125"
    conf = check_config(parse_args(["--mode", "CPU", *common]))
    assert "spark.plugins" not in conf


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    sys.path.insert(0, ROOT)
    from preproc.convert_to_binary import convert
    from preproc.spark_data_utils import PreprocError
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(PreprocError, match="refusing to replace"):
        convert(str(tmp_path / "none"), str(out), [2] * 26, {})
    assert (out / "notes.txt").read_text() == "keep me"


def test_converter_detects_overlapping_files(tmp_path):
    sys.path.insert(0, ROOT)
    from preproc.convert_to_binary import ordered_files
    from preproc.spark_data_utils import PreprocError
    split = tmp_path / "split=train"
    split.mkdir()
    pq.write_table(pa.table({"pos": [5, 6, 7]}), split / "b.parquet")
    pq.write_table(pa.table({"pos": [1, 2, 3]}), split / "a2.parquet")
    assert [os.path.basename(p) for p in ordered_files(str(split))] == ["a2.parquet",
                                                                         "b.parquet"]
    pq.write_table(pa.table({"pos": [3, 4]}), split / "c.parquet")
    with pytest.raises(PreprocError, match="overlap"):
        ordered_files(str(split))
