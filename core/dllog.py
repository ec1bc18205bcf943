"""Logging in the DLLogger JSON-lines format (`DLLL {json}` records), plus stdout.

Each record: {"timestamp", "datetime", "elapsedtime", "type": "PARAMETER"|"LOG", "step",
"data"}; progress records have step [epoch, step], final metrics step [].
"""
from __future__ import annotations

import datetime
import json
import os
import time

PREFIX = "DLLL "


class DLLogger:
    def __init__(self, log_path: str = None, enabled: bool = True, stdout: bool = True):
        self.enabled, self.stdout = enabled, stdout
        self.start = time.time()
        self._file = None
        if enabled and log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            self._file = open(log_path, "a", buffering=1)

    def _record(self, kind: str, step, data: dict) -> None:
        if not self.enabled:
            return
        now = time.time()
        record = {"timestamp": f"{now:.6f}",
                  "datetime": datetime.datetime.fromtimestamp(now).isoformat(),
                  "elapsedtime": round(now - self.start, 6), "type": kind, "step": step,
                  "data": data}
        if self._file:
            self._file.write(PREFIX + json.dumps(record) + "\n")

    def parameters(self, params: dict) -> None:
        self._record("PARAMETER", "PARAMETER", params)

    def log(self, step, data: dict) -> None:
        """step: a tuple like (epoch, step) for progress, () for final metrics."""
        self._record("LOG", list(step) if isinstance(step, (tuple, list)) else step, data)

    def print(self, message: str) -> None:
        if self.enabled and self.stdout:
            print(message, flush=True)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def read_log(path: str) -> list:
    """All DLLL records of a log file (other lines are skipped)."""
    records = []
    with open(path) as f:
        for line in f:
            if line.startswith(PREFIX):
                records.append(json.loads(line[len(PREFIX):]))
    return records
