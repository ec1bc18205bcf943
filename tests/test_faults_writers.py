"""One writer per output path, and exports as safe as checkpoints: a second run aiming at a
checkpoint or export path in use ends at its start with one line naming the path and the
holder, the first finishes; a killed holder blocks no one; a full disk during an export is one
line with the previous export kept; an export killed between its renames is moved back by the
next writer, which also removes the staging directories of dead runs."""
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import HOROVODRUN, ROOT, bounded_run, fill, horovodrun, kill_tree, require_or_skip
from test_faults_checkpoint import DLRM, leftovers, main_code, run
from test_training import main_in_process, step_losses

WAIT_S = 240  # bound on every wait for a process started here

# Prelude of a run that holds its paths and waits for the file `go` (then trains or exports):
# the second run meets a first one that is certainly still running.
GATE = """
    import os, time
    from core import runtime
    runtime.import_tensorflow()
    import training.loop, training.export

    def gated(real):
        def wait_then_run(*args, **kwargs):
            deadline = time.monotonic() + {wait_s}
            while not os.path.exists({go!r}) and time.monotonic() < deadline:
                time.sleep(0.1)
            return real(*args, **kwargs)
        return wait_then_run
    training.loop.train = gated(training.loop.train)
    training.export.export_saved_model = gated(training.export.export_saved_model)
"""


def start_gated(tmp_path, args, np_=1):
    """A run (np_ ranks) that takes its paths, then waits for tmp_path/go (its output in
    tmp_path/first.out)."""
    prelude = GATE.format(wait_s=WAIT_S, go=str(tmp_path / "go"))
    command = [sys.executable, "-c", main_code(args, prelude)]
    if np_ > 1:
        command = horovodrun(np_, *command)
    with open(tmp_path / "first.out", "w") as out:
        return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                                         CUDA_VISIBLE_DEVICES=""))


def holder_pid(path, proc) -> int:
    """The pid written in path's lock, once the run `proc` has taken it."""
    lock = path + ".lock"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        text = open(lock).read().split() if os.path.exists(lock) else []
        if len(text) == 2:
            assert text[0] == socket.gethostname()
            return int(text[1])
        time.sleep(0.2)
    pytest.fail(f"the first run never took {path} (exit {proc.poll()})", pytrace=False)


def finish(proc, tmp_path):
    """Let the gated run go on; its exit status and output."""
    (tmp_path / "go").touch()
    try:
        status = proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail("the first run did not end", pytrace=False)
    return status, (tmp_path / "first.out").read_text()


def in_use(path, pid) -> str:
    return (f"error: {path} is in use by another run (host {socket.gethostname()}, pid {pid}); "
            f"wait for it to end or write elsewhere (lock: {path}.lock)")


def refused_at_start(tmp_path, args, path, pid, np_=1):
    """The second run (np_ ranks) on path: one line naming path and holder (from each rank,
    all ending together), nothing trained."""
    log = tmp_path / "second.json"
    args = DLRM + args + ["--log_path", str(log)]
    if np_ == 1:
        proc, errors = run(args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    else:  # horovodrun writes a rank's `[rank]<stream>:` prefix and its line in two writes, so
        # two ranks' lines may interleave: count the whole messages (each one write) instead
        proc = bounded_run(horovodrun(np_, *args), timeout=WAIT_S)
        text = proc.stdout + proc.stderr
        errors = [in_use(path, pid)] * text.count(in_use(path, pid))
        assert proc.returncode != 0 and text.count("error:") == np_, text[-2000:]
        assert not any(">:" in line and "Traceback" in line for line in text.splitlines())
    assert errors == [in_use(path, pid)] * np_, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not log.exists() or step_losses(log) == {}


def test_two_runs_on_one_checkpoint_path(tmp_path):
    path = str(tmp_path / "ck")
    train = ["--save_checkpoint_path", path, "--checkpoint_steps", "2"]
    first = start_gated(tmp_path, DLRM + train + ["--log_path", str(tmp_path / "first.json")])
    try:
        refused_at_start(tmp_path, train, path, holder_pid(path, first))
        status, out = finish(first, tmp_path)
    finally:
        kill_tree(first)
    assert status == 0, out[-2000:]
    assert f"checkpoint saved at step 10: {path}" in out
    main_in_process(DLRM[2:] + ["--mode", "eval", "--restore_checkpoint_path", path,
                                "--log_path", str(tmp_path / "eval.json")])
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".lock") or ".tmp" in f]


