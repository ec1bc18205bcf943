"""Collectives over Horovod (Gloo or MPI on CPU, NCCL on GPUs) for hybrid-parallel training.

Every rank issues the same collectives in the same order: one all-to-all per step (and its
mirror in the backward pass), then the dense-gradient allreduces in variable order.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
import tensorflow as tf

from core import runtime
from core.cli import print_error
from core.parallel.comm import ALLTOALL_NAMES, Communicator, PeerStopped

# test hook: "RANK:STEP:SECONDS" makes that rank sleep before the collectives of that step
DELAY_VARIABLE = "DLRM_TEST_DELAY_RANK"


class StallWatch:
    """Bounds every wait on collectives. The main thread marks where it waits (what, step);
    a heartbeat thread allgathers every rank's mark every `period` seconds (Horovod matches
    collectives by name, so these complete while the main threads wait on others); a rank
    that has waited longer than `limit_s` names what it waits in, the step, and the ranks
    not waiting there with it, then ends the job with a non-zero status."""

    EXIT_STATUS = 3

    def __init__(self, hvd, limit_s: float):
        self.hvd, self.limit_s = hvd, limit_s
        self.period = min(max(limit_s / 4, 0.5), 15.0)
        self.rank = hvd.rank()
        self.phases = []
        self.waiting = None              # (phase id, step, since) while in a collective
        self.last = (-1, -1)             # (phase id, step) of the last wait
        self.peers, self.heard_at = None, time.monotonic()
        for target in (self._heartbeat, self._check):
            threading.Thread(target=target, daemon=True).start()

    @contextlib.contextmanager
    def wait(self, what: str, step: int):
        _test_delay(self.rank, step)
        if what not in self.phases:
            self.phases.append(what)
        phase = self.phases.index(what)
        self.waiting = (phase, step, time.monotonic())
        try:
            yield
        finally:
            self.waiting, self.last = None, (phase, step)

    def _status(self) -> np.ndarray:
        waiting = self.waiting
        if waiting is None:
            return np.array([0, *self.last, 0], np.int64)
        return np.array([1, waiting[0], waiting[1], time.monotonic() - waiting[2]], np.int64)

    def _heartbeat(self):
        beat = 0
        try:
            while True:
                time.sleep(self.period)
                with tf.device("/CPU:0"):
                    gathered = self.hvd.allgather(tf.constant(self._status()[None]),
                                                  name=f"stall_watch_{beat}")
                self.peers, self.heard_at = gathered.numpy(), time.monotonic()
                beat += 1
        except Exception:  # Horovod shut down at the end of the job: nothing left to watch
            return

    def _check(self):
        while True:
            time.sleep(self.period / 2)
            waiting = self.waiting
            if waiting is not None and time.monotonic() - waiting[2] > self.limit_s:
                print_error(self.report(waiting))
                os._exit(self.EXIT_STATUS)  # the main thread is blocked in the collective

    def report(self, waiting) -> str:
        phase, step, since = waiting
        what = self.phases[phase]
        text = (f"rank {self.rank} has waited {time.monotonic() - since:.0f} s (limit "
                f"--collective_timeout_s {self.limit_s:g}) in {what} at step {step}")
        peers, age = self.peers, time.monotonic() - self.heard_at
        if peers is None or age > 2 * self.period + 1:
            return text + (f"; the other ranks have not answered the stall watch for "
                           f"{age:.0f} s, so which of them are missing is unknown")
        missing = [(r, p) for r, p in enumerate(peers)
                   if r != self.rank and not (p[0] == 1 and p[1] == phase and p[2] == step)]
        where = "; ".join(f"rank {r} " + self._where(p, phase) for r, p in missing)
        return text + f", waiting for rank(s) {[r for r, _ in missing]} ({where})"

    def _where(self, status, my_phase: int) -> str:
        flag, phase, step, seconds = (int(v) for v in status)
        name = ("the same collectives" if phase == my_phase else self.phases[phase]
                if 0 <= phase < len(self.phases) else "no collectives yet")
        if flag:
            return f"waits in {name} at step {step} for {seconds} s"
        return f"is outside collectives, last in {name} at step {step}"


def _test_delay(rank: int, step: int) -> None:
    spec = os.environ.get(DELAY_VARIABLE)
    if spec:
        delay_rank, delay_step, seconds = spec.split(":")
        if int(delay_rank) == rank and int(delay_step) == step:
            time.sleep(float(seconds))


class HorovodCommunicator(Communicator):
    def __init__(self, configure_devices=lambda local_rank: None,
                 collective_timeout_s: float = 0):
        """configure_devices(local_rank) runs after hvd.init() and before any TensorFlow op:
        device settings cannot change once TensorFlow is initialised. collective_timeout_s:
        the stall limit of StallWatch (0: waits are not bounded)."""
        hvd = runtime.import_horovod()
        hvd.init()
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        configure_devices(hvd.local_rank())
        self.stall_watch = StallWatch(hvd, collective_timeout_s) if collective_timeout_s \
            else None
        # bytes this rank sent to other ranks through all-to-all, forward and backward
        self.alltoall_bytes = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="alltoall_bytes_sent")

    def _count(self, tensor, splits):
        sent = tf.reduce_sum(splits) - splits[self.rank]
        self.alltoall_bytes.assign_add(tf.cast(sent, tf.int64) * tensor.dtype.size)

    def alltoall(self, tensor, splits, name=ALLTOALL_NAMES[0]):
        hvd = self.hvd

        @tf.custom_gradient
        def exchange(x):
            splits_i32 = tf.cast(splits, tf.int32)
            self._count(x, splits_i32)
            # fixed names: Horovod matches collectives across ranks by name, and the
            # generated ones differ between ranks whose graphs differ (e.g. one without tables)
            received, received_splits = hvd.alltoall(x, splits=splits_i32, name=name)

            def backward(upstream):
                # a gather's gradient arrives as IndexedSlices: Horovod sends dense tensors
                upstream = tf.convert_to_tensor(upstream)
                self._count(upstream, received_splits)
                grad, _ = hvd.alltoall(upstream, splits=received_splits, name=name + "_grad")
                return grad

            return received, backward

        return exchange(tensor)

    def exchange(self, tensor, splits, name):
        splits_i32 = tf.cast(splits, tf.int32)
        self._count(tensor, splits_i32)
        return self.hvd.alltoall(tensor, splits=splits_i32, name=name)

    def allreduce_sum(self, tensor, name=None):
        if isinstance(tensor, tf.IndexedSlices) and name:
            # hvd.allreduce sums rows with two allgathers that it names after graph tensors
            # (gradient_tape/embedding_lookup_<k>...): ranks holding different pieces number
            # their lookups differently, the names do not match, and the ranks wait forever
            values = self.hvd.allgather(tensor.values, name=f"{name}_values")
            indices = self.hvd.allgather(tensor.indices, name=f"{name}_indices")
            return tf.IndexedSlices(values, indices, tensor.dense_shape)
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)

    def allgather(self, tensor, name):
        return self.hvd.allgather(tensor, name=name)

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

    @contextlib.contextmanager
    def waiting(self, what: str, step: int):
        """Also turns the error of a collective cut short by a peer's end (Horovod shuts down
        on every rank once one has gone) into PeerStopped, naming where this rank was."""
        try:
            with self.stall_watch.wait(what, step) if self.stall_watch \
                    else contextlib.nullcontext():
                yield
        except Exception as e:
            if "Horovod has been shut down" not in str(e):
                raise
            raise PeerStopped(f"rank {self.rank}: another rank ended while this one was in "
                              f"{what} at step {step}; that rank's output says why") from None

    def barrier(self):
        self.hvd.allreduce(tf.constant(0.0), op=self.hvd.Sum, name="barrier")

    def alltoall_bytes_sent(self) -> int:
        return int(self.alltoall_bytes.numpy())

