"""Evaluation metrics over every test row: exact ROC AUC (ties get average ranks, as in
the Mann-Whitney statistic) and mean binary log loss."""
from __future__ import annotations

import numpy as np


def roc_auc(labels, scores) -> float:
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUC is undefined with {positives} positive and {negatives} "
                         f"negative labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average 1-based rank of each group of tied scores
    group_start = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    group_size = np.diff(np.r_[group_start, scores.size])
    group_rank = group_start + (group_size + 1) / 2.0
    ranks = np.empty(scores.size)
    ranks[order] = np.repeat(group_rank, group_size)
    rank_sum = ranks[labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def log_loss(labels, probabilities, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probabilities, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


# ---- ranking: MAP@k over groups (Wide & Deep's MAP@12 per display) ---------------------
def mean_average_precision_at_k(groups, labels, scores, k: int = 12) -> float:
    """Mean over groups (e.g. display ids) of average precision at k, rows ranked by score.

    AP@k of a group = sum over its clicked rows ranked r <= k of (clicks ranked <= r) / r,
    divided by min(k, clicks in the group); groups without a click are left out. Ties count
    against the clicks: among rows of equal score, the clicked ones are ranked last, so the
    value does not depend on row order (a constant model gets 1/rows per one-click group).
    """
    groups = np.asarray(groups).ravel()
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if not groups.size == labels.size == scores.size:
        raise ValueError(f"MAP@{k}: groups, labels and scores differ in length "
                         f"({groups.size}, {labels.size}, {scores.size})")
    # lexsort: last key first -> by group, then descending score, then non-clicks first
    order = np.lexsort((labels, -scores, groups))
    g, clicked = groups[order], labels[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, g.size])
    rank = np.arange(g.size) - np.repeat(starts, sizes) + 1
    clicks_so_far = np.cumsum(clicked)
    clicks_before_group = np.repeat(np.r_[0, clicks_so_far[starts[1:] - 1]], sizes)
    hits = clicked & (rank <= k)
    precision = np.where(hits, (clicks_so_far - clicks_before_group) / rank, 0.0)
    group_clicks = np.add.reduceat(clicked.astype(np.int64), starts)
    group_sum = np.add.reduceat(precision, starts)
    has_click = group_clicks > 0
    if not has_click.any():
        raise ValueError(f"MAP@{k}: no group has a clicked row")
    return float(np.mean(group_sum[has_click] / np.minimum(k, group_clicks[has_click])))
