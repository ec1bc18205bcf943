"""Gathering evaluation rows of every rank on rank 0 (gradient sums across ranks are the
training engine's: training/engine.py)."""
from __future__ import annotations

import numpy as np


def gather_to_root(comm, array: np.ndarray):
    """Every rank's rows concatenated in rank order on rank 0 (None elsewhere); only rank 0
    holds them, so evaluation memory per rank does not grow with the world size."""
    gathered = comm.gather_to_root(np.asarray(array))
    return np.asarray(gathered) if comm.rank == 0 else None
