"""The project's own CPU kernels (ops/<name>.cc -> build/<name>.so), compiled against the
installed TensorFlow by `python -m core.fused_ops --build` (tools/setup_env.sh runs it).
Where a library is not built, or the work runs on a GPU, callers take the TensorFlow-op
path, which computes the same thing more slowly: `lazy_adam_rows(var)`, `sgd_rows(var)` and
`recurrent_cells()` return None then, `segment_sum_rows` and `distinct_ids` call
TensorFlow's ops.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# one library per source: build/<name>.so from ops/<name>.cc
KERNELS = ("lazy_adam_rows", "sgd_rows", "recurrent_cells", "segment_sum_rows", "distinct_ids",
           "tiled_softmax", "hash_dropout")
_loaded = {}


def source(name: str) -> str:
    return os.path.join(ROOT, "ops", f"{name}.cc")


def library_path(name: str) -> str:
    return os.path.join(ROOT, "build", f"{name}.so")


def _digest_path(name: str) -> str:  # the digest of what the library was built from
    return library_path(name) + ".sha1"


# AVX2 + FMA: every x86 machine the toolkit targets has them. No errno from math functions:
# with it g++ calls sqrtf per element (LazyAdamRows' loop 3.8x slower, unvectorized).
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-math-errno")


def _source_digest(name: str) -> str:
    """The sha1 of the source, the flags and TensorFlow's version: a change of any rebuilds
    the library (one built against another TensorFlow fails to load: its ABI differs)."""
    with open(source(name), "rb") as f:
        return hashlib.sha1(f.read() + " ".join(COMPILE_FLAGS).encode()
                            + tf.__version__.encode()).hexdigest()


def is_current(name: str) -> bool:
    """The library exists and was built from the current source."""
    if not os.path.isfile(library_path(name)) or not os.path.isfile(_digest_path(name)):
        return False
    with open(_digest_path(name)) as f:
        return f.read().strip() == _source_digest(name)


def build(name: str) -> str:
    """Compiles one library (staged, then renamed into place); returns its path."""
    target = library_path(name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staged = f"{target}.tmp{os.getpid()}"
    cmd = ["g++", *COMPILE_FLAGS, "-shared", "-fPIC", source(name), "-o", staged,
           *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line),
                     done.stderr.strip()[-500:])
        raise OSError(f"building {source(name)} with g++ failed: {first}")
    os.replace(staged, target)
    with open(_digest_path(name), "w") as f:
        f.write(_source_digest(name) + "\n")
    return target


def library(name: str):
    """The loaded op library, or None when it is not built from the current source."""
    if name not in _loaded:
        _loaded[name] = tf.load_op_library(library_path(name)) if is_current(name) else None
    return _loaded[name]


@tf.autograph.experimental.do_not_convert  # plain Python, called while tracing
def lazy_adam_rows(var):
    """The LazyAdamRows op (ops/lazy_adam_rows.cc) for a float32 table in host memory, else
    None."""
    lib = library("lazy_adam_rows")
    if lib is None or var.dtype != tf.float32 or "GPU" in var.device.upper():
        return None
    return lib.lazy_adam_rows


@tf.autograph.experimental.do_not_convert
def sgd_rows(var):
    """The SgdRows op (ops/sgd_rows.cc) for a float32 table in host memory, else None."""
    lib = library("sgd_rows")
    if lib is None or var.dtype != tf.float32 or "GPU" in var.device.upper():
        return None
    return lib.sgd_rows


@tf.autograph.experimental.do_not_convert
def recurrent_cells(dtype=tf.float32):
    """The GRU / AUGRU sequence ops (ops/recurrent_cells.cc) for float32 compute on a CPU, else
    None."""
    return cpu_library("recurrent_cells") if dtype == tf.float32 else None


def cpu_library(name: str):
    """The loaded library where the work runs on a CPU (no GPU visible), else None."""
    return None if tf.config.list_logical_devices("GPU") else library(name)


@tf.autograph.experimental.do_not_convert
def segment_sum_rows(data, segment_ids, num_segments):
    """tf.math.unsorted_segment_sum(data, segment_ids, num_segments) for 1-D segment ids:
    the SegmentSumRows op (ops/segment_sum_rows.cc: the same sums, bit for bit, 3-5x
    faster) for float32 on a CPU, else TensorFlow's op."""
    lib = cpu_library("segment_sum_rows")
    if lib is None or data.dtype != tf.float32:
        return tf.math.unsorted_segment_sum(data, segment_ids, num_segments)
    return lib.segment_sum_rows(data, segment_ids, tf.cast(num_segments, tf.int64))


