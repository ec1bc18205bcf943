"""--amp on a CPU: bfloat16 where the CPU multiplies bfloat16 natively (AMX, AVX512_BF16),
float32 with one line elsewhere (DLRM_CPU_AMP=bfloat16 forces bfloat16); the bfloat16 forward pass
follows the float32 one within bfloat16's precision, and bfloat16 training reaches the float32
run's AUC on the demo's data."""
import os
import subprocess
import sys

import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from core.parallel.placement import make_plan  # noqa: E402
from model import DLRM, ModelConfig  # noqa: E402
from training import engine  # noqa: E402
from test_training import ROOT, final_metrics, run_main, step_losses  # noqa: E402


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile\n")
    assert {"avx512f", "amx_bf16"} <= runtime.cpu_flags(str(info))
    assert runtime.cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize("flags,native", [("fpu avx2 fma", False), ("avx512f avx512_bf16", True),
                                          ("avx512f amx_bf16 amx_tile", True)])
def test_native_bfloat16_is_amx_or_avx512_bf16(monkeypatch, flags, native):
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="/proc/cpuinfo": set(flags.split()))
    assert runtime.native_bfloat16_matmul() == native


@pytest.mark.parametrize("native,choice,expected", [
    (True, None, tf.bfloat16), (False, None, tf.float32), (False, "bfloat16", tf.bfloat16),
    (True, "auto", tf.bfloat16)])
def test_amp_takes_bfloat16_only_where_it_is_native(monkeypatch, capsys, native, choice,
                                                     expected):
    monkeypatch.setattr(runtime, "native_bfloat16_matmul", lambda: native)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    if choice is None:
        monkeypatch.delenv(runtime.CPU_AMP_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(runtime.CPU_AMP_VARIABLE, choice)
    engine._say_once.cache_clear()
    assert engine.compute_dtype_for(True) == expected
    assert engine.compute_dtype_for(False) == tf.float32
    said = capsys.readouterr().out.strip().splitlines()
    if expected == tf.float32:
        assert len(said) == 1 and "no native bfloat16 instructions" in said[0]
        engine.compute_dtype_for(True)
        assert capsys.readouterr().out == ""  # said once
    else:
        assert said == []


def test_a_bad_choice_is_refused(monkeypatch):
    monkeypatch.setenv(runtime.CPU_AMP_VARIABLE, "float8")
    with pytest.raises(ValueError, match="DLRM_CPU_AMP must be one of"):
        runtime.cpu_amp_dtype()


def test_bfloat16_forward_follows_float32():
    config = ModelConfig(13, (1000, 300, 50), 32, (64, 32), (128, 64, 1), seed=4)
    model = DLRM(config, make_plan(config.cardinalities, 32))
    rng = np.random.default_rng(0)
    numerical = tf.constant(rng.standard_normal((512, 13)).astype(np.float32))
    ids = [tf.constant(rng.integers(0, c, 512), tf.int32) for c in config.cardinalities]
    full = model(numerical, ids, 512).numpy()
    half = model(numerical, ids, 512, compute_dtype=tf.bfloat16).numpy()
    assert half.dtype == np.float32 and np.all(np.isfinite(half))
    # bfloat16 keeps 8 significant bits: errors of a few 2^-8 relative through 5 layers
    scale = np.abs(full).max()
    assert np.abs(half - full).max() < 0.05 * scale
    assert np.corrcoef(half, full)[0, 1] > 0.999


# tools/demo.sh's data (26 tables, planted signal 2, power-law ids, seed 1) and model, on 30
# batches of 4096 rows: one epoch of 120 steps of 1024 rows
DEMO_CARDINALITIES = "20000,5000,300,12,40000,3,800,90,2,30000,2500,15000,10,700,6000,60,4,500," \
                     "15,25000,8000,20000,1000,600,50,30"
DEMO_MODEL = ["--cpu", "--embedding_dim", "64", "--bottom_mlp_dims", "256,128,64",
              "--top_mlp_dims", "512,256,1", "--batch_size", "1024", "--valid_batch_size",
              "16384", "--optimizer", "sgd", "--learning_rate", "0.5", "--warmup_steps", "20",
              "--decay_start_step", "60", "--decay_steps", "60", "--print_freq", "10",
              "--seed", "5"]


def test_bfloat16_training_reaches_the_float32_auc_on_the_demo_data(tmp_path, monkeypatch):
    """Same data, seed and steps: --amp in bfloat16 (forced, so on every CPU) ends within
    0.002 of the float32 run's test AUC, after a different path (its losses differ)."""
    for tool in (["generate_feature_spec.py", "--num_numerical", "13", "--cardinalities",
                  DEMO_CARDINALITIES, "--dst", str(tmp_path / "spec" / "feature_spec.yaml")],
                 ["transcribe.py", "--src_dataset_type", "synthetic", "--src_dataset_path",
                  str(tmp_path / "spec"), "--dst_dataset_path", str(tmp_path / "data"),
                  "--dst_dataset_type", "tf_raw", "--src_batch_size", "4096",
                  "--max_batches_train", "30", "--max_batches_test", "6",
                  "--signal_strength", "2", "--seed", "1"]):
        subprocess.run([sys.executable, os.path.join(ROOT, tool[0]), *tool[1:]], check=True,
                       capture_output=True, timeout=300)
    monkeypatch.setenv(runtime.CPU_AMP_VARIABLE, "bfloat16")
    logs = {name: tmp_path / f"{name}.json" for name in ("float32", "bfloat16")}
    run_main("--dataset_path", str(tmp_path / "data"), *DEMO_MODEL, "--log_path",
             str(logs["float32"]))
    run_main("--dataset_path", str(tmp_path / "data"), *DEMO_MODEL, "--amp", "--log_path",
             str(logs["bfloat16"]))
    auc = {name: final_metrics(log)["auc"] for name, log in logs.items()}
    assert auc["float32"] > 0.7, auc  # it learned the planted signal
    assert abs(auc["bfloat16"] - auc["float32"]) <= 0.002, auc
    losses = {name: step_losses(log) for name, log in logs.items()}
    assert losses["bfloat16"][120] != losses["float32"][120]
