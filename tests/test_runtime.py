"""core.runtime.import_tensorflow: TensorFlow's import without the modules Keras imports
only for features the toolkit does not use, which stay importable afterwards."""
import subprocess
import sys

from conftest import ROOT

PROBE = """
import sys
from core import runtime
runtime.import_tensorflow()
from core.runtime import KERAS_OPTIONAL_IMPORTS
print("tensorflow" in sys.modules, [n for n in KERAS_OPTIONAL_IMPORTS if n in sys.modules])
import sklearn.metrics, matplotlib.pyplot
print(sklearn.metrics.roc_auc_score([0, 1, 1], [0.2, 0.9, 0.4]), matplotlib.pyplot.figure() is not None)
"""


def test_tensorflow_is_imported_without_sklearn_and_pyplot_which_import_afterwards():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["True []", "1.0 True"]
