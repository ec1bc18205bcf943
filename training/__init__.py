"""The core training engine every family drives (see engine.py)."""
from training.engine import (OptimizerGroup, TableDeclaration, TableGradient, Trainer,
                             TrainingDivergedError, compute_dtype_for, table_bookkeeping)

__all__ = ["OptimizerGroup", "TableDeclaration", "TableGradient", "Trainer",
           "TrainingDivergedError", "compute_dtype_for", "table_bookkeeping"]
