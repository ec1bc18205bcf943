"""The absl tools (DLRM's main.py, sim.main, retrieval.main): a flag absl itself refuses (an
unknown flag, an enum's unknown choice, a number below its bound) is one `error:` line naming
the flag, status 2, no traceback, like every other bad input."""
import sys

import pytest

from conftest import bounded_run

TOOLS = {"dlrm": [sys.executable, "main.py"], "sim": [sys.executable, "-m", "sim.main"],
         "retrieval": [sys.executable, "-m", "retrieval.main"]}


@pytest.mark.parametrize("tool,flag,culprit", [
    ("dlrm", "--no_such_flag=1", "no_such_flag"),
    ("dlrm", "--optimizer=nesterov", "--optimizer"),
    ("sim", "--no_such_flag=1", "no_such_flag"),
    ("sim", "--dynamic_min_count=0", "--dynamic_min_count"),
    ("retrieval", "--model=gru4rec", "--model"),
    ("retrieval", "--num_blocks=0", "--num_blocks"),
])
def test_a_flag_absl_refuses_is_one_error_line(tool, flag, culprit):
    proc = bounded_run([*TOOLS[tool], flag], timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and culprit in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "FATAL" not in proc.stderr
