"""Collectives over Horovod (Gloo or MPI on CPU, NCCL on GPUs) for hybrid-parallel training.

Every rank issues the same collectives in the same order: one all-to-all per step (and its
mirror in the backward pass), then the dense-gradient allreduces in variable order.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from embedding import Communicator


class HorovodCommunicator(Communicator):
    def __init__(self):
        import horovod.tensorflow as hvd
        hvd.init()
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        # bytes this rank sent to other ranks through all-to-all, forward and backward
        self.alltoall_bytes = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="alltoall_bytes_sent")
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    def _count(self, tensor, splits):
        sent = tf.reduce_sum(splits) - splits[self.rank]
        self.alltoall_bytes.assign_add(tf.cast(sent, tf.int64) * tensor.dtype.size)

    def alltoall(self, tensor, splits):
        hvd = self.hvd

        @tf.custom_gradient
        def exchange(x):
            splits_i32 = tf.cast(splits, tf.int32)
            self._count(x, splits_i32)
            received, received_splits = hvd.alltoall(x, splits=splits_i32)

            def backward(upstream):
                self._count(upstream, received_splits)
                grad, _ = hvd.alltoall(upstream, splits=received_splits)
                return grad

            return received, backward

        return exchange(tensor)

    def allreduce_sum(self, tensor, name=None):
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)

    def allgather(self, tensor, name=None):
        return self.hvd.allgather(tf.convert_to_tensor(tensor), name=name).numpy()

    def broadcast_variables(self, variables):
        self.hvd.broadcast_variables(variables, root_rank=0)

    def barrier(self):
        self.hvd.allreduce(tf.constant(0.0), op=self.hvd.Sum, name="barrier")

    def alltoall_bytes_sent(self) -> int:
        return int(self.alltoall_bytes.numpy())


def expected_alltoall_bytes(plan, global_batch: int, rank: int) -> int:
    """Bytes a rank sends to others per training step: forward lookups of its pieces for the
    other ranks' rows, plus the mirrored gradients in the backward pass (float32)."""
    width = sum(p.width for p in plan.pieces_on(rank))
    rows_elsewhere = global_batch - (global_batch * (rank + 1) // plan.world_size
                                     - global_batch * rank // plan.world_size)
    return int(2 * rows_elsewhere * width * np.dtype(np.float32).itemsize)
