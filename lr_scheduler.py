"""DLRM's learning-rate schedule as the design card names it: a thin layer over the core's
LearningRateSchedule (core/optimizers.py) that reads DLRM's flags (NVIDIA's names)."""
from __future__ import annotations

from core.optimizers import LearningRateSchedule


def schedule_from_flags(flags) -> LearningRateSchedule:
    """--learning_rate warmed up over --warmup_steps, decayed from --decay_start_step to zero
    over --decay_steps."""
    return LearningRateSchedule(flags.learning_rate, flags.warmup_steps,
                                flags.decay_start_step, flags.decay_steps)
