"""Building blocks shared by the families' models: the MLP and the embedding table variable."""
from __future__ import annotations

import tensorflow as tf

from core.initializers import bias_normal, embedding_uniform_chunks, glorot_normal


class MLP(tf.Module):
    """Dense layers (glorot-normal kernels, normal biases), ReLU between them and after
    the last one when relu_last."""

    def __init__(self, input_width: int, widths, relu_last: bool, seed: int, key: int,
                 name: str):
        super().__init__(name=name)
        self.layers, self.relu_last = [], relu_last
        with self.name_scope:
            for i, width in enumerate(widths):
                kernel = tf.Variable(glorot_normal(input_width, width, seed, key + 2 * i),
                                     name=f"kernel_{i}")
                bias = tf.Variable(bias_normal(width, seed, key + 2 * i + 1), name=f"bias_{i}")
                self.layers.append((kernel, bias))
                input_width = width

    def named_variables(self, prefix: str) -> dict:
        out = {}
        for i, (kernel, bias) in enumerate(self.layers):
            out[f"{prefix}/{i}/kernel"], out[f"{prefix}/{i}/bias"] = kernel, bias
        return out

    def __call__(self, x, compute_dtype=tf.float32):
        for i, (kernel, bias) in enumerate(self.layers):
            # bias_add (not +) lets Grappler fuse MatMul+BiasAdd(+Relu) into one kernel
            x = tf.nn.bias_add(tf.matmul(x, tf.cast(kernel, compute_dtype)),
                               tf.cast(bias, compute_dtype))
            if self.relu_last or i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x


def table_variable(rows: int, dim: int, seed: int, table: int, col_start: int = 0,
                   col_stop: int = None, trainable: bool = True, name: str = None,
                   row_start: int = 0, row_stop: int = None) -> tf.Variable:
    """Rows [row_start, row_stop) and columns [col_start, col_stop) of embedding table `table`
    (of `rows` rows) as a plain tf.Variable (looked up with tf.nn.embedding_lookup, updated by
    sparse row updates), initialised uniform in +-sqrt(1/rows). Filled in row chunks: a whole
    numpy copy would double peak host memory."""
    col_stop = dim if col_stop is None else col_stop
    row_stop = rows if row_stop is None else row_stop
    var = tf.Variable(tf.zeros([row_stop - row_start, col_stop - col_start]),
                      trainable=trainable, name=name)
    for start, block in embedding_uniform_chunks(rows, dim, seed, table, col_start, col_stop,
                                                 row_start, row_stop):
        # the raw op writes in place; var[a:b].assign() first reads the variable, and that
        # shared buffer makes the write copy the whole table
        tf.raw_ops.ResourceStridedSliceAssign(ref=var.handle, begin=[start],
                                              end=[start + block.shape[0]], strides=[1],
                                              value=block)
    return var


def copy_rare_row(var, rows: int, dim: int, seed: int, table: int) -> None:
    """Row 0 of var, a rank's share of dynamic table `table` (of `rows` rows), becomes the
    whole table's row 0: every share holds a copy of the rare row."""
    _, row = next(embedding_uniform_chunks(rows, dim, seed, table, row_stop=1))
    var.scatter_update(tf.IndexedSlices(row, [0]))