@tf.autograph.experimental.do_not_convert
def gather_segment_sum_rows(data, indices, segment_ids, num_segments, sorted_ids=False):
    """The sums of data[indices[i]] per segment_ids[i] (num_segments rows) without the
    gathered copy: the GatherSegmentSumRows op (ops/segment_sum_rows.cc) for float32 on a CPU,
    else TensorFlow's ops. sorted_ids False: segment_sum_rows(tf.gather(data, indices),
    segment_ids, num_segments), bit for bit; True (segment_ids sorted):
    tf.sparse.segment_sum(data, indices, segment_ids, num_segments), bit for bit."""
    lib = cpu_library("segment_sum_rows")
    if lib is None or data.dtype != tf.float32:
        if sorted_ids:
            return tf.sparse.segment_sum(data, indices, segment_ids, num_segments=num_segments)
        return segment_sum_rows(tf.gather(data, indices), segment_ids, num_segments)
    if indices.dtype != segment_ids.dtype:
        indices, segment_ids = tf.cast(indices, tf.int64), tf.cast(segment_ids, tf.int64)
    return lib.gather_segment_sum_rows(data, indices, segment_ids,
                                       tf.cast(num_segments, tf.int64), grouped=sorted_ids)


@tf.autograph.experimental.do_not_convert
def distinct_ids(ids, num_rows: int):
    """tf.unique(ids) (distinct in order of first appearance, int32 positions) for the 1-D
    ids of a table of num_rows rows: the DistinctIds op (ops/distinct_ids.cc, no hashing
    for tables up to 8 rows per id) on a CPU, else TensorFlow's Unique."""
    lib = cpu_library("distinct_ids")
    if lib is None:
        return tf.unique(ids)
    return lib.distinct_ids(ids, tf.constant(num_rows, tf.int64))


# The forward pass keeps its exponentials for the gradient up to this many floats (256 MB):
# reading them back costs less than making them again (one of the softmax's four matrix
# products, and an exp per logit). Beyond it (a large catalogue) the gradient makes each
# tile's logits again.
KEPT_LIMIT = 1 << 26


@tf.autograph.experimental.do_not_convert
def softmax_cross_entropy_rows(queries, table, labels, first_row: int = 0):
    """Per row p: the softmax cross-entropy of the logits queries[p] . table[n] over every row
    n >= first_row of the table at labels[p] (int64, counted from first_row), float32 [P],
    differentiable in queries and table (0 in the rows before first_row: a padding row stays
    in the table, never sliced off and padded back). On a CPU the TiledSoftmaxLoss op
    (ops/tiled_softmax.cc) makes the [P, N] logits a tile of rows at a time (forward and
    backward), never whole; else TensorFlow's ops."""
    lib = cpu_library("tiled_softmax")
    if lib is None or queries.dtype != tf.float32 or table.dtype != tf.float32:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(queries, table[first_row:], transpose_b=True))

    @tf.custom_gradient
    def loss(queries, table):
        per_row, lse, exps, shifts = lib.tiled_softmax_loss(queries, table, labels,
                                                            first_row=first_row,
                                                            kept_limit=KEPT_LIMIT)

        def grad(upstream):
            return lib.tiled_softmax_loss_grad(queries, table, labels, lse, upstream, exps,
                                               shifts, first_row=first_row)
        return per_row, grad
    return loss(queries, table)


@tf.RegisterGradient("SegmentSumRows")
def _segment_sum_rows_grad(op, grad):
    return tf.gather(grad, op.inputs[1]), None, None


def main():
    from core.cli import run_cli
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="store_true",
                   help="compile what is missing or built from another source or flags")
    stale = [n for n in KERNELS if not is_current(n)] if p.parse_args().build else []

    def build_stale():  # one g++ per core: each takes 15-20 s of a core
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return "\n".join(f"[setup] built {path}" for path in pool.map(build, stale)) or None
    return run_cli(build_stale)


if __name__ == "__main__":
    sys.exit(main())
