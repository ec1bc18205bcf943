"""Seconds each test file took, from a pytest run's `--durations=0` report, into
tests/file_seconds.json (tests/conftest.py starts the longest files first):

  make test PYTEST_ARGS=--durations=0 > LOG; .venv/bin/python tools/file_seconds.py LOG
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "file_seconds.json")
LINE = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+\.py)::")


def main(log: str) -> int:
    seconds = {}
    with open(log) as f:
        for line in f:
            match = LINE.match(line)
            if match:
                path = match.group(2)
                seconds[path] = seconds.get(path, 0.0) + float(match.group(1))
    if not seconds:
        sys.exit(f"error: {log} holds no `--durations=0` report lines")
    ordered = {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    with open(OUT + ".tmp", "w") as f:
        json.dump(ordered, f, indent=1)
        f.write("\n")
    os.replace(OUT + ".tmp", OUT)
    print(f"{len(ordered)} files, {sum(ordered.values()):.0f} s in all -> {OUT}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
