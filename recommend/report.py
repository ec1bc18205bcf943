"""Two-stage test figures beside retrieval alone, one markdown table per protocol (every item
ranked; seen items removed, the target kept), each from the runs' results.json: the final
lists of recommend.main at the epoch chosen on validation, and "retrieval", the retrieval
model's own figures on the same users.

  python -m recommend.report OUT_HSTU_RANKER OUT_DIN_RANKER [...]

Each OUT is a recommend.main --output_dir or a directory of such runs, one per seed (their
mean is shown); every OUT must rerank the same retrieval runs (their retrieval figures agree),
whose mean is the first row.
"""
from __future__ import annotations

import json
import os
import sys

from core.cli import run_cli
from retrieval.report import runs_of

PROTOCOLS = (("test", "Every item ranked (seen items kept)"),
             ("test_filtered", "Seen items removed (the target kept)"))
COLUMNS = (("hr@10", "R@10"), ("ndcg@10", "N@10"))


def means(path: str, split: str) -> tuple:
    """(the runs' mean final-list figures, their retrieval's, how many runs)."""
    runs = [json.load(open(file)) for file in runs_of(path)]
    for file, run in zip(runs_of(path), runs):
        if "retrieval" not in run:
            raise ValueError(f"{file}: no \"retrieval\" figures: not a recommend.main run")

    def mean(pick):
        return {k: sum(pick(r)[split][k] for r in runs) / len(runs) for k, _ in COLUMNS}
    return mean(lambda r: r), mean(lambda r: r["retrieval"]), len(runs)


def row(name: str, source: str, figures: dict, alone: dict, bold: bool = False) -> str:
    mark = "**" if bold else ""
    cells = [f"{mark}{figures[k]:.4f}{mark}" for k, _ in COLUMNS]
    change = 100 * (figures["ndcg@10"] / alone["ndcg@10"] - 1)
    return f"| {name} | {source} | " + " | ".join(cells) + f" | {change:+.1f} % |"


def list_name(path: str) -> str:
    """A directory of runs by its name (hstu_ranker); one run by its parent's too
    (hstu_ranker/seed_1: its own name is often only the seed)."""
    parts = os.path.normpath(path).split(os.sep)
    one_run = os.path.isfile(os.path.join(path, "results.json"))
    return "/".join(parts[-2:] if one_run else parts[-1:])


def table(paths: list, split: str, title: str) -> str:
    found = [(path, *means(path, split)) for path in paths]
    alone, count = found[0][2], found[0][3]
    for path, _, retrieval, n in found[1:]:
        if retrieval != alone or n != count:
            raise ValueError(f"{path} reranks other retrieval runs than {paths[0]} (their "
                             f"retrieval figures differ): compare runs over the same ones")
    seeds = f"mean of {count} seeds" if count > 1 else "1 seed"
    heads = " | ".join(h for _, h in COLUMNS)
    lines = [f"**{title}**", "", f"| list | runs | {heads} | N@10 against retrieval's |",
             "|---|---|" + "---|" * (len(COLUMNS) + 1),
             row("retrieval alone", f"the retrieval runs reranked below, {seeds}", alone, alone)]
    lines += [row(f"two-stage: {list_name(path)}", f"{path}, {seeds}", figures, alone,
                  bold=True) for path, figures, _, _ in found]
    return "\n".join(lines)


def report(paths: list) -> str:
    return "\n\n".join(table(paths, split, title) for split, title in PROTOCOLS)


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv

    def work():
        if not paths:
            raise ValueError("usage: python -m recommend.report OUT [OUT ...]")
        return report(paths)
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
