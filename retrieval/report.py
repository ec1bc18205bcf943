"""Our runs' test figures beside the published ones on Amazon Beauty (leave-one-out, full
ranking), one markdown table per protocol, each beside that protocol's anchors only: every
item ranked (the user's seen items stay candidates) and seen items removed (the target kept).
Figures of one protocol are never compared with the other's.

  python -m retrieval.report OUT_SASREC OUT_HSTU [...]

Each OUT is a training run's --output_dir (its results.json: the test figures of the epoch
chosen on validation) or a directory of such runs, one per seed (their mean is shown).
"""
from __future__ import annotations

import glob
import json
import os
import sys
from typing import NamedTuple

from core.cli import run_cli


class Protocol(NamedTuple):
    key: str  # of results.json
    title: str
    columns: tuple  # results.json keys shown
    published: list  # (model, source, figures in the columns' order, the sources' rounding)


GENREC = "phonism/genrec README"
ESASREC = "eSASRec benchmark, RecSys 2025 (blondered/transformer_benchmark)"
PROTOCOLS = (
    Protocol("test", "Every item ranked (seen items kept)", ("hr@5", "ndcg@5", "hr@10", "ndcg@10"),
             [("SASRec", "TIGER paper's baseline table (from P5)", (.0387, .0249, .0605, .0318)),
              ("S3-Rec", "TIGER paper's baseline table", (.0387, .0244, .0647, .0327)),
              ("TIGER", "Rajput et al., NeurIPS 2023", (.0454, .0321, .0648, .0384)),
              ("SASRec (cross-entropy over all items)", GENREC, (.0469, .0305, .0688, .0375)),
              ("HSTU", GENREC, (.0486, .0340, .0708, .0412)),
              ("LC-Rec", GENREC, (.0525, .0352, .0791, .0438))]),
    Protocol("test_filtered", "Seen items removed (the target kept)", ("hr@10", "ndcg@10"),
             [("SASRec (sampled softmax, 256 negatives)", ESASREC, (.0921, .0531)),
              ("eSASRec", ESASREC, (.0928, .0523))]),
)
HEADERS = {"hr@5": "R@5", "ndcg@5": "N@5", "hr@10": "R@10", "ndcg@10": "N@10"}


def runs_of(path: str) -> list:
    """The results.json files of a run directory, or of the runs (one per seed) under it."""
    own = os.path.join(path, "results.json")
    found = [own] if os.path.isfile(own) else sorted(
        glob.glob(os.path.join(path, "*", "results.json")))
    if not found:
        raise ValueError(f"{path}: no results.json in it or in its subdirectories")
    return found


def mean_figures(path: str, protocol: Protocol) -> tuple:
    """(the runs' mean figures of one protocol, how many runs)."""
    figures = []
    for file in runs_of(path):
        results = json.load(open(file))
        if protocol.key not in results:
            raise ValueError(f"{file}: no \"{protocol.key}\" figures (a run from before both "
                             f"protocols were reported: rerun it, or retrieval.main --mode eval)")
        figures.append(results[protocol.key])
    return {k: sum(f[k] for f in figures) / len(figures) for k in protocol.columns}, len(figures)


def table(paths: list, protocol: Protocol) -> str:
    heads = " | ".join(HEADERS[k] for k in protocol.columns)
    lines = [f"**{protocol.title}**", "", f"| model | source | {heads} |",
             "|---|---|" + "---|" * len(protocol.columns)]
    lines += [f"| {m} | {s} | " + " | ".join(f"{v:.4f}" for v in figures) + " |"
              for m, s, figures in protocol.published]
    for path in paths:
        mean, n = mean_figures(path, protocol)
        lines.append(f"| **{os.path.basename(os.path.normpath(path))} (this toolkit)** | "
                     f"{path}, test at the epoch chosen on validation"
                     f"{f', mean of {n} seeds' if n > 1 else ', 1 seed'} | "
                     + " | ".join(f"**{mean[k]:.4f}**" for k in protocol.columns) + " |")
    return "\n".join(lines)


def report(paths: list) -> str:
    return "\n\n".join(table(paths, protocol) for protocol in PROTOCOLS)


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv

    def work():
        if not paths:
            raise ValueError("usage: python -m retrieval.report OUT [OUT ...]")
        return report(paths)
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
