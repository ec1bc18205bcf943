"""The one-line error convention of the toolkit's command-line tools, and how a training
process ends on it."""
from __future__ import annotations

import argparse
import os
import sys

from core.parallel.comm import PeerStopped

ERROR_STATUS = 2


def print_error(message: str) -> None:
    """`error: <message>` on stderr in one write: print() writes the text and its newline
    apart, and a thread of the same process (Horovod's background loop) logging in between
    would glue its line to ours; a write under the pipe's atomic size is never split."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def run_cli(work, errors=(OSError, ValueError)) -> int:
    """Exit status of a tool whose `work()` returns the line to print when it succeeds (or
    None): an expected error (bad input: spec, data, flag, file) prints `error: <message>`
    on stderr and gives ERROR_STATUS, without a traceback; so does a rank whose peer ended."""
    try:
        done = work()
    except (PeerStopped, *errors) as e:
        print_error(str(e))
        return ERROR_STATUS
    if done is not None:
        print(done)
    return 0


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `error:` line, as run_cli's."""

    def error(self, message):
        print_error(message)
        sys.exit(ERROR_STATUS)


def parse_flags(argv: list) -> list:
    """absl's flag parser for app.run(flags_parser=...): a bad flag value (an enum's unknown
    choice, a number out of its bounds, an unknown flag) is the one `error:` line too."""
    from absl import flags
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print_error(str(e))
        sys.exit(ERROR_STATUS)


def exit_process(status: int):
    """Ends a training process with run_cli's status. The error exit flushes the output and
    ends the process at once (os._exit), skipping the interpreter's shutdown: a tf.data
    iterator still alive then (held by the failed read's exception) is freed by the
    shutdown's last garbage collection, and its destructor waits for the reads in flight,
    whose tf.numpy_function can no longer take the GIL once the shutdown began: the process
    would hang for ever. Nothing is left to do at an error exit: outputs are renamed into
    place only when complete, staged ones discarded as the error passed, logs are closed."""
    if status != ERROR_STATUS:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
