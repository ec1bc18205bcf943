"""TensorFlow runtime settings, applied before TensorFlow is first imported.

oneDNN kernels are TensorFlow's default only on some x86 CPUs; on the 2-core AMD (AVX2) CI
machines they make the training step about twice as fast (bench/train_throughput.py), so
the toolkit turns them on unless the user set TF_ENABLE_ONEDNN_OPTS already.

TensorFlow's import loads all of Keras (for its optimizers' SavedModel registrations), and
Keras loads scikit-learn and matplotlib's pyplot when they are installed; the toolkit uses
none of them (its models, optimizers and SavedModels are tf.Module and tf.Variable): 2 s of
TensorFlow's 5.5 s import on a 2-core AMD EPYC, paid by every process (each rank, each tool).
import_tensorflow() (the training CLIs' first call) imports TensorFlow with Keras hidden from
it; Keras (and tf.keras) import normally afterwards. Horovod's TensorFlow module needs Keras
(its SyncBatchNormalization subclasses a Keras layer): import_horovod() loads it without
Keras's optional imports. configure() alone imports nothing: tools that may not need
TensorFlow call that.

TensorFlow 2.18+ logs its start-up through absl before absl's logging is initialised, where
TF_CPP_MIN_LOG_LEVEL has no effect: every import wrote absl's preamble and an INFO line on
oneDNN to stderr, twice, ahead of a CLI's one-line `error:`. import_tensorflow() applies the
variable's level to the lines the import writes.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
KERAS_OPTIONAL_IMPORTS = ("sklearn", "matplotlib.pyplot")
# --amp on a CPU: `auto` (bfloat16 where the CPU multiplies bfloat16 natively: AMX-BF16 or
# AVX512_BF16; float32 elsewhere, where bfloat16 is emulated and slower), or `bfloat16`
CPU_AMP_VARIABLE = "DLRM_CPU_AMP"
CPU_AMP_CHOICES = ("auto", "bfloat16")


def configure() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def import_tensorflow() -> None:
    """configure(), then TensorFlow's import without Keras."""
    configure()
    if "tensorflow" in sys.modules:
        return
    with hidden_from_import(("keras",)):
        _import_at_log_level()


def import_horovod():
    """horovod.tensorflow, with the Keras it loads spared Keras's optional imports."""
    import_tensorflow()
    with hidden_from_import(KERAS_OPTIONAL_IMPORTS):
        import horovod.tensorflow as hvd
    return hvd


@contextlib.contextmanager
def hidden_from_import(names):
    """Within the block, `import name` raises ImportError for each of names not imported
    yet (the importer skips what it treats as optional); afterwards they import normally."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in hidden:
            del sys.modules[name]


ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called"


def _below_level(line: str, level: int) -> bool:
    """Whether TF_CPP_MIN_LOG_LEVEL `level` hides this line of absl's (0 shows all; 1 hides
    INFO, 2 also WARNING, 3 also ERROR)."""
    if line.startswith(ABSL_PREAMBLE):
        return level > 0
    severity = re.match(r"([IWEF])\d{4} ", line)
    return bool(severity) and "IWEF".index(severity.group(1)) < level


def _import_at_log_level() -> None:
    """import tensorflow with its stderr (file descriptor 2: the C++ side writes there)
    caught in a file, then written out less the lines below TF_CPP_MIN_LOG_LEVEL."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    level = int(level) if level.isdigit() else 0
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _below_level(line, level)))
            sys.stderr.flush()


def cpu_flags(path: str = "/proc/cpuinfo") -> set:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")  # Intel AMX tiles; AMD Zen 4 / Intel dot products


def native_bfloat16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware: on such an AMD EPYC (AVX512_BF16, no
    AMX) --amp's DLRM step ran 1.7x faster than float32 (bench/train_throughput.py)."""
    return bool(set(BFLOAT16_FLAGS) & cpu_flags())


def cpu_amp_dtype() -> str:
    """What --amp computes in on this CPU: 'bfloat16' or 'float32' (see CPU_AMP_VARIABLE)."""
    choice = os.environ.get(CPU_AMP_VARIABLE, "auto")
    if choice not in CPU_AMP_CHOICES:
        raise ValueError(f"{CPU_AMP_VARIABLE} must be one of {list(CPU_AMP_CHOICES)}, found "
                         f"{choice!r}")
    return "bfloat16" if choice == "bfloat16" or native_bfloat16_matmul() else "float32"

