"""TensorFlow runtime settings, applied before TensorFlow is first imported.

oneDNN kernels are TensorFlow's default only on some x86 CPUs; on the 2-core AMD (AVX2) CI
machines they make the training step about twice as fast (bench/train_throughput.py), so
the toolkit turns them on unless the user set TF_ENABLE_ONEDNN_OPTS already.

One inter-op thread: the DLRM step is a chain of large ops (the MLPs' matmuls), each already
spread over every core by the intra-op pool; run side by side (a layer's two backward
matmuls), they contend for the same cores. One at a time was 10-70 % faster at batch 2048
and 16384 in paired runs on the 2-core VM (bench/results/dlrm_train_throughput.txt).
TF_NUM_INTEROP_THREADS set by the user wins.
"""
from __future__ import annotations

import os

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_NUM_INTEROP_THREADS": "1"}


def configure() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
