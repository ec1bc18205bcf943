"""The project's own CPU kernels (ops/*.cc), compiled against the installed TensorFlow into
build/ by `python -m core.fused_ops --build` (tools/setup_env.sh runs it). Where a library is not
built, or a variable lives on a GPU, callers take the TensorFlow-op path, which computes the
same thing more slowly: `lazy_adam_rows(var)` returns None then.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
SOURCE = os.path.join(ROOT, "ops", "lazy_adam_rows.cc")
LIBRARY = os.path.join(ROOT, "build", "lazy_adam_rows.so")
DIGEST = LIBRARY + ".sha1"  # the sha1 of the source the library was built from
_loaded = {}


def _source_digest() -> str:
    with open(SOURCE, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def is_current() -> bool:
    """The library exists and was built from the current source."""
    if not os.path.isfile(LIBRARY) or not os.path.isfile(DIGEST):
        return False
    with open(DIGEST) as f:
        return f.read().strip() == _source_digest()


def build() -> str:
    """Compiles the library (staged, then renamed into place); returns its path."""
    os.makedirs(os.path.dirname(LIBRARY), exist_ok=True)
    staged = f"{LIBRARY}.tmp{os.getpid()}"
    # AVX2 + FMA: every x86 machine the toolkit targets has them
    cmd = ["g++", "-O3", "-mavx2", "-mfma", "-shared", "-fPIC", SOURCE, "-o", staged,
           *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line),
                     done.stderr.strip()[-500:])
        raise OSError(f"building {SOURCE} with g++ failed: {first}")
    os.replace(staged, LIBRARY)
    with open(DIGEST, "w") as f:
        f.write(_source_digest() + "\n")
    return LIBRARY


def library():
    """The loaded op library, or None when it is not built from the current source."""
    if "lib" not in _loaded:
        _loaded["lib"] = tf.load_op_library(LIBRARY) if is_current() else None
    return _loaded["lib"]


@tf.autograph.experimental.do_not_convert  # plain Python, called while tracing
def lazy_adam_rows(var):
    """The LazyAdamRows op (ops/lazy_adam_rows.cc) for a float32 table in host memory, else
    None."""
    lib = library()
    if lib is None or var.dtype != tf.float32 or "GPU" in var.device.upper():
        return None
    return lib.lazy_adam_rows


def main():
    from core.cli import run_cli
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="store_true",
                   help="compile what is missing or built from another source")
    build_now = p.parse_args().build and not is_current()
    return run_cli(lambda: f"[setup] built {build()}" if build_now else None)


if __name__ == "__main__":
    sys.exit(main())
