"""SIGINT / SIGTERM during training: one `error:` line, and every rank ends within a bounded
time with exit status 2. Nothing is saved at an interrupt: the checkpoint at the path is the
last one written at its scheduled step (a save begun at an interrupt is the one most likely
to be cut short by the next signal or a SIGKILL, and ranks stop at different steps).

Python runs signal handlers only between bytecodes, and a rank blocked in a collective whose
peer has already stopped never gets there. So the signal wakes a watcher thread
(signal.set_wakeup_fd), which prints the line at once (rank 0 alone: under horovodrun every
rank gets horovodrun's SIGTERM) and ends the process `grace_s` seconds later, or at a
second signal, if it has not ended by then. The loop meanwhile stops at its next step
boundary (before any evaluation or checkpoint of that step) and exits quietly; so does a rank
whose collective failed because a peer stopped at the signal first (stopped_by_signal). A
signal during a checkpoint write waits for it (up to `grace_s`) before the line is printed, so
the line names the checkpoint that is on disk."""
from __future__ import annotations

import os
import select
import signal
import threading
import time

from core.cli import ERROR_STATUS, print_error

GRACE_S = 3.0  # horovodrun sends SIGKILL 5 s after its SIGTERM
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """A context for the training loop: `check(step)` (between steps) ends the process with
    ERROR_STATUS once SIGINT or SIGTERM arrived; `step` is the last step it saw."""

    def __init__(self, rank: int = 0, grace_s: float = GRACE_S, kept=None):
        """kept() -> what an interrupt leaves (the message's end), asked at the signal."""
        self.rank, self.grace_s = rank, grace_s
        self.kept = kept or (lambda: "the last checkpoint written stays")
        self.signum, self.step = None, 0
        self._announced = threading.Event()  # the line is out: the loop may exit
        self.saving = threading.Lock()  # held by the loop while it writes a checkpoint
        self._active = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if not self._active:  # handlers can only be installed by the main thread
            return self
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        # the handler does nothing itself (the watcher acts); it replaces the default
        # action (KeyboardInterrupt, termination) while the loop can stop cleanly
        self._previous = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(self._write)
        threading.Thread(target=self._watch, daemon=True, name="stop-on-signal").start()
        return self

    def __exit__(self, *exc):
        if not self._active:
            return False
        signal.set_wakeup_fd(self._previous_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self.signum is None:
            os.write(self._write, b"\0")  # ends the watcher; after a signal it keeps its deadline
        return False

    def message(self) -> str:
        return (f"interrupted by {signal.Signals(self.signum).name} at step {self.step}: "
                f"training stopped; nothing is saved at an interrupt ({self.kept()})")

    def check(self, step: int) -> None:
        if self._announced.is_set():
            raise SystemExit(ERROR_STATUS)
        self.step = step

    def stopped_by_signal(self, wait_s: float) -> bool:
        """Whether this process's signal was announced, waiting up to wait_s for it: under
        horovodrun a rank that stops at its signal ends the others' collectives, which may
        fail before their own signal reached their watcher."""
        return self._active and self._announced.wait(wait_s)

    def _watch(self):
        byte = os.read(self._read, 1)
        if not byte or byte == b"\0":
            os.close(self._read)
            os.close(self._write)
            return
        self.signum = byte[0]
        deadline = time.monotonic() + self.grace_s
        saved = self.saving.acquire(timeout=self.grace_s)  # a write under way ends first
        if self.rank == 0:
            print_error(self.message())
        self._announced.set()
        if saved:
            self.saving.release()
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self._read], [], [], left)[0] and os.read(self._read, 1) != b"\0":
                break  # a second signal ends the process now
        os._exit(ERROR_STATUS)
