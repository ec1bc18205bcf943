"""CPU-only checks of the CUDA DotBasedInteract op (tensorflow-dot-based-interact/).

* The harness's float64 numpy reference (the yardstick for the GPU kernels) against an
  independent formulation: einsum + np.tril_indices, the dense-matrix gradient and a
  finite-difference vector-Jacobian product. No TensorFlow, no CUDA needed.
* The op library: built once per session with make + nvcc into a temp dir (skipped with a
  message when nvcc is absent), loaded with tf.load_op_library; both ops registered, shape
  functions give the right static shapes, the gradient is wired to DotBasedInteractGrad.
  Nothing executes on a GPU here: the kernels are checked by harness/run_on_gpu.sh.

Build arch for the test: $DBI_TEST_ARCHS (default "80": one arch keeps the build short).
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import require_or_skip

ROOT = Path(__file__).resolve().parents[1]
PKG_DIR = ROOT / "tensorflow-dot-based-interact"
HARNESS_DIR = PKG_DIR / "harness"


def _import_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _import_from(HARNESS_DIR / "reference.py", "dbi_harness_reference")


def _independent_forward(x, bottom):
    B, R, C = x.shape
    z = np.einsum("bic,bjc->bij", x, x)
    ti, tj = np.tril_indices(R, -1)
    width = -(-(R * (R - 1) // 2 + C) // 8) * 8
    out = np.zeros((B, width))
    out[:, :C] = bottom
    out[:, C:C + len(ti)] = z[:, ti, tj]
    return out


# --------------------------------------------------------------------------------------
# the numpy reference itself
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("R", [1, 2, 3, 4, 7, 27, 33, 64])
def test_reference_pair_order_is_row_major_lower_triangle(R):
    rows, cols = ref.lower_pairs(R)
    ti, tj = np.tril_indices(R, -1)
    np.testing.assert_array_equal(rows, ti)
    np.testing.assert_array_equal(cols, tj)
    if R >= 4:
        assert list(zip(rows[:6], cols[:6])) == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]


@pytest.mark.parametrize("R,C,width", [(27, 128, 480), (2, 3, 8), (1, 5, 8), (3, 1, 8),
                                       (16, 16, 136), (33, 127, 656), (64, 256, 2272),
                                       (27, 16, 368)])
def test_output_width(R, C, width):
    assert ref.output_width(R, C) == width
    pkg = _import_from(PKG_DIR / "tensorflow_dot_based_interact" / "__init__.py",
                       "dbi_pkg_for_width")
    assert pkg.output_width(R, C) == width


@pytest.mark.parametrize("B,R,C", [(1, 2, 3), (5, 27, 16), (3, 33, 129), (2, 1, 5),
                                   (4, 27, 128)])
def test_reference_forward_matches_einsum(B, R, C):
    rng = np.random.default_rng(1000 * R + C)
    x = rng.standard_normal((B, R, C))
    bottom = rng.standard_normal((B, C))
    out = ref.forward(x, bottom)
    expect = _independent_forward(x, bottom)
    assert out.shape == expect.shape == (B, ref.output_width(R, C))
    np.testing.assert_array_equal(out[:, :C], bottom)
    np.testing.assert_allclose(out, expect, rtol=1e-12, atol=1e-12)
    P = R * (R - 1) // 2
    assert not out[:, C + P:].any()
    if R >= 3:  # spell out the first pairs: (1,0), (2,0), (2,1)
        np.testing.assert_allclose(out[:, C], np.sum(x[:, 1] * x[:, 0], axis=1))
        np.testing.assert_allclose(out[:, C + 1], np.sum(x[:, 2] * x[:, 0], axis=1))
        np.testing.assert_allclose(out[:, C + 2], np.sum(x[:, 2] * x[:, 1], axis=1))


@pytest.mark.parametrize("B,R,C", [(1, 2, 3), (5, 27, 16), (3, 33, 129), (2, 1, 5)])
def test_reference_backward_is_the_vjp_of_forward(B, R, C):
    rng = np.random.default_rng(7 * R + C)
    x = rng.standard_normal((B, R, C))
    bottom = rng.standard_normal((B, C))
    g = rng.standard_normal((B, ref.output_width(R, C)))  # junk in the padding too
    gx, gb = ref.backward(x, g)
    assert gx.shape == (B, R, C) and gb.shape == (B, C)
    np.testing.assert_array_equal(gb, g[:, :C])
    # dense formulation: d/dx sum(G * x x^T) with G strictly lower = (G + G^T) x
    ti, tj = np.tril_indices(R, -1)
    G = np.zeros((B, R, R))
    G[:, ti, tj] = g[:, C:C + len(ti)]
    np.testing.assert_allclose(gx, np.einsum("bij,bjc->bic", G + np.swapaxes(G, 1, 2), x),
                               rtol=1e-12, atol=1e-12)
    # central difference of <g, forward> along a random direction (exact for a quadratic)
    dx = rng.standard_normal(x.shape)
    db = rng.standard_normal(bottom.shape)
    eps = 1e-3
    plus = np.sum(g * _independent_forward(x + eps * dx, bottom + eps * db))
    minus = np.sum(g * _independent_forward(x - eps * dx, bottom - eps * db))
    np.testing.assert_allclose((plus - minus) / (2 * eps), np.sum(gx * dx) + np.sum(gb * db),
                               rtol=1e-8, atol=1e-8)


def test_reference_rel_err_flags_nan():
    a = np.ones((2, 8))
    b = a.copy()
    b[1, 3] = np.nan
    assert ref.rel_err(a, a) == 0.0
    assert ref.rel_err(b, a) == float("inf")


# --------------------------------------------------------------------------------------
# the op library (build with nvcc, load on CPU)
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _import_package():
    if str(PKG_DIR) not in sys.path:
        sys.path.insert(0, str(PKG_DIR))
    import tensorflow_dot_based_interact
    return tensorflow_dot_based_interact


@pytest.fixture(scope="module")
def op_build(tf, tmp_path_factory):
    """(op module, library path, package) for the op library built once for this module.
    It is loaded through the package's load_op(): TensorFlow keeps the ops of the first
    library loaded in a process, so everything else in this process shares that load."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    require_or_skip(bool(nvcc), "nvcc not found: the CUDA toolkit is needed to build the "
                    "DotBasedInteract op (the shape/registration tests need the compiled "
                    "library)")
    require_or_skip(bool(shutil.which("make")), "make not found: it builds the op library")
    out = tmp_path_factory.mktemp("dbi_op")
    so = out / "_dot_based_interact_ops.so"
    cmd = ["make", "-C", str(PKG_DIR), "-j2", "op", f"OP_LIB={so}", f"BUILD_DIR={out / 'obj'}",
           f"ARCHS={os.environ.get('DBI_TEST_ARCHS', '80')}", f"PYTHON={sys.executable}",
           f"NVCC={nvcc}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"building the op failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    pkg = _import_package()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TF_DOT_BASED_INTERACT_SO", str(so))
        pkg._reset_for_tests()  # retry if an earlier attempt found no library
        module = pkg.load_op()
    if module is None:
        pytest.fail(f"load_op() failed: {pkg.load_error()}")
    return module, so, pkg


def _spec(tf, shape, dtype):
    return tf.TensorSpec(shape, getattr(tf, dtype))


def test_ops_registered(tf, op_build):
    from tensorflow.python.framework import op_def_registry
    module = op_build[0]
    assert callable(module.dot_based_interact) and callable(module.dot_based_interact_grad)
    fwd = op_def_registry.get("DotBasedInteract")
    bwd = op_def_registry.get("DotBasedInteractGrad")
    assert fwd is not None and bwd is not None
    assert [a.name for a in fwd.input_arg] == ["input", "bottom_mlp_output"]
    assert [a.name for a in bwd.input_arg] == ["input", "upstream_grad"]
    assert [a.name for a in bwd.output_arg] == ["grad_input", "grad_bottom_mlp_output"]
    allowed = {tf.as_dtype(t).name for t in fwd.attr[0].allowed_values.list.type}
    assert allowed == {"float32", "float16"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("R,C,width", [(27, 128, 480), (2, 3, 8), (1, 5, 8), (3, 1, 8),
                                       (16, 16, 136), (33, 127, 656), (64, 256, 2272)])
def test_forward_static_shape(tf, op_build, dtype, R, C, width):
    module = op_build[0]
    fn = tf.function(lambda x, b: module.dot_based_interact(x, b))
    out = fn.get_concrete_function(_spec(tf, [None, R, C], dtype),
                                   _spec(tf, [None, C], dtype)).structured_outputs
    assert out.shape.as_list() == [None, width]
    assert out.dtype == getattr(tf, dtype)
    # batch known on one side only: merged (a fresh tf.function: a traced [None, ...]
    # signature would be reused for [7, ...])
    fn = tf.function(lambda x, b: module.dot_based_interact(x, b))
    out = fn.get_concrete_function(_spec(tf, [7, R, C], dtype),
                                   _spec(tf, [None, C], dtype)).structured_outputs
    assert out.shape.as_list() == [7, width]


def test_forward_shape_partially_unknown(tf, op_build):
    module = op_build[0]
    fn = tf.function(lambda x, b: module.dot_based_interact(x, b))
    out = fn.get_concrete_function(_spec(tf, [None, None, 128], "float32"),
                                   _spec(tf, [None, 128], "float32")).structured_outputs
    assert out.shape.as_list() == [None, None]
    # C known only from bottom_mlp_output: still enough with R
    fn = tf.function(lambda x, b: module.dot_based_interact(x, b))
    out = fn.get_concrete_function(_spec(tf, [None, 27, None], "float32"),
                                   _spec(tf, [None, 128], "float32")).structured_outputs
    assert out.shape.as_list() == [None, 480]


@pytest.mark.parametrize("x_shape,b_shape", [([None, 27], [None, 128]),          # rank
                                             ([None, 27, 128], [None, 64]),      # C
                                             ([8, 27, 128], [4, 128])])          # B
def test_forward_shape_errors(tf, op_build, x_shape, b_shape):
    module = op_build[0]
    fn = tf.function(lambda x, b: module.dot_based_interact(x, b))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        fn.get_concrete_function(_spec(tf, x_shape, "float32"), _spec(tf, b_shape, "float32"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("R,C", [(27, 128), (2, 3), (33, 127)])
def test_grad_op_static_shapes(tf, op_build, dtype, R, C):
    module = op_build[0]
    fn = tf.function(lambda x, g: module.dot_based_interact_grad(x, g))
    gx, gb = fn.get_concrete_function(
        _spec(tf, [None, R, C], dtype),
        _spec(tf, [None, ref.output_width(R, C)], dtype)).structured_outputs
    assert gx.shape.as_list() == [None, R, C]
    assert gb.shape.as_list() == [None, C]
    fn = tf.function(lambda x, g: module.dot_based_interact_grad(x, g))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):  # wrong upstream width
        fn.get_concrete_function(_spec(tf, [None, R, C], dtype),
                                 _spec(tf, [None, ref.output_width(R, C) + 8], dtype))


def test_package_gradient_uses_grad_op(tf, op_build):
    dbi_pkg = op_build[2]
    assert dbi_pkg.load_op() is not None and dbi_pkg.load_error() is None
    from tensorflow.python.framework import ops
    assert ops.gradient_registry.lookup("DotBasedInteract") is not None

    @tf.function
    def loss_grads(x, b):
        with tf.GradientTape() as tape:
            tape.watch([x, b])
            y = dbi_pkg.dot_based_interact(x, b)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x, b])

    cf = loss_grads.get_concrete_function(_spec(tf, [None, 27, 128], "float16"),
                                          _spec(tf, [None, 128], "float16"))
    gx, gb = cf.structured_outputs
    assert gx.shape.as_list() == [None, 27, 128] and gb.shape.as_list() == [None, 128]
    assert "DotBasedInteractGrad" in {op.type for op in cf.graph.get_operations()}


def test_package_reports_missing_library(tmp_path):
    """In a fresh process (a loaded library cannot be unloaded from this one)."""
    code = ("import tensorflow_dot_based_interact as d; "
            "assert d.load_op() is None; print(d.load_error())")
    env = dict(os.environ, TF_DOT_BASED_INTERACT_SO=str(tmp_path / "nope.so"),
               PYTHONPATH=os.pathsep.join([str(PKG_DIR), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not found" in proc.stdout and "nope.so" in proc.stdout


def test_op_has_no_cpu_kernel(tf, op_build):
    """On a CPU-only TensorFlow the op loads but cannot run: a clean error, no crash."""
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: the op would run")
    module = op_build[0]
    with tf.device("/CPU:0"), pytest.raises((tf.errors.NotFoundError,
                                             tf.errors.InvalidArgumentError)):
        module.dot_based_interact(tf.ones([2, 3, 8]), tf.ones([2, 8]))
