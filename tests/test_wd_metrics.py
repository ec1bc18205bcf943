"""MAP@12 against hand-computed values and an independent per-group implementation."""
import numpy as np
import pytest

from training.metrics import mean_average_precision_at_k


def reference_map(groups, labels, scores, k=12):
    """Plain loops: per group, rank by descending score with clicked rows after unclicked
    rows of the same score (ties count against the click)."""
    aps = []
    for g in sorted(set(groups.tolist())):
        rows = [(s, l) for gg, s, l in zip(groups, scores, labels) if gg == g]
        rows.sort(key=lambda r: (-r[0], r[1]))
        n_clicks = sum(l for _, l in rows)
        if n_clicks == 0:
            continue
        hits, total = 0, 0.0
        for rank, (_, l) in enumerate(rows, start=1):
            if l:
                hits += 1
                if rank <= k:
                    total += hits / rank
        aps.append(total / min(k, n_clicks))
    return float(np.mean(aps))


def test_hand_computed():
    groups = np.array([7, 7, 7, 3, 3, 9, 9, 9, 9])
    labels = np.array([0, 1, 0, 1, 0, 0, 0, 0, 1])
    scores = np.array([0.9, 0.5, 0.1, 0.2, 0.8, 0.4, 0.3, 0.2, 0.1])
    # group 7: click ranked 2 -> 1/2; group 3: ranked 2 -> 1/2; group 9: ranked 4 -> 1/4
    assert mean_average_precision_at_k(groups, labels, scores) == pytest.approx(
        (0.5 + 0.5 + 0.25) / 3)
    # k = 3: group 9's click falls outside the top 3
    assert mean_average_precision_at_k(groups, labels, scores, k=3) == pytest.approx(1 / 3)


def test_ties_count_against_the_click_whatever_the_row_order():
    groups = np.array([1, 1, 1, 2, 2])
    labels = np.array([1, 0, 0, 0, 1])
    scores = np.array([0.5, 0.5, 0.2, 0.3, 0.3])
    expected = (1 / 2 + 1 / 2) / 2  # each click shares its score with one unclicked row
    assert mean_average_precision_at_k(groups, labels, scores) == pytest.approx(expected)
    perm = np.random.default_rng(0).permutation(5)
    assert mean_average_precision_at_k(groups[perm], labels[perm], scores[perm]) == \
        pytest.approx(expected)
    # a constant model: 1/rows for each one-click group
    assert mean_average_precision_at_k(groups, labels, np.zeros(5)) == pytest.approx(
        (1 / 3 + 1 / 2) / 2)


def test_matches_independent_implementation_with_ties_and_long_groups():
    rng = np.random.default_rng(1)
    groups = rng.integers(0, 60, 900)
    labels = (rng.random(900) < 0.15).astype(int)
    scores = np.round(rng.random(900), 1)  # many ties
    for k in (1, 5, 12):
        assert mean_average_precision_at_k(groups, labels, scores, k) == pytest.approx(
            reference_map(groups, labels, scores, k), abs=1e-12)


def test_no_click_anywhere_is_an_error():
    with pytest.raises(ValueError, match="no group has a clicked row"):
        mean_average_precision_at_k([1, 1], [0, 0], [0.1, 0.2])
