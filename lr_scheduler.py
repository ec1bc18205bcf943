"""Learning-rate schedule: linear warmup, constant, polynomial (power 2) decay to zero.

A pure function of the step, so a resumed run needs only the step to continue the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LearningRateSchedule:
    base_learning_rate: float
    warmup_steps: int = 8000
    decay_start_step: int = 48000
    decay_steps: int = 24000
    decay_power: float = 2.0

    def __post_init__(self):
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and decay_steps "
                             f"({self.decay_steps}) must be >= 0")
        if self.decay_steps > 0 and self.decay_start_step < self.warmup_steps:
            raise ValueError(f"decay_start_step ({self.decay_start_step}) must not come before "
                             f"the end of warmup (warmup_steps={self.warmup_steps})")

    def __call__(self, step: int) -> float:
        """Learning rate for the update made at `step` (0-based)."""
        lr = self.base_learning_rate
        if step < self.warmup_steps:
            return lr * step / self.warmup_steps
        if self.decay_steps <= 0 or step < self.decay_start_step:
            return lr
        remaining = self.decay_start_step + self.decay_steps - step
        if remaining <= 0:
            return 0.0
        return lr * (remaining / self.decay_steps) ** self.decay_power
