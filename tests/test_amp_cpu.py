"""--amp on a CPU: bfloat16 where the CPU multiplies bfloat16 natively (AMX, AVX512_BF16),
float32 with one line elsewhere (DLRM_CPU_AMP=bfloat16 forces bfloat16); the bfloat16 forward pass
follows the float32 one within bfloat16's precision."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from core.parallel.placement import make_plan  # noqa: E402
from model import DLRM, ModelConfig  # noqa: E402
from training import engine  # noqa: E402


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
