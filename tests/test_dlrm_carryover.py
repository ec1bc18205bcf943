"""NVIDIA's DLRM command lines and datasets carry over: the DLRM_and_DCNv2 tree's names
(`python -m dataloading.*`, dlrm.py, dcnv2.py, --interaction dot_custom_cuda|dot_tensorflow|
cross), the DLRM README's `gen_csv.py --feature_spec_in SPEC` without --output, and the
example specs it names, each taken through gen_csv -> transcode -> main.py."""
import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

import gen_csv
import transcode
from core.dllog import read_log
from interaction import resolve_interaction
from test_training import main_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = sorted(glob.glob(os.path.join(ROOT, "tests", "feature_specs", "*.yaml"))) + [
    os.path.join(ROOT, "tests", "transcoding", "small_csv.yaml")]
TINY_MODEL = ["--cpu", "--batch_size", "64", "--valid_batch_size", "100", "--embedding_dim",
              "2", "--bottom_mlp_dims", "8,2", "--top_mlp_dims", "8,1",
              "--benchmark_warmup_steps", "1"]


def run(*args, expect_ok=True):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish within 300 s: {args}", pytrace=False)
    if expect_ok:
        assert proc.returncode == 0, f"{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def records(log, kind="LOG"):
    return [r for r in read_log(log) if r["type"] == kind]


