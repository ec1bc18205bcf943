"""float64 numpy reference for the DLRM dot interaction (no TensorFlow, no GPU).

Layout of one output row (width = roundup8(R*(R-1)/2 + C)):
    [ bottom_mlp_output (C) | <x_i, x_j> for i > j in row-major order | zeros ]
i.e. pairs (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), ...
"""
import numpy as np


def output_width(R, C):
    n = R * (R - 1) // 2 + C
    return (n + 7) // 8 * 8


def lower_pairs(R):
    """(rows, cols) of the strictly lower triangle, row-major, built by plain loops."""
    rows, cols = [], []
    for i in range(R):
        for j in range(i):
            rows.append(i)
            cols.append(j)
    return np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)


def forward(x, bottom):
    """x [B, R, C], bottom [B, C] (any float dtype) -> float64 [B, width]."""
    x = np.asarray(x, dtype=np.float64)
    bottom = np.asarray(bottom, dtype=np.float64)
    B, R, C = x.shape
    rows, cols = lower_pairs(R)
    z = np.matmul(x, np.swapaxes(x, 1, 2))  # [B, R, R]
    out = np.zeros((B, output_width(R, C)), dtype=np.float64)
    out[:, :C] = bottom
    out[:, C:C + len(rows)] = z[:, rows, cols]
    return out


def backward(x, grad):
    """x [B, R, C], grad [B, width] -> (grad_x [B, R, C], grad_bottom [B, C]) float64.

    grad_x[b, k] = sum over pairs containing k of grad(pair) * x[b, other].
    """
    x = np.asarray(x, dtype=np.float64)
    grad = np.asarray(grad, dtype=np.float64)
    B, R, C = x.shape
    rows, cols = lower_pairs(R)
    g = grad[:, C:C + len(rows)]
    s = np.zeros((B, R, R), dtype=np.float64)
    s[:, rows, cols] = g
    s[:, cols, rows] = g
    return np.matmul(s, x), grad[:, :C].copy()


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out has a non-finite value."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    if den == 0.0:
        return float(num)
    return float(num / den)
