"""retrieval.report: each protocol's table holds that protocol's anchors only and the mean of
the seeds' results.json; the README's results tables are its output over the committed runs."""
import json
import os
import re
import subprocess
import sys

import numpy as np

from conftest import ROOT, bash_lines

KEYS = ("hr@1", "hr@5", "hr@10", "hr@20", "hr@50", "ndcg@5", "ndcg@10", "ndcg@20", "ndcg@50",
        "mrr")
SPLITS = ("valid", "test", "valid_filtered", "test_filtered")


def write_seeds(root, figures: np.ndarray) -> None:
    """One seed_i/results.json per row of figures [seeds, splits, keys]."""
    for seed, per_split in enumerate(figures):
        os.makedirs(root / f"seed_{seed}")
        results = {split: dict(zip(KEYS, map(float, values)))
                   for split, values in zip(SPLITS, per_split)}
        (root / f"seed_{seed}" / "results.json").write_text(json.dumps(dict(results,
                                                                            best_epoch=3)))


def report(*paths):
    return subprocess.run([sys.executable, "-m", "retrieval.report", *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def rows_of(table: str) -> dict:
    """{model cell: [figure cells]} of a markdown table's body."""
    cells = [[c.strip().strip("*") for c in line.strip("|").split("|")]
             for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return {row[0]: [float(c) for c in row[2:]] for row in cells[1:]}


def test_each_protocol_shows_its_own_anchors_and_the_seeds_mean(tmp_path):
    figures = np.random.default_rng(0).uniform(0, 0.2, (3, len(SPLITS), len(KEYS)))
    write_seeds(tmp_path / "mine", figures)
    proc = report(tmp_path / "mine")
    assert proc.returncode == 0, proc.stderr
    every_item, seen_removed = proc.stdout.split("**Seen items removed")
    every, removed = rows_of(every_item), rows_of(seen_removed)
    assert "LC-Rec" in every and "eSASRec" not in every
    assert "eSASRec" in removed and "LC-Rec" not in removed and "HSTU" not in removed
    mean = figures.mean(0)
    columns = [KEYS.index(k) for k in ("hr@5", "ndcg@5", "hr@10", "ndcg@10")]
    np.testing.assert_allclose(every["mine (this toolkit)"], mean[1, columns], atol=5e-5)
    np.testing.assert_allclose(removed["mine (this toolkit)"],
                               mean[3, [KEYS.index("hr@10"), KEYS.index("ndcg@10")]], atol=5e-5)


def test_a_run_without_the_seen_removed_figures_is_one_error_line(tmp_path):
    os.makedirs(tmp_path / "old")
    (tmp_path / "old" / "results.json").write_text(json.dumps(
        {"valid": dict.fromkeys(KEYS, 0.1), "test": dict.fromkeys(KEYS, 0.1), "best_epoch": 1}))
    proc = report(tmp_path / "old")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and "test_filtered" in proc.stderr


def test_the_readme_tables_are_the_report_of_the_committed_runs():
    text = open(os.path.join(ROOT, "retrieval", "README.md")).read()
    section = text.split("\n## Results on Amazon Beauty", 1)[1].split("\n## ", 1)[0]
    command = next(line for line in bash_lines(section) if "retrieval.report" in line)
    paths = re.sub(r"^.*retrieval\.report\s+", "", command).split()
    for path in paths:
        assert path.startswith("bench/results/retrieval/"), path
    proc = report(*paths)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in section, "retrieval/README.md: tables differ from the report"
