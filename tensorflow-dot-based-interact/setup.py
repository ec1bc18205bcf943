"""pip install ./tensorflow-dot-based-interact  (builds the op library with make + nvcc).

TensorFlow's compile/link flags must come from the environment the package is installed
into. Under pip's build isolation this script runs in a throwaway environment without
TensorFlow, so it looks for an interpreter that can import tensorflow, in this order:
  1. $TF_PYTHON
  2. the running interpreter (sys.executable) with pip's isolation variables removed
     (that is the interpreter pip itself runs under, i.e. the target environment)
  3. `python3` on PATH
`pip install --no-build-isolation ./tensorflow-dot-based-interact` avoids the question.
Make variables can be passed through the environment, e.g. ARCHS="80 90" or
CUDART=shared; NVCC / CUDA_HOME select the toolkit.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = "tensorflow_dot_based_interact"
SO = "_dot_based_interact_ops.so"
ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSAFEPATH")


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ISOLATION_VARS}


def _can_import_tf(python, env):
    try:
        subprocess.run([python, "-c", "import tensorflow"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def _tf_python():
    candidates = []
    if os.environ.get("TF_PYTHON"):
        candidates.append(os.environ["TF_PYTHON"])
    candidates.append(sys.executable)
    if shutil.which("python3"):
        candidates.append(shutil.which("python3"))
    env = _clean_env()
    for python in candidates:
        if _can_import_tf(python, env):
            return python, env
    raise RuntimeError(
        "tensorflow_dot_based_interact: no interpreter that can import tensorflow "
        f"(tried {candidates}); set TF_PYTHON=/path/to/python or use "
        "`pip install --no-build-isolation`")


class BuildWithMake(build_py):
    def run(self):
        python, env = _tf_python()
        jobs = str(min(4, os.cpu_count() or 1))
        subprocess.check_call(["make", "-C", HERE, "-j", jobs, "op", f"PYTHON={python}"],
                              env=env)
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a compiled library: platform-specific
        return True


setup(
    name="tensorflow-dot-based-interact",
    version="0.1.0",
    description="Fused CUDA DLRM dot interaction op (forward + gradient) for TensorFlow",
    packages=[PKG],
    package_data={PKG: [SO]},
    include_package_data=False,
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithMake},
    distclass=BinaryDistribution,
    zip_safe=False,
)