@pytest.mark.parametrize("first_np,second_np", [(2, 1), (1, 2)])
def test_a_two_rank_job_is_one_writer(tmp_path, first_np, second_np):
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    path = str(tmp_path / "ck")
    train = ["--save_checkpoint_path", path, "--keep_best", "--collective_timeout_s", "200"]
    first = start_gated(tmp_path, DLRM + train + ["--log_path", str(tmp_path / "first.json")],
                        np_=first_np)
    try:
        pid = holder_pid(path, first)
        if first_np == 2:  # rank 0 holds the job's paths
            assert psutil.Process(pid).environ().get("HOROVOD_RANK") == "0"
        assert holder_pid(path + ".best", first) == pid
        refused_at_start(tmp_path, ["--save_checkpoint_path", path], path, pid, second_np)
        status, out = finish(first, tmp_path)
    finally:
        kill_tree(first)
    assert status == 0, out[-2000:]
    main_in_process(DLRM[2:] + ["--mode", "eval", "--restore_checkpoint_path", path,
                                "--log_path", str(tmp_path / "eval.json")])
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".lock")]


def test_two_exports_on_one_path(tmp_path):
    path = str(tmp_path / "export")
    deploy = ["--mode", "deploy", "--saved_model_output_path", path]
    first = start_gated(tmp_path, DLRM + deploy + ["--log_path", str(tmp_path / "first.json")])
    try:
        refused_at_start(tmp_path, deploy, path, holder_pid(path, first))
        status, out = finish(first, tmp_path)
    finally:
        kill_tree(first)
    assert status == 0 and f"SavedModel written to {path}" in out, out[-2000:]
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".lock") or ".tmp" in f]


def test_a_killed_holder_does_not_block_the_next_run(tmp_path):
    path = str(tmp_path / "ck")
    train = ["--save_checkpoint_path", path]
    first = start_gated(tmp_path, DLRM + train + ["--log_path", str(tmp_path / "first.json")])
    try:
        holder_pid(path, first)
    finally:
        kill_tree(first)  # SIGKILL: its lock file stays, the lock does not
    first.wait(timeout=WAIT_S)
    assert os.path.exists(path + ".lock")
    proc, errors = run(DLRM + train + ["--log_path", str(tmp_path / "second.json")])
    assert proc.returncode == 0 and errors == [], proc.stderr[-2000:]
    assert f"checkpoint saved at step 10: {path}" in proc.stdout
    assert not os.path.exists(path + ".lock")


def deployed(tmp_path, prelude="", directory=None):
    path = str((directory or tmp_path) / "export")
    return path, run(DLRM + ["--mode", "deploy", "--saved_model_output_path", path,
                             "--log_path", str(tmp_path / "log.json")], prelude)


def files_of(directory) -> dict:
    return {os.path.relpath(os.path.join(d, f), directory): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(directory) for f in names}


FULL_DISK = """
    import tensorflow as tf
    def save(obj, directory, **kwargs):  # TensorFlow's own writes fail as on a full disk
        open(directory + "/saved_model.pb", "wb").write(b"half")
        raise tf.errors.ResourceExhaustedError(
            None, None, directory + "/variables/variables.data-00000-of-00001.tempstate1; "
            "No space left on device")
    tf.saved_model.save = save
"""


