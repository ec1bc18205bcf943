"""Files the toolkit writes: staged directories renamed into place, atomic text writes, and
the staged writer every dataset writer builds on, so a crash or a full disk never leaves half
an output behind."""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile


class FileError(ValueError):
    """An output that cannot be written as asked; the message names the path."""


OLD = "-old"  # suffix of the previous output while publish() swaps the new one in


class StagedDirectory:
    """An output directory built in a temporary sibling and renamed into place by publish(),
    so a crash never leaves half an output. A non-empty existing output is refused unless
    overwrite=True, and then replaced only once the new one is complete. Every staging is a
    hidden sibling of its own, `.<name>.tmp-<token>`, so two writers never share one; token:
    a name the other processes of a multi-process writer know (staging_dir), else a fresh
    one."""

    @staticmethod
    def staging_prefix(output_dir: str) -> str:
        output_dir = os.path.abspath(output_dir)
        return os.path.join(os.path.dirname(output_dir),
                            f".{os.path.basename(output_dir)}.tmp-")

    @classmethod
    def staging_dir(cls, output_dir: str, token: str) -> str:
        return cls.staging_prefix(output_dir) + token

    @classmethod
    def interrupted_copies(cls, output_dir: str) -> list:
        """Every staging directory of output_dir left beside it: by a writer killed while
        staging (incomplete), or inside publish() between its two renames (the new output,
        staged, and the previous one, set aside as `<staging>-old`: both complete)."""
        prefix = cls.staging_prefix(output_dir)
        parent, name = os.path.split(prefix)
        if not os.path.isdir(parent):
            return []
        return sorted(os.path.join(parent, f) for f in os.listdir(parent)
                      if f.startswith(name) and os.path.isdir(os.path.join(parent, f)))

    @classmethod
    def recover(cls, output_dir: str):
        """When output_dir is missing because a publish() was killed between its renames,
        move the new output it staged (complete: publish runs only once it is) into place
        and drop the previous one it set aside; the copy moved, or None. For a writer of
        output_dir: no one else may be publishing there."""
        if os.path.exists(output_dir):
            return None
        staged = [c[:-len(OLD)] for c in cls.interrupted_copies(output_dir)
                  if c.endswith(OLD) and os.path.isdir(c[:-len(OLD)])]
        if not staged:
            return None
        newest = max(staged, key=os.path.getmtime)
        os.rename(newest, os.path.abspath(output_dir))
        shutil.rmtree(newest + OLD)
        return newest

    @classmethod
    def tidy(cls, output_dir: str):
        """recover(), then clear(): what killed writers left at output_dir, finished or
        removed; the copy moved back, or None. Only for the path's lock holder."""
        moved = cls.recover(output_dir)
        cls.clear(output_dir)
        return moved

    @classmethod
    def clear(cls, output_dir: str) -> None:
        """Remove the staging directories of writers that ended before publishing (only a
        writer that holds the path may call it: no one else stages there)."""
        for copy in cls.interrupted_copies(output_dir):
            shutil.rmtree(copy, ignore_errors=True)

    def __init__(self, output_dir: str, overwrite: bool = False, token: str = None):
        self.output_dir = os.path.abspath(output_dir)
        if os.path.exists(self.output_dir):
            if not os.path.isdir(self.output_dir):
                raise FileError(f"output {self.output_dir} exists and is not a directory")
            if os.listdir(self.output_dir) and not overwrite:
                raise FileError(f"output {self.output_dir} exists and is not empty; "
                                   f"refusing to write into it (pass overwrite to replace it)")
        parent, prefix = os.path.split(self.staging_prefix(self.output_dir))
        os.makedirs(parent, exist_ok=True)
        if token is None:
            self.tmp_dir = tempfile.mkdtemp(dir=parent, prefix=prefix)
        else:
            self.tmp_dir = self.staging_dir(self.output_dir, token)
            os.makedirs(self.tmp_dir)

    def publish(self) -> None:
        """Swap the staged directory in. A kill between the two renames leaves no output at
        its path, the new and previous ones beside it (interrupted_copies, recover)."""
        if os.path.exists(self.output_dir):
            old = self.tmp_dir + OLD
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


class OutputLock:
    """One writer per output path: an OS lock (flock) on `<path>.lock` beside it, holding the
    holder's "host pid". The kernel frees it when the holder ends, however it ends, so a
    killed run never blocks the next one; a lock file it leaves behind is taken over."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.file = self.path + ".lock"
        self._fd = None

    def acquire(self) -> None:
        """Take the lock, or raise FileError naming the path and its holder."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            while self._fd is None:
                self._fd = self._take()
            os.ftruncate(self._fd, 0)
            os.write(self._fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        except OSError as e:  # e.g. a full disk, a filesystem without locks
            self.release()
            raise write_error(self.path, e) from None

    def _take(self):
        """The locked file's descriptor; None when the holder before removed the file as it
        was taken (then a new one is made)."""
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode(errors="replace").split()
            os.close(fd)
            raise FileError(f"{self.path} is in use by another run ("
                            + (f"host {holder[0]}, pid {holder[1]}" if len(holder) == 2
                               else "not yet named") +
                            f"); wait for it to end or write elsewhere (lock: "
                            f"{self.file})") from None
        except OSError:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.file))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        return None

    def release(self) -> None:
        """Remove the lock file, then free it (a run taking the removed file sees it is no
        longer at the path and makes a new one)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.file)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
