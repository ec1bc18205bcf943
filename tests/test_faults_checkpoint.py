"""Checkpoint faults: a corrupt or truncated file is one error naming it (checksums in
meta.json); a state holding NaN/inf, or a full disk, is refused with the previous checkpoint
kept and no staged directory left; a save killed between its two renames is restored from
the complete copy beside the path and put back in place by the next save."""
import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT
from test_trainer import tiny_trainer
from test_training import main_in_process
from training import checkpoint
from training.checkpoint import CheckpointError

POSITION = {"step": 3, "epoch": 0, "batch_in_epoch": 3}
DLRM = [sys.executable, "main.py", "--dataset_type", "synthetic",
        "--synthetic_dataset_cardinalities", "300,20", "--synthetic_dataset_num_numerical_features",
        "3", "--synthetic_dataset_train_batches", "10", "--synthetic_dataset_valid_batches", "2",
        "--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
        "--batch_size", "128", "--valid_batch_size", "128", "--cpu"]


def main_code(args, prelude="") -> str:
    """Python running main.py with args[1:], after prelude (a simulated fault)."""
    return f"import runpy, sys\n{textwrap.dedent(prelude)}\nsys.argv = {args[1:]!r}\n" \
           f"runpy.run_path('main.py', run_name='__main__')"


