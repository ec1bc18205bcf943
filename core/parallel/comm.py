"""The collectives interface every family trains through (this base is one process, world
size 1; core.parallel.horovod.HorovodCommunicator is the multi-process one), and the
process-group plumbing: a single process, or Horovod when launched by horovodrun/mpirun, with
the device configuration that has to come before TensorFlow's first op."""
from __future__ import annotations

import contextlib
import os

# the embedding lookup exchange's collectives (forward, backward), fixed names on every rank
ALLTOALL_NAMES = ("embedding_alltoall", "embedding_alltoall_grad")


class PeerStopped(RuntimeError):
    """A collective failed because another rank ended (its own error line says why)."""


class Communicator:
    """Collectives used by the embedding layer and the training loop; this one is a single
    process (world size 1), where every collective is the identity."""

    rank = 0
    size = 1

    def alltoall(self, tensor, splits, name=ALLTOALL_NAMES[0]):
        """Rows splits[r] of the (differentiable) tensor go to rank r; the received blocks in
        rank order. `name` (its backward `name`_grad) matches the collective across ranks."""
        return tensor

    def exchange(self, tensor, splits, name):
        """alltoall without a gradient (ids), also returning how many rows came from each
        rank (the splits of the answer going back)."""
        return tensor, splits

    def allreduce_sum(self, tensor, name=None):
        return tensor

    def allgather(self, tensor, name):
        """Every rank's tensor concatenated along the first axis in rank order (the first
        dimensions may differ)."""
        return tensor

    def gather_to_root(self, array):
        """Every rank's 1-D array concatenated in rank order on rank 0 (empty elsewhere)."""
        return array

    def broadcast_from_root(self, array):
        return array

    def broadcast_variables(self, variables):
        pass

    def barrier(self):
        pass

    def waiting(self, what: str, step: int):
        """Context of a wait on collectives (what, at which step): bounded by the stall
        limit in several processes; nothing to bound in one."""
        return contextlib.nullcontext()

# set by horovodrun and slurm_multinode.sh without a container (Gloo), mpirun (Open MPI /
# MPICH) and srun --mpi=pmix (slurm_multinode.sh with a container) respectively
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
    from core.parallel.horovod import HorovodCommunicator  # imports horovod: only when launched
    return HorovodCommunicator(lambda local_rank: configure_devices(cpu, local_rank),
                               collective_timeout_s)
