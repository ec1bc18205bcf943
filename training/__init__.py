"""The core training engine every family drives (see engine.py)."""
from training.engine import (OptimizerGroup, TableGradient, Trainer, TrainingDivergedError,
                             compute_dtype_for)

__all__ = ["OptimizerGroup", "TableGradient", "Trainer", "TrainingDivergedError",
           "compute_dtype_for"]
