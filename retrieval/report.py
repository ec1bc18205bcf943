"""Our runs' test figures beside the published ones on Amazon Beauty (leave-one-out, full
ranking), as a markdown table.

  python -m retrieval.report OUT_SASREC OUT_HSTU [...]

Each OUT is a training run's --output_dir (its results.json: the test figures of the epoch
chosen on validation) or a directory of such runs, one per seed (their mean is shown).
"""
from __future__ import annotations

import glob
import json
import os
import sys

from core.cli import run_cli

# Beauty, R@5 / N@5 / R@10 / N@10 as published (the sources' own rounding)
PUBLISHED = [
    ("SASRec", "TIGER paper's baseline table (from P5)", (.0387, .0249, .0605, .0318)),
    ("S3-Rec", "TIGER paper's baseline table", (.0387, .0244, .0647, .0327)),
    ("TIGER", "Rajput et al., NeurIPS 2023", (.0454, .0321, .0648, .0384)),
    ("SASRec (cross-entropy over all items)", "phonism/genrec README", (.0469, .0305, .0688,
                                                                         .0375)),
    ("HSTU", "phonism/genrec README", (.0486, .0340, .0708, .0412)),
]
COLUMNS = ("hr@5", "ndcg@5", "hr@10", "ndcg@10")


def runs_of(path: str) -> list:
    """The results.json files of a run directory, or of the runs (one per seed) under it."""
    own = os.path.join(path, "results.json")
    found = [own] if os.path.isfile(own) else sorted(
        glob.glob(os.path.join(path, "*", "results.json")))
    if not found:
        raise ValueError(f"{path}: no results.json in it or in its subdirectories")
    return found


def mean_test(path: str) -> tuple:
    """(the runs' mean test figures, how many runs)."""
    runs = [json.load(open(f)) for f in runs_of(path)]
    mean = {k: sum(r["test"][k] for r in runs) / len(runs) for k in COLUMNS}
    return mean, len(runs)


def table(paths: list) -> str:
    lines = ["| model | source | R@5 | N@5 | R@10 | N@10 |", "|---|---|---|---|---|---|"]
    lines += [f"| {m} | {s} | " + " | ".join(f"{v:.4f}" for v in figures) + " |"
              for m, s, figures in PUBLISHED]
    for path in paths:
        mean, n = mean_test(path)
        lines.append(f"| **{os.path.basename(os.path.normpath(path))} (this toolkit)** | "
                     f"{path}, test at the epoch chosen on validation"
                     f"{f', mean of {n} seeds' if n > 1 else ''} | "
                     + " | ".join(f"**{mean[k]:.4f}**" for k in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv

    def work():
        if not paths:
            raise ValueError("usage: python -m retrieval.report OUT [OUT ...]")
        return table(paths)
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
