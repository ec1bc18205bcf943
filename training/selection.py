"""Model selection, the same in every family: a validation metric (higher is better) picks the
best evaluation so far; `keep_best` makes that evaluation's state the run's final state (its
checkpoint and export), and a patience ends training after that many evaluations without
improvement.

The selection's counters travel in the training position (`position["selection"]`), which
every family's checkpoint saves, so a resumed run decides exactly as an uninterrupted one.
Every rank sees the same evaluation figures (rank 0 computes and broadcasts them), so every
rank makes the same decision at the same step.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field


def best_state_path(checkpoint_path: str) -> str:
    """Where the best evaluation's state is kept: beside the run's checkpoint, never inside
    it (a checkpoint directory is replaced whole when it is saved)."""
    return os.path.abspath(checkpoint_path) + ".best"


@dataclass
class Selection:
    metric: str
    patience: int = 0                  # 0: no early stopping
    best: float | None = None          # the metric's best value so far
    best_epoch: int = -1
    best_step: int = -1
    best_figures: dict = field(default_factory=dict)
    since_best: int = 0                # evaluations after the best one
    stopped_early: bool = False        # patience was spent: the run trains no further
    kept_at: str = ""                  # where the best state was saved ("": not kept)

    def update(self, figures: dict, epoch: int, step: int) -> bool:
        """Record one evaluation; True when it is the best so far (strictly higher: a tie
        keeps the earlier, shorter-trained state; NaN never improves)."""
        value = figures.get(self.metric)
        if value is None:
            raise ValueError(f"the model-selection metric '{self.metric}' is not among the "
                             f"evaluation's figures ({', '.join(sorted(figures))})")
        if not math.isnan(value) and (self.best is None or value > self.best):
            self.best, self.best_epoch, self.best_step = float(value), epoch, step
            self.best_figures, self.since_best = dict(figures), 0
            return True
        self.since_best += 1
        self.stopped_early = self.stopped_early or 0 < self.patience <= self.since_best
        return False

    def state(self) -> dict:
        return {"metric": self.metric, "best": self.best, "best_epoch": self.best_epoch,
                "best_step": self.best_step, "best_figures": self.best_figures,
                "since_best": self.since_best, "stopped_early": self.stopped_early,
                "kept_at": self.kept_at}

    @classmethod
    def resumed(cls, metric: str, patience: int, position: dict,
                keep_best: bool = False) -> "Selection":
        """The selection saved in a training position; a fresh one when it holds none, or
        one of another metric, or (keep_best) one whose best state was not kept: that run's
        best is not comparable, or not there to end on."""
        saved = position.get("selection") or {}
        if saved.get("metric") != metric or (keep_best and saved["best"] is not None
                                             and not saved["kept_at"]):
            return cls(metric, patience)
        return cls(metric, patience, saved["best"], saved["best_epoch"], saved["best_step"],
                   dict(saved["best_figures"]), saved["since_best"], saved["stopped_early"],
                   saved["kept_at"])

    def shown(self) -> tuple:
        """The selection metric with its list protocol's hit rate (filtered_ndcg@10:
        filtered_hr@10), then the figures every family shows."""
        return tuple(dict.fromkeys((self.metric, self.metric.replace("ndcg@", "hr@"), "auc",
                                    "map12", "hr@10", "validation_loss")))

    def text(self) -> str:
        figures = "  ".join(f"{k} {self.best_figures[k]:.6f}" for k in self.shown()
                            if k in self.best_figures)
        return f"epoch {self.best_epoch} (step {self.best_step}): {figures}"
