"""Fused CUDA DLRM dot interaction for TensorFlow (custom ops with GPU kernels only).

    from tensorflow_dot_based_interact import load_op, load_error, dot_based_interact

    if load_op() is not None:
        out = dot_based_interact(x, bottom_mlp_output)   # on a GPU device
    else:
        print("falling back:", load_error())

x is [B, R, C] (row 0 = bottom MLP output, rows 1.. = embedding vectors), bottom_mlp_output
is [B, C]; the output is [B, roundup8(R*(R-1)/2 + C)] laid out as
[bottom_mlp_output | <x_i, x_j> for i > j in row-major order | zero padding].
dtypes float32 (TF32 tensor cores on sm80+ unless TF32 is disabled in TensorFlow) and
float16 (float32 accumulation). The gradient is registered for "DotBasedInteract".

The op library is looked up at $TF_DOT_BASED_INTERACT_SO, else next to this file
(built by `make` or `pip install`). The ops have no CPU kernels: on a machine without a
GPU they load (shape functions work) but cannot execute.
"""
import os
import sys
import threading
import types

__all__ = [
    "load_op",
    "load_error",
    "loaded_path",
    "op_library_path",
    "output_width",
    "dot_based_interact",
    "dot_based_interact_grad",
]

_SO_NAME = "_dot_based_interact_ops.so"
_ENV_PATH = "TF_DOT_BASED_INTERACT_SO"


def _state():
    """Process-wide load state, shared by every copy of this package (source tree and
    installed): TensorFlow registers the ops of the first library loaded, and a second copy
    of the library loaded from another path would come back without op wrappers."""
    key = "_tensorflow_dot_based_interact_state"
    st = sys.modules.get(key)
    if st is None:
        st = types.ModuleType(key)
        st.lock = threading.Lock()
        st.attempted, st.module, st.error, st.path = False, None, None, None
        st = sys.modules.setdefault(key, st)
    return st


def op_library_path():
    """Where load_op() looks for the compiled op library."""
    return os.environ.get(_ENV_PATH) or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     _SO_NAME)


def output_width(R, C):
    """Width of the interaction output: roundup8(R*(R-1)/2 + C)."""
    n = R * (R - 1) // 2 + C
    return (n + 7) // 8 * 8


def _register_gradient(module):
    from tensorflow.python.framework import ops

    def _dot_based_interact_grad(op, grad):
        grad_input, grad_bottom = module.dot_based_interact_grad(op.inputs[0], grad)
        return [grad_input, grad_bottom]

    try:
        ops.RegisterGradient("DotBasedInteract")(_dot_based_interact_grad)
    except KeyError:
        pass  # already registered in this process (e.g. the module was reloaded)


def load_op():
    """Load the op library once per process; returns the op module, or None (then
    load_error() says why)."""
    st = _state()
    with st.lock:
        if st.attempted:
            return st.module
        st.attempted = True
        path = op_library_path()
        st.path = path
        if not os.path.isfile(path):
            st.error = (f"op library not found at {path}; build it with "
                        f"`make -C tensorflow-dot-based-interact` or "
                        f"`pip install ./tensorflow-dot-based-interact`")
            return None
        try:
            import tensorflow as tf
            module = tf.load_op_library(path)
        except Exception as e:  # noqa: BLE001 - any load failure means "not available"
            st.error = f"loading {path} failed: {type(e).__name__}: {e}"
            return None
        if not hasattr(module, "dot_based_interact"):
            st.error = (f"{path} loaded, but DotBasedInteract was already registered by "
                        f"another copy of the library in this process; load it only through "
                        f"tensorflow_dot_based_interact.load_op()")
            return None
        try:
            _register_gradient(module)
        except Exception as e:  # noqa: BLE001
            st.error = f"registering the gradient failed: {type(e).__name__}: {e}"
            return None
        st.module, st.error = module, None
        return module


def load_error():
    """Why load_op() returned None (None when the op is available). Triggers loading."""
    load_op()
    return _state().error


def loaded_path():
    """Path of the library load_op() used (None before the first call)."""
    return _state().path


def _reset_for_tests():
    """Forget a failed load so that the next load_op() tries again. A successfully loaded
    library stays (TensorFlow cannot unload it)."""
    st = _state()
    with st.lock:
        if st.module is None:
            st.attempted, st.error, st.path = False, None, None


def _require():
    module = load_op()
    if module is None:
        raise RuntimeError(f"DotBasedInteract op unavailable: {_state().error}")
    return module


def dot_based_interact(input, bottom_mlp_output, name=None):  # noqa: A002 - TF naming
    """[B, R, C], [B, C] -> [B, roundup8(R*(R-1)/2 + C)] (GPU only)."""
    return _require().dot_based_interact(input, bottom_mlp_output, name=name)


def dot_based_interact_grad(input, upstream_grad, name=None):  # noqa: A002
    """-> (grad_input [B, R, C], grad_bottom_mlp_output [B, C]) (GPU only)."""
    return _require().dot_based_interact_grad(input, upstream_grad, name=name)
