"""Process-group plumbing: a single process, or Horovod when launched by horovodrun/mpirun;
and the device configuration that has to come before TensorFlow's first op."""
from __future__ import annotations

import os

from comm import Communicator

# set by horovodrun (Gloo), mpirun (Open MPI / MPICH) and srun --mpi=pmix respectively
LAUNCHER_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def launched_by_horovod() -> bool:
    return any(v in os.environ for v in LAUNCHER_VARIABLES)


def configure_devices(cpu: bool, local_rank: int = 0) -> None:
    """No GPU with `cpu`, else the local rank's GPU with memory growth. TensorFlow accepts
    these settings only before it runs its first op (or creates its first variable)."""
    import tensorflow as tf
    if cpu:
        tf.config.set_visible_devices([], "GPU")
        return
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)


def make_communicator(cpu: bool = False, collective_timeout_s: float = 0) -> Communicator:
    """The communicator, with devices configured (as soon as the local rank is known);
    collective_timeout_s bounds every wait on collectives (0: unbounded)."""
    if not launched_by_horovod():
        configure_devices(cpu)
        return Communicator()
    from horovod_comm import HorovodCommunicator
    return HorovodCommunicator(lambda local_rank: configure_devices(cpu, local_rank),
                               collective_timeout_s)
