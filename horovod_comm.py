"""Collectives over Horovod (Gloo or MPI on CPU, NCCL on GPUs) for hybrid-parallel training.

Every rank issues the same collectives in the same order: one all-to-all per step (and its
mirror in the backward pass), then the dense-gradient allreduces in variable order.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from embedding import Communicator


class HorovodCommunicator(Communicator):
    def __init__(self, configure_devices=lambda local_rank: None):
        """configure_devices(local_rank) runs after hvd.init() and before any TensorFlow op:
        device settings cannot change once TensorFlow is initialised."""
        import horovod.tensorflow as hvd
        hvd.init()
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        configure_devices(hvd.local_rank())
        # bytes this rank sent to other ranks through all-to-all, forward and backward
        self.alltoall_bytes = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="alltoall_bytes_sent")

    def _count(self, tensor, splits):
        sent = tf.reduce_sum(splits) - splits[self.rank]
        self.alltoall_bytes.assign_add(tf.cast(sent, tf.int64) * tensor.dtype.size)

    def alltoall(self, tensor, splits):
        hvd = self.hvd

        @tf.custom_gradient
        def exchange(x):
            splits_i32 = tf.cast(splits, tf.int32)
            self._count(x, splits_i32)
            # fixed names: Horovod matches collectives across ranks by name, and the
            # generated ones differ between ranks whose graphs differ (e.g. one without tables)
            received, received_splits = hvd.alltoall(x, splits=splits_i32,
                                                     name="embedding_alltoall")

            def backward(upstream):
                self._count(upstream, received_splits)
                grad, _ = hvd.alltoall(upstream, splits=received_splits,
                                       name="embedding_alltoall_grad")
                return grad

            return received, backward

        return exchange(tensor)

    def allreduce_sum(self, tensor, name=None):
        if isinstance(tensor, tf.IndexedSlices) and name:
            # hvd.allreduce sums rows with two allgathers that it names after graph tensors
            # (gradient_tape/embedding_lookup_<k>...): ranks holding different pieces number
            # their lookups differently, the names do not match, and the ranks wait forever
            values = self.hvd.allgather(tensor.values, name=f"{name}_values")
            indices = self.hvd.allgather(tensor.indices, name=f"{name}_indices")
            return tf.IndexedSlices(values, indices, tensor.dense_shape)
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)

    def gather_to_root(self, array):
        """An all-to-all in which every rank sends its whole 1-D array to rank 0 only."""
        tensor = tf.convert_to_tensor(array)
        splits = tf.constant([tensor.shape[0]] + [0] * (self.size - 1), tf.int32)
        received, _ = self.hvd.alltoall(tensor, splits=splits)
        return received.numpy()

    def broadcast_from_root(self, array):
        return self.hvd.broadcast(tf.convert_to_tensor(array), root_rank=0).numpy()

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
