"""TensorFlow runtime settings, applied before TensorFlow is first imported.

oneDNN kernels are TensorFlow's default only on some x86 CPUs; on the 2-core AMD (AVX2) CI
machines they make the training step about twice as fast (bench/train_throughput.py), so
the toolkit turns them on unless the user set TF_ENABLE_ONEDNN_OPTS already.
"""
from __future__ import annotations

import os

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def configure() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