def test_an_export_on_a_full_disk_is_one_line_and_keeps_the_previous(tmp_path):
    path, (proc, errors) = deployed(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = files_of(path)
    path, (proc, errors) = deployed(tmp_path, FULL_DISK)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: cannot write {path}: ")
    assert errors[0].endswith("No space left on device; nothing was left half-written; the "
                              "previous export, if any, is kept")
    assert files_of(path) == before and leftovers(tmp_path) == []


def test_an_export_on_a_real_full_filesystem(tmp_path, small_filesystem):
    path, (proc, errors) = deployed(tmp_path, directory=small_filesystem)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = files_of(path)
    fill(small_filesystem, leave=32 << 10)  # less than a second export needs
    path, (proc, errors) = deployed(tmp_path, directory=small_filesystem)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: cannot write {path}: ")
    assert "No space left on device" in errors[0], errors[0]
    assert files_of(path) == before and leftovers(small_filesystem) == []


KILLED_BETWEEN_RENAMES = """
    import os
    real = os.rename
    def rename(src, dst):
        real(src, dst)
        if dst.endswith("-old"):
            os._exit(9)
    os.rename = rename
"""


def test_an_export_killed_between_its_renames_is_recovered_by_the_next_writer(tmp_path,
                                                                             capsys):
    from core.parallel.comm import Communicator
    from training import outputs
    path, (proc, _) = deployed(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path, (proc, _) = deployed(tmp_path, KILLED_BETWEEN_RENAMES)
    assert proc.returncode == 9 and not os.path.exists(path)
    new, old = leftovers(tmp_path)
    assert old == new + "-old"
    staged = files_of(tmp_path / new)
    os.makedirs(tmp_path / ".export.tmp-dead")  # the staging of a run killed earlier
    with outputs.claimed(Communicator(), [path]):
        assert files_of(path) == staged and leftovers(tmp_path) == []
    assert capsys.readouterr().out == (f"{path}: moved back the complete copy {tmp_path}/{new} "
                                       f"that an interrupted write left beside it\n")


def test_wide_and_deep_and_sim_take_their_outputs_at_start(tmp_path, capsys):
    """The other families hold their checkpoint and export from the start (here this test
    process holds their export paths: the other run)."""
    from core.files import OutputLock
    from test_sim_training import SMALL, run_main, synthetic
    from test_wd_training import FAST, make_dataset
    from wide_and_deep.main import main as wide_and_deep
    wd, sim = tmp_path / "wd", tmp_path / "sim"
    held = [OutputLock(str(wd / "model" / "saved_model")), OutputLock(str(sim / "export"))]
    for lock in held:
        lock.acquire()
    try:
        assert wide_and_deep(["--dataset_path", make_dataset(str(tmp_path), "wd_data", 3.0),
                              "--model_dir", str(wd / "model"), "--results_dir", str(wd),
                              *FAST, "--num_epochs", "1"]) == 2
        run_main(["--dataset_dir", synthetic(tmp_path / "sim_data", "short", 300),
                  "--results_dir", str(sim), *SMALL, "--epochs", "1",
                  "--save_checkpoint_path", str(sim / "ck"), "--export_path", str(sim / "export")],
                 status=2)
    finally:
        for lock in held:
            lock.release()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [in_use(lock.path, os.getpid()) for lock in held]
    assert not os.path.exists(wd / "model" / "checkpoint") and not os.path.exists(sim / "ck")


def test_an_error_line_is_never_glued_to_another_threads_log_line():
    """A rank's `error:` line while a thread of the same process logs to stderr (as Horovod's
    background loop does when a peer ends): every line comes out whole."""
    script = """
import os, threading
from core.cli import print_error
done = threading.Event()
def log():
    while not done.is_set():
        os.write(2, b"E background loop: connection closed\\n")
thread = threading.Thread(target=log)
thread.start()
for i in range(2000):
    print_error(f"{i} is in use by another run")
done.set()
thread.join()
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.splitlines()
    expected = [f"error: {i} is in use by another run" for i in range(2000)]
    assert [line for line in lines if "error" in line] == expected
    assert set(lines) - set(expected) == {"E background loop: connection closed"}
