"""Feature interactions: DLRM dot interaction and DCNv2 low-rank cross layers.

`dot_interact_tf` is the reference implementation: the CUDA op in
tensorflow-dot-based-interact/ and any exported model are tested against it.

Dot interaction layout, for input X [B, R, C] (row 0 = bottom MLP output) and bottom [B, C]:
    output [B, roundup8(C + R(R-1)/2)] = [ bottom | <X_i, X_j> for i > j, row-major | zeros ]
"""
from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

from core.initializers import bias_normal, glorot_normal

DOT_IMPLEMENTATIONS = ("auto", "tensorflow", "custom_cuda")


def round_up_8(n: int) -> int:
    return (n + 7) // 8 * 8


def dot_output_width(num_rows: int, dim: int) -> int:
    return round_up_8(dim + num_rows * (num_rows - 1) // 2)


def lower_triangle_flat_indices(num_rows: int) -> np.ndarray:
    """Positions of (i, j), i > j, in row-major order within a flattened [R, R] matrix."""
    rows, cols = np.tril_indices(num_rows, k=-1)
    return (rows * num_rows + cols).astype(np.int32)


def symmetric_pair_index(num_rows: int) -> np.ndarray:
    """For each (i, j) of a flattened [R, R] matrix, the position of pair (max, min) in the
    row-major lower-triangle order, or R(R-1)/2 (a zero column) on the diagonal."""
    index = np.full((num_rows, num_rows), num_rows * (num_rows - 1) // 2, np.int32)
    rows, cols = np.tril_indices(num_rows, k=-1)
    index[rows, cols] = index[cols, rows] = np.arange(rows.size, dtype=np.int32)
    return index.reshape(-1)


@tf.custom_gradient
def pair_products(x):
    """<x_i, x_j> for i > j, row-major, of x [B, R, C] -> [B, R(R-1)/2]: the gram matrix's
    lower triangle. The gradient is written out because autodiff of gram-then-gather costs
    two batched matmuls plus a transpose / segment-sum / transpose to scatter the triangle
    back; with the pairs' gradient placed symmetrically in S [B, R, R] (zero diagonal),
    dx = S x is one batched matmul and one gather."""
    num_rows = x.shape[1]
    gram = tf.matmul(x, x, transpose_b=True)
    pairs = tf.gather(tf.reshape(gram, [-1, num_rows * num_rows]),
                      lower_triangle_flat_indices(num_rows), axis=1)

    def grad(d_pairs):
        with tf.name_scope("interaction_grad"):  # names the piece in a profile
            return _pair_products_grad(d_pairs, x, num_rows)

    return pairs, grad


def _pair_products_grad(d_pairs, x, num_rows: int):
    padded = tf.concat([d_pairs, tf.zeros([tf.shape(d_pairs)[0], 1], d_pairs.dtype)], axis=1)
    symmetric = tf.gather(padded, symmetric_pair_index(num_rows), axis=1)
    return tf.matmul(tf.reshape(symmetric, [-1, num_rows, num_rows]), x)


def dot_interact_tf(interaction_input, bottom_mlp_output):
    """Reference dot interaction with plain TensorFlow ops (any device, any dtype)."""
    num_rows, dim = interaction_input.shape[1], interaction_input.shape[2]
    pairs = pair_products(interaction_input)
    padding = dot_output_width(num_rows, dim) - dim - pairs.shape[1]
    pieces = [bottom_mlp_output, pairs]
    if padding:
        pieces.append(tf.zeros([tf.shape(pairs)[0], padding], dtype=pairs.dtype))
    return tf.concat(pieces, axis=1)


CUDA_OP_SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "tensorflow-dot-based-interact")


def _load_cuda_op():
    """The custom CUDA op module (installed, or built in the source tree), or (None, why)."""
    try:
        import tensorflow_dot_based_interact as cuda_interact
    except ImportError:
        if CUDA_OP_SOURCE_DIR not in sys.path:
            sys.path.append(CUDA_OP_SOURCE_DIR)
        try:
            import tensorflow_dot_based_interact as cuda_interact
        except ImportError as e:
            return None, f"package tensorflow_dot_based_interact is not available ({e})"
    if cuda_interact.load_op() is None:
        return None, cuda_interact.load_error()
    return cuda_interact, None


# --interaction values: ours (dot, cross) and the DLRM_and_DCNv2 tree's, which name the dot
# implementation in the same flag
INTERACTIONS = ("dot", "cross", "dot_custom_cuda", "dot_tensorflow")


def resolve_interaction(interaction: str, dot_interaction: str = "auto") -> tuple:
    """(model interaction 'dot' | 'cross', dot implementation request) from --interaction and
    --dot_interaction; dot_custom_cuda / dot_tensorflow set the implementation themselves."""
    if interaction not in INTERACTIONS:
        raise ValueError(f"--interaction must be one of {list(INTERACTIONS)}, found "
                         f"'{interaction}'")
    if not interaction.startswith("dot_"):
        return interaction, dot_interaction
    implied = interaction[len("dot_"):]
    if dot_interaction not in ("auto", implied):
        raise ValueError(f"--interaction {interaction} asks for the {implied} dot interaction "
                         f"but --dot_interaction is {dot_interaction}")
    return "dot", implied


def select_dot_implementation(requested: str = "auto", use_cpu: bool = False,
                              xla: bool = False, export: bool = False):
    """Pick the dot-interaction function: the CUDA op when it is loaded and a GPU is used,
    else the TensorFlow implementation. `requested` forces one; impossible requests fail
    with an error that says why. With `xla` (the op has no XLA kernel) or `export` (a
    SavedModel must load without the op library) auto means TensorFlow."""
    if requested not in DOT_IMPLEMENTATIONS:
        raise ValueError(f"--dot_interaction must be one of {DOT_IMPLEMENTATIONS}, "
                         f"found '{requested}'")
    if requested == "tensorflow":
        return dot_interact_tf
    has_gpu = not use_cpu and bool(tf.config.list_logical_devices("GPU"))
    if requested == "custom_cuda":
        return _required_op(use_cpu, has_gpu, xla)
    if has_gpu and (xla or export):
        why = ("--xla compiles the interaction and the CUDA op has no XLA kernel" if xla else
               "--mode deploy exports a SavedModel that loads without the op library "
               "(--dot_interaction=custom_cuda keeps the op)")
        print(f"dot interaction: using TensorFlow, since {why}", file=sys.stderr)
        return dot_interact_tf
    if has_gpu:
        op, _ = _load_cuda_op()
        if op is not None and _op_runs(op):
            return op.dot_based_interact
    return dot_interact_tf


def _required_op(use_cpu: bool, has_gpu: bool, xla: bool):
    """The CUDA op for --dot_interaction=custom_cuda, or an error saying why it cannot run."""
    if use_cpu:
        raise ValueError("--dot_interaction=custom_cuda runs on GPUs only; it cannot be "
                         "combined with --cpu (use --dot_interaction=tensorflow)")
    if not has_gpu:
        raise ValueError("--dot_interaction=custom_cuda needs a GPU, and TensorFlow sees "
                         "none (use --dot_interaction=tensorflow)")
    if xla:
        raise ValueError("--dot_interaction=custom_cuda cannot be combined with --xla: the "
                         "CUDA op has no XLA kernel (use --dot_interaction=auto)")
    op, reason = _load_cuda_op()
    if op is None:
        raise ValueError(f"--dot_interaction=custom_cuda: the CUDA op cannot be loaded: "
                         f"{reason}")
    return op.dot_based_interact


def _op_runs(op) -> bool:
    """Run the op once on a tiny input and compare with the reference: a library built for
    another CUDA driver or architecture loads fine but fails (or misbehaves) at launch."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((3, 4, 8)), tf.float32)
    try:
        got = op.dot_based_interact(x, x[:, 0]).numpy()
    except (tf.errors.OpError, RuntimeError) as e:
        print(f"dot interaction: the CUDA op failed a test launch, using TensorFlow ({e})",
              file=sys.stderr)
        return False
    if not np.allclose(got, dot_interact_tf(x, x[:, 0]).numpy(), rtol=1e-2, atol=1e-2):
        print("dot interaction: the CUDA op disagrees with the reference on a test input, "
              "using TensorFlow", file=sys.stderr)
        return False
    return True


class DotInteraction(tf.Module):
    """[bottom output, embeddings] -> dot-interaction features (no trainable weights)."""

    def __init__(self, implementation=dot_interact_tf, name="dot_interaction"):
        super().__init__(name=name)
        self.implementation = implementation

    def output_width(self, num_embeddings: int, dim: int) -> int:
        return dot_output_width(num_embeddings + 1, dim)

    def __call__(self, bottom_mlp_output, embeddings):
        """bottom_mlp_output [B, C]; embeddings: T tensors [B, C]."""
        interaction_input = tf.stack([bottom_mlp_output] + list(embeddings), axis=1)
        return self.implementation(interaction_input, bottom_mlp_output)


class CrossInteraction(tf.Module):
    """DCNv2 low-rank cross network on x0 = [bottom output | flattened embeddings]:
    x_{l+1} = x0 * (V (U x_l) + b) + x_l."""

    def __init__(self, input_width: int, num_layers: int, projection_dim: int, seed: int = 0,
                 name="cross_interaction"):
        super().__init__(name=name)
        if num_layers < 1 or projection_dim < 1:
            raise ValueError(f"cross interaction needs num_cross_layers >= 1 and "
                             f"cross_layer_projection_dim >= 1, found {num_layers}, "
                             f"{projection_dim}")
        self.layers = []
        with self.name_scope:
            for i in range(num_layers):
                u = tf.Variable(glorot_normal(input_width, projection_dim, seed, 1000 + 3 * i),
                                name=f"cross_{i}_u")
                v = tf.Variable(glorot_normal(projection_dim, input_width, seed, 1001 + 3 * i),
                                name=f"cross_{i}_v")
                b = tf.Variable(bias_normal(input_width, seed, 1002 + 3 * i),
                                name=f"cross_{i}_bias")
                self.layers.append((u, v, b))
        self.input_width = input_width

    def named_variables(self):
        out = {}
        for i, (u, v, b) in enumerate(self.layers):
            out[f"cross/{i}/u"], out[f"cross/{i}/v"], out[f"cross/{i}/bias"] = u, v, b
        return out

    def __call__(self, bottom_mlp_output, embeddings, compute_dtype=tf.float32):
        """bottom_mlp_output [B, C]; embeddings: T tensors [B, dim]."""
        x0 = tf.concat([bottom_mlp_output] + list(embeddings), axis=1)
        x = x0
        for u, v, b in self.layers:
            u, v, b = (tf.cast(w, compute_dtype) for w in (u, v, b))
            x = x0 * (tf.matmul(tf.matmul(x, u), v) + b) + x
        return x