def final(log):
    return [r["data"] for r in records(log) if r["step"] == []][-1]


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: os.path.basename(p)[:-5])
def test_example_spec_goes_through_gen_csv_transcode_and_training(spec_path, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(spec_path, data)
    spec_in = data / os.path.basename(spec_path)
    gen_args = ["--feature_spec_in", str(spec_in), "--size", "200"]
    transcode_args = ["--input", str(data), "--output", str(data / "bin")]
    if spec_path == SPECS[-1]:  # the README's example, through the reference's module names
        run("-m", "dataloading.gen_csv", *gen_args)
        run("-m", "dataloading.transcode", *transcode_args)
    else:  # in-process: the same entry points, without two interpreter start-ups
        assert gen_csv.main(gen_args) == 0 and transcode.main(transcode_args) == 0
    generated = yaml.safe_load((data / "feature_spec.yaml").read_text())
    converted = yaml.safe_load((data / "bin" / "feature_spec.yaml").read_text())
    # every value of every CSV column is in the split-binary file of its feature
    for mapping, chunks in generated["source_spec"].items():
        for chunk in chunks:
            frame = pd.read_csv(data / chunk["files"][0], header=None)
            for k, name in enumerate(chunk["features"]):
                out = next(c for c in converted["source_spec"][mapping]
                           if name in c["features"])
                dtype = np.dtype(converted["feature_spec"][name]["dtype"])
                width = len(out["features"])
                stored = np.fromfile(data / "bin" / out["files"][0], dtype=dtype)
                stored = stored.reshape(-1, width)[:, out["features"].index(name)]
                np.testing.assert_allclose(stored.astype(np.float64),
                                           frame[k].to_numpy(np.float64), rtol=1e-3)
    log = tmp_path / "log.json"
    main_in_process(["--dataset_path", str(data / "bin"), *TINY_MODEL, "--log_path", str(log)])
    figures = final(log)
    assert figures["eval_samples"] == 200 and 0.0 <= figures["auc"] <= 1.0
    assert figures["timed_steps"] == 2 and figures["throughput"] > 0  # 3 steps, 1 warm-up


def test_gen_csv_without_output_adds_files_next_to_the_spec(tmp_path):
    spec_in = tmp_path / "small_csv.yaml"
    shutil.copy(SPECS[-1], spec_in)
    (tmp_path / "notes.txt").write_text("mine")
    assert gen_csv.main(["--feature_spec_in", str(spec_in), "--size", "10"]) == 0
    assert (tmp_path / "train" / "numerical.csv").exists()
    assert (tmp_path / "feature_spec.yaml").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no staging left
    labels = pd.read_csv(tmp_path / "train" / "label.csv", header=None)[0]
    assert set(labels) == {0, 1}  # real labels (the reference's gen_csv writes only 0)
    before = (tmp_path / "train" / "label.csv").read_bytes()
    assert gen_csv.main(["--feature_spec_in", str(spec_in), "--size", "10", "--seed", "1"]) == 2
    assert (tmp_path / "train" / "label.csv").read_bytes() == before  # nothing replaced
    assert gen_csv.main(["--feature_spec_in", str(spec_in), "--size", "12", "--seed", "1",
                         "--overwrite"]) == 0
    assert len(pd.read_csv(tmp_path / "train" / "label.csv", header=None)) == 12


def test_dataloading_aliases_run_the_reference_quick_start(tmp_path):
    """The DLRM_and_DCNv2 quick start's data commands, with a small synthetic dataset."""
    spec = tmp_path / "feature_spec.yaml"
    run("-m", "dataloading.generate_feature_spec", "--variant", "criteo_t15_synthetic",
        "--dst", str(spec))
    assert yaml.safe_load(spec.read_text())["metadata"]["variant"] == "criteo_t15_synthetic"
    run("-m", "dataloading.generate_feature_spec", "--cardinalities", "30,700,5",
        "--num_numerical", "4", "--dst", str(spec))
    out = tmp_path / "preprocessed"
    run("-m", "dataloading.transcribe", "--src_dataset_type", "synthetic", "--src_dataset_path",
        str(tmp_path), "--dst_dataset_path", str(out), "--max_batches_train", "3",
        "--max_batches_test", "1", "--dst_dataset_type", "tf_raw", "--src_batch_size", "128")
    assert sorted(os.listdir(out / "train")) == ["cat_0.bin", "cat_1.bin", "cat_2.bin",
                                                  "label.bin", "numerical.bin"]
    assert os.path.getsize(out / "train" / "label.bin") == 3 * 128  # bool labels
    for script, expected in (("dlrm.py", ("dot", "sgd", 24.0, 8000)),
                             ("dcnv2.py", ("cross", "adam", 0.0001, 100))):
        log = tmp_path / f"{script}.json"
        run("-u", script, "--dataset_path", str(out), *TINY_MODEL, "--log_path", str(log),
            "--save_checkpoint_path", str(tmp_path / f"{script}.ckpt"))
        params = records(log, "PARAMETER")[0]["data"]
        assert (params["interaction"], params["optimizer"], params["learning_rate"],
                params["warmup_steps"]) == expected
        assert params["print_freq"] == 1000 and params["batch_size"] == 64
        eval_log = tmp_path / f"{script}.eval.json"
        run("-u", script, "--dataset_path", str(out), *TINY_MODEL, "--log_path", str(eval_log),
            "--restore_checkpoint_path", str(tmp_path / f"{script}.ckpt"), "--mode", "eval")
        assert final(eval_log)["auc"] == pytest.approx(final(log)["auc"], abs=1e-6)
    # a command-line flag still wins over dcnv2.py's defaults
    log = tmp_path / "dcnv2_sgd.json"
    run("dcnv2.py", "--dataset_path", str(out), *TINY_MODEL, "--optimizer", "sgd",
        "--log_path", str(log), "--mode", "inference", "--max_steps", "3")
    assert records(log, "PARAMETER")[0]["data"]["optimizer"] == "sgd"
    assert final(log)["mean_inference_throughput"] > 0


@pytest.mark.parametrize("flag,dot,expected", [
    ("dot", "auto", ("dot", "auto")), ("cross", "auto", ("cross", "auto")),
    ("dot_tensorflow", "auto", ("dot", "tensorflow")),
    ("dot_custom_cuda", "auto", ("dot", "custom_cuda")),
    ("dot_tensorflow", "tensorflow", ("dot", "tensorflow"))])
def test_interaction_flag_takes_the_reference_values(flag, dot, expected):
    assert resolve_interaction(flag, dot) == expected


def test_contradicting_interaction_flags_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="dot_tensorflow asks for the tensorflow dot"):
        resolve_interaction("dot_tensorflow", "custom_cuda")
    proc = run("main.py", "--dataset_type", "synthetic", *TINY_MODEL, "--interaction",
               "dot_custom_cuda", "--log_path", str(tmp_path / "l.json"), expect_ok=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --dot_interaction="
                                                             "custom_cuda runs on GPUs only")
