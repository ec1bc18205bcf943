"""Logging in the DLLogger JSON-lines format (`DLLL {json}` records), plus stdout.

Each record: {"timestamp", "datetime", "elapsedtime", "type": "PARAMETER"|"LOG", "step",
"data"}; progress records have step [epoch, step], final metrics step [].
"""
from __future__ import annotations

import datetime
import json
import os
import time

from core.files import write_error

PREFIX = "DLLL "


class DLLogger:
    def __init__(self, log_path: str = None, enabled: bool = True, stdout: bool = True):
        self.enabled, self.stdout = enabled, stdout
        self.start = time.time()
        self._file, self.path = None, log_path
        if enabled and log_path:
            self._created = not os.path.exists(log_path)
            try:
                os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
                self._file = open(log_path, "a", buffering=1)
            except OSError as e:
                raise write_error(log_path, e) from None

    def _record(self, kind: str, step, data: dict) -> None:
        if not self.enabled:
            return
        now = time.time()
        record = {"timestamp": f"{now:.6f}",
                  "datetime": datetime.datetime.fromtimestamp(now).isoformat(),
                  "elapsedtime": round(now - self.start, 6), "type": kind, "step": step,
                  "data": data}
        if self._file:
            try:
                self._file.write(PREFIX + json.dumps(record) + "\n")
            except OSError as e:  # a full disk: one line naming the log, no empty log left
                self._abandon()
                raise write_error(self.path, e) from None

    def _abandon(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None
        if self._created and os.path.exists(self.path) and not os.path.getsize(self.path):
            os.unlink(self.path)

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


def logged_parameters(path: str) -> dict:
    """The parameters a run logged first (its PARAMETER record's data; {} when it has none)."""
    found = [r["data"] for r in read_log(path) if r.get("type") == "PARAMETER"]
    return found[0] if found else {}
