"""Process-group plumbing: a single process, or Horovod when launched by horovodrun/mpirun."""
from __future__ import annotations

import os

from embedding import Communicator

# set by horovodrun (Gloo), mpirun (Open MPI / MPICH) and srun --mpi=pmix respectively
LAUNCHER_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def launched_by_horovod() -> bool:
    return any(v in os.environ for v in LAUNCHER_VARIABLES)


def make_communicator() -> Communicator:
    if not launched_by_horovod():
        return Communicator()
    from horovod_comm import HorovodCommunicator
    return HorovodCommunicator()
