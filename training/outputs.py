"""One writer per output path. A run takes every path it will write (checkpoint, its `.best`
sibling, export) at its start, before it trains, and holds them until it ends: a second run
aiming at a path in use ends at once with one line naming the path and the holder, instead
of the two overwriting each other's saves. The ranks of one job are one writer: rank 0 takes
the locks (core.files.OutputLock) and every rank learns the outcome, so all end together
(each with rank 0's line).

Holding a path, rank 0 also finishes what a killed writer left there: an output missing
because a publish was killed between its renames is moved back (saying so), and staging
directories of writers that died are removed."""
from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np

from core.files import FileError, OutputLock, StagedDirectory, write_error
from training.selection import best_state_path

MESSAGE_BYTES = 1024  # the refusal travels to every rank in a fixed-size broadcast

RUN_FILES = {"checkpoint": "checkpoint", "results": "results.json", "log": "log.json",
             "curves": "curves.png", "saved_model": "saved_model"}
HELD_RUNS = (("results", "a finished training run (results.json)"),
             ("checkpoint", "an unfinished training run (its checkpoint)"),
             ("log", "the log of a training run (log.json)"))


def run_paths(output_dir: str) -> dict:
    """A training run's outputs in its directory, by RUN_FILES' names."""
    return {name: os.path.join(output_dir, file) for name, file in RUN_FILES.items()}


def mode_paths(where: dict, mode: str) -> list:
    """What a run of `mode` (train, eval, export) writes, to claim at its start."""
    if mode == "export":
        return [where["saved_model"]]
    if mode == "eval":
        return [where["results"]]
    return [where["checkpoint"], best_state_path(where["checkpoint"]), where["results"],
            where["log"], where["curves"]]


def held_run(where: dict, comm) -> str:
    """What training run the directory holds ('' when none), as rank 0 sees it before any
    rank writes there (another rank looking later would see this run's own log)."""
    held = next((i for i, (key, _) in enumerate(HELD_RUNS) if os.path.exists(where[key])),
                len(HELD_RUNS)) if comm.rank == 0 else 0
    held = int(comm.broadcast_from_root(np.array([held], np.int64))[0])
    return HELD_RUNS[held][1] if held < len(HELD_RUNS) else ""


def start_training(where: dict, comm, continued: bool, overwrite: bool, choices: str) -> None:
    """A training run into a directory that holds one goes on only as a flag says: continued
    from it (`continued`) or replacing it (`overwrite`: its files removed); otherwise one line
    naming the flags that choose (`choices`)."""
    held = held_run(where, comm)
    if not held or continued:
        return
    if not overwrite:
        raise FileError(f"--output_dir {os.path.dirname(where['results'])} holds {held}: "
                        f"{choices}")
    if comm.rank == 0:
        for path in mode_paths(where, "train"):  # checkpoints are directories
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.unlink(path)


@contextlib.contextmanager
def claimed(comm, paths):
    """Hold every path of `paths` (None entries: nothing to write) for the block; a
    collective: every rank enters it alike. A path in use, or one that cannot be locked,
    raises FileError on every rank with rank 0's message."""
    paths, locks = sorted({os.path.abspath(p) for p in paths if p}), []
    try:
        problem = _lock_all(paths, locks) if comm.rank == 0 else ""
        with comm.waiting("the claim of the output paths", 0):
            problem = _shared_text(comm, problem)
        if problem:
            raise FileError(problem)
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


def _lock_all(paths: list, locks: list) -> str:
    """Lock and tidy every path (its lock appended to locks); the first failure's message."""
    for path in paths:
        try:
            lock = OutputLock(path)
            lock.acquire()
            locks.append(lock)
            _tidy(path)
        except FileError as e:
            return str(e)
        except OSError as e:
            return str(write_error(path, e))
    return ""


def _tidy(path: str) -> None:
    moved = StagedDirectory.tidy(path)
    if moved:
        print(f"{path}: moved back the complete copy {moved} that an interrupted write left "
              f"beside it", flush=True)


def _shared_text(comm, text: str) -> str:
    """Rank 0's text on every rank."""
    data = np.frombuffer(text.encode()[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0"), np.uint8)
    return bytes(comm.broadcast_from_root(data)).rstrip(b"\0").decode(errors="replace")
