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