def run(args, prelude=""):
    """main.py (or a module) in a subprocess; prelude: Python run first (a simulated fault)."""
    proc = subprocess.run([sys.executable, "-c", main_code(args, prelude)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    return proc, errors


def meta(path):
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)


def leftovers(directory):
    return sorted(f for f in os.listdir(directory) if ".tmp" in f)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ck") / "ck")
    main_in_process(DLRM[2:] + ["--save_checkpoint_path", path, "--log_path", path + ".json"])
    return path


def test_meta_lists_every_file_with_its_size_and_crc(saved):
    import zlib
    files = meta(saved)["files"]
    assert set(files) == set(os.listdir(saved)) - {"meta.json"}
    for name, saved_file in files.items():
        data = open(os.path.join(saved, name), "rb").read()
        assert saved_file == {"bytes": len(data), "crc32": zlib.crc32(data)}


@pytest.mark.parametrize("damage,message", [
    ("overwrite", "table_0.npy is corrupt (its CRC-32 differs from the one saved in meta.json)"),
    ("truncate", "dense.npz has 1000 bytes, {} were saved (truncated or overwritten)")])
def test_a_damaged_file_is_one_error_naming_it(saved, tmp_path, damage, message):
    import shutil
    path = str(tmp_path / "ck")
    shutil.copytree(saved, path)
    name = "table_0.npy" if damage == "overwrite" else "dense.npz"
    file = os.path.join(path, name)
    size = os.path.getsize(file)
    with open(file, "r+b") as f:
        if damage == "overwrite":  # the 4 KB of random bytes inside the table
            f.seek(200)
            f.write(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
        else:
            f.truncate(1000)
    proc, errors = run(DLRM + ["--mode", "eval", "--restore_checkpoint_path", path,
                               "--log_path", str(tmp_path / "log.json")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert errors == [f"error: checkpoint file {file} " + message.split(" ", 1)[1].format(size)]


def test_a_full_disk_keeps_the_previous_checkpoint(saved, tmp_path):
    import shutil
    path = str(tmp_path / "ck")
    shutil.copytree(saved, path)
    before = meta(path)
    full_disk = """
        import errno, os
        import numpy as np
        real, calls = np.save, []
        def save(file, array, *args, **kwargs):
            calls.append(file)
            if len(calls) == 2:
                open(file, "wb").write(b"half")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), file)
            return real(file, array, *args, **kwargs)
        np.save = save
    """
    proc, errors = run(DLRM + ["--save_checkpoint_path", path, "--restore_checkpoint_path",
                               path, "--log_path", str(tmp_path / "log.json")], full_disk)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: cannot write {path} ({tmp_path}/"
                                                     f".ck.tmp-")
    assert "No space left on device" in errors[0]
    assert meta(path) == before and leftovers(tmp_path) == []


def test_non_finite_weights_are_never_saved(tmp_path):
    import tensorflow as tf
    trainer = tiny_trainer(0.1)
    path = str(tmp_path / "ck")
    checkpoint.save(path, trainer, POSITION)
    before = meta(path)
    name, var = next(iter(trainer.model.dense_variables().items()))
    var.assign(tf.tensor_scatter_nd_update(var, [[0] * len(var.shape)], [np.nan]))
    with pytest.raises(CheckpointError) as error:
        checkpoint.save(path, trainer, dict(POSITION, step=9))
    assert str(error.value) == (f"refusing to save checkpoint {path}: '{name}' holds 1 NaN/inf "
                                f"value(s) (the run diverged?); {path} is left as it was")
    assert meta(path) == before and leftovers(tmp_path) == []


class OneProcess:
    rank, size = 0, 1

    @staticmethod
    def allreduce_sum(tensor, name=None):
        return tensor

    def barrier(self):
        pass


def test_replica_faults_keep_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")
    checkpoint.save_arrays(path, {"w": np.ones(3, np.float32)}, {"position": 1}, OneProcess())
    with pytest.raises(CheckpointError, match=f"'w' holds 1 NaN/inf"):
        checkpoint.save_arrays(path, {"w": np.array([1, np.inf, 0], np.float32)},
                               {"position": 2}, OneProcess())

    def full_disk(file, **arrays):
        open(file, "wb").write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), file)
    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(CheckpointError, match=f"^cannot write {path} \\({tmp_path}/\\.ck\\.tmp-"
                                              f"\\w+/arrays.npz\\): No space left on device"):
        checkpoint.save_arrays(path, {"w": np.zeros(3, np.float32)}, {"position": 3},
                               OneProcess())
    arrays, saved_meta = checkpoint.load_arrays(path)
    assert saved_meta["position"] == 1 and np.array_equal(arrays["w"], np.ones(3))
    assert leftovers(tmp_path) == []


def test_a_save_killed_between_its_renames_is_recovered(tmp_path, capsys):
    path = str(tmp_path / "ck")
    code = f"""
        import os, numpy as np
        from training import checkpoint
        from test_faults_checkpoint import OneProcess
        checkpoint.save_arrays({path!r}, {{"w": np.ones(2)}}, {{"position": 1}}, OneProcess())
        real = os.rename
        def rename(src, dst):
            real(src, dst)
            if dst.endswith("-old"):
                os._exit(9)  # killed between publish's two renames
        os.rename = rename
        checkpoint.save_arrays({path!r}, {{"w": np.full(2, 2.0)}}, {{"position": 2}}, OneProcess())
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT}/tests"), timeout=120)
    assert proc.returncode == 9
    new, old = leftovers(tmp_path)
    assert not os.path.exists(path) and old == new + "-old" and new.startswith(".ck.tmp-")
    arrays, saved_meta = checkpoint.load_arrays(path)
    assert saved_meta["position"] == 2 and np.array_equal(arrays["w"], [2.0, 2.0])
    assert capsys.readouterr().out == (f"checkpoint: {path} is missing (a save was interrupted); "
                                       f"restoring its complete copy {tmp_path}/{new}\n")
    checkpoint.save_arrays(path, {"w": np.full(2, 3.0)}, {"position": 3}, OneProcess())
    assert meta(path)["position"] == 3 and leftovers(tmp_path) == []


def test_an_incomplete_copy_is_never_restored(tmp_path):
    path = str(tmp_path / "ck")
    checkpoint.save_arrays(path, {"w": np.ones(2)}, {"position": 1}, OneProcess())
    staged = str(tmp_path / ".ck.tmp-killed")
    os.rename(path, staged + "-old")
    os.makedirs(staged)  # the new copy, killed before its meta.json
    np.save(os.path.join(staged, "arrays.npz"), np.zeros(2))
    arrays, saved_meta = checkpoint.load_arrays(path)
    assert saved_meta["position"] == 1 and np.array_equal(arrays["w"], [1.0, 1.0])
