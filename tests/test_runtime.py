"""core.runtime.import_tensorflow: TensorFlow's import without Keras (nor what Keras imports:
scikit-learn, pyplot), which the toolkit does not use and which stay importable afterwards,
and with its start-up log lines at TF_CPP_MIN_LOG_LEVEL's level."""
import os
import subprocess
import sys

from conftest import HOROVODRUN, ROOT, require_or_skip

PROBE = """
import sys
from core import runtime
runtime.import_tensorflow()
print("tensorflow" in sys.modules,
      [n for n in ("keras", "sklearn", "matplotlib.pyplot") if n in sys.modules])
import sklearn.metrics, matplotlib.pyplot, keras, tensorflow as tf
print(sklearn.metrics.roc_auc_score([0, 1, 1], [0.2, 0.9, 0.4]), matplotlib.pyplot.figure() is not None)
print(tf.keras.layers.Dense(3)(tf.ones([2, 4])).shape, keras.layers.Dense is tf.keras.layers.Dense)
"""


def test_tensorflow_is_imported_without_keras_sklearn_and_pyplot_which_import_afterwards():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == ["True []", "1.0 True", "(2, 3) True"]


HOROVOD = """
import sys
from core import runtime
hvd = runtime.import_horovod()
hvd.init()
print(hvd.size(), [n for n in ("keras", "sklearn", "matplotlib.pyplot") if n in sys.modules])
import sklearn.metrics
print(sklearn.metrics.roc_auc_score([0, 1, 1], [0.2, 0.9, 0.4]))
"""


def test_horovod_is_imported_with_its_keras_but_without_sklearn_and_pyplot():
    require_or_skip(os.path.isfile(HOROVODRUN), "horovod is not installed")
    proc = subprocess.run([sys.executable, "-c", HOROVOD], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["1 ['keras']", "1.0"]


QUIET = """
import sys
from core import runtime
runtime.import_tensorflow()
print("after the import", file=sys.stderr)
"""


def test_import_writes_only_the_log_lines_at_or_above_the_level():
    def stderr(level):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=level, TF_ENABLE_ONEDNN_OPTS="1")
        proc = subprocess.run([sys.executable, "-c", QUIET], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr
    assert stderr("2") == "after the import\n"  # the toolkit's default
    # level 0 shows TensorFlow's INFO line on oneDNN, which the pinned TensorFlow logs
    shown = stderr("0").splitlines()
    assert shown[-1] == "after the import"
    assert any(line.startswith("I") and "oneDNN custom operations are on" in line
               for line in shown)
