"""The collectives interface every family trains through; this base is one process (world
size 1). horovod_comm.HorovodCommunicator is the multi-process one."""
from __future__ import annotations

import contextlib

# the embedding lookup exchange's collectives (forward, backward), fixed names on every rank
ALLTOALL_NAMES = ("embedding_alltoall", "embedding_alltoall_grad")


class Communicator:
    """Collectives used by the embedding layer and the training loop; this one is a single
    process (world size 1), where every collective is the identity."""

    rank = 0
    size = 1

    def alltoall(self, tensor, splits):
        return tensor

    def allreduce_sum(self, tensor, name=None):
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
