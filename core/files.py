"""Files the toolkit writes: staged directories renamed into place, atomic text writes, and
the staged writer every dataset writer builds on, so a crash or a full disk never leaves half
an output behind."""
from __future__ import annotations

import os
import shutil
import tempfile


class FileError(ValueError):
    """An output that cannot be written as asked; the message names the path."""


class StagedDirectory:
    """An output directory built in a temporary sibling and renamed into place by publish(),
    so a crash never leaves half an output. A non-empty existing output is refused unless
    overwrite=True, and then replaced only once the new one is complete. shared=True stages
    in shared_tmp_dir(output_dir) (a stale one is cleared): a name that the other processes
    of a multi-process writer know without being told."""

    @staticmethod
    def shared_tmp_dir(output_dir: str) -> str:
        return os.path.abspath(output_dir) + ".tmp"

    @staticmethod
    def interrupted_copies(output_dir: str) -> list:
        """The directories a shared staging of output_dir leaves when killed inside publish(),
        between its two renames: the new output (staged) and the previous one (set aside).
        Either may be complete; the caller judges which."""
        tmp = StagedDirectory.shared_tmp_dir(output_dir)
        return [d for d in (tmp, tmp + "-old") if os.path.isdir(d)]

    def __init__(self, output_dir: str, overwrite: bool = False, shared: bool = False):
        self.output_dir = os.path.abspath(output_dir)
        if os.path.exists(self.output_dir):
            if not os.path.isdir(self.output_dir):
                raise FileError(f"output {self.output_dir} exists and is not a directory")
            if os.listdir(self.output_dir) and not overwrite:
                raise FileError(f"output {self.output_dir} exists and is not empty; "
                                   f"refusing to write into it (pass overwrite to replace it)")
        parent = os.path.dirname(self.output_dir)
        os.makedirs(parent, exist_ok=True)
        if shared:
            self.tmp_dir = self.shared_tmp_dir(output_dir)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            os.makedirs(self.tmp_dir)
        else:
            self.tmp_dir = tempfile.mkdtemp(dir=parent,
                                            prefix=f".{os.path.basename(self.output_dir)}.tmp-")

    def publish(self) -> None:
        """Swap the staged directory in. A kill between the two renames leaves no output at
        its path, the new and previous ones beside it (interrupted_copies)."""
        if os.path.exists(self.output_dir):
            old = self.tmp_dir + "-old"
            shutil.rmtree(old, ignore_errors=True)  # left by a publish killed before its end
            os.rename(self.output_dir, old)
            os.rename(self.tmp_dir, self.output_dir)
            shutil.rmtree(old)
        else:
            os.rename(self.tmp_dir, self.output_dir)

    def discard(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Publish when the block succeeds, discard the staged output when it raises."""
        if exc_type is None:
            self.publish()
        else:
            self.discard()
        return False


class StagedWriter:
    """A writer staging into self._output: close() finishes the files, writes the spec and
    publishes the directory; any failure on the way (or a raising with-block) aborts and
    leaves nothing behind. Subclasses provide _finish_files() and may close their own open
    files in _close_files()."""

    def _close_files(self) -> None:
        pass

    def close(self):
        if self._done:
            raise FileError("close() called twice, or after abort()")
        try:
            self._finish_files()
            self.spec.to_yaml(os.path.join(self._output.tmp_dir, "feature_spec.yaml"))
            self._output.publish()
        except OSError as e:
            self.abort()
            raise write_error(self._output.output_dir, e) from None
        except BaseException:
            self.abort()
            raise
        self._done = True
        self.spec.base_directory = self._output.output_dir
        return self.spec

    def abort(self) -> None:
        self._close_files()
        self._done = True
        self._output.discard()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return False
        self.abort()
        if isinstance(exc, OSError):  # e.g. a full disk in a write(): name the output
            raise write_error(self._output.output_dir, exc) from None
        return False

    def __del__(self):  # dropped without close(): never leave the temp dir behind
        try:
            if not self._done:
                self.abort()
        except Exception:
            pass


def write_error(output: str, error: OSError) -> FileError:
    """A failed write (a full disk, a lost mount...) as one line naming the output."""
    culprit = f" ({error.filename})" if error.filename else ""
    return FileError(f"cannot write {output}{culprit}: {error.strerror or error}; nothing "
                     f"was left half-written; the previous {os.path.basename(output)}, if "
                     f"any, is kept")


def atomic_write_text(path: str, text: str) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
