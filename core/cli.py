"""The one-line error convention of the toolkit's command-line tools."""
from __future__ import annotations

import sys


def run_cli(work, errors=(OSError, ValueError)) -> int:
    """Exit status of a tool whose `work()` returns the line to print when it succeeds (or
    None): an expected error (bad input: spec, data, flag, file) prints `error: <message>`
    on stderr and gives 2, without a traceback."""
    try:
        done = work()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done is not None:
        print(done)
    return 0
