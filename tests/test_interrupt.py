"""SIGINT / SIGTERM stop training within a bounded time with one `error:` line (exit status
2), in one process and under `horovodrun -np 2`, and nothing is saved at the interrupt: the
checkpoint at the path is the last one written at its scheduled step (training/interrupt.py).
Every wait has a deadline that turns a hang into a failure naming what hung."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import HOROVODRUN, ROOT, kill_tree, rank_process, require_or_skip

CHECKPOINT_STEPS = 50
DLRM = ["main.py", "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities",
        "200,500,50", "--synthetic_dataset_num_numerical_features", "5", "--embedding_dim", "8",
        "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--batch_size", "256",
        "--valid_batch_size", "512", "--synthetic_dataset_train_batches", "1000000",
        "--synthetic_dataset_valid_batches", "1", "--cpu", "--warmup_steps", "0",
        "--learning_rate", "0.1", "--print_freq", "1000000",
        "--checkpoint_steps", str(CHECKPOINT_STEPS)]
DEADLINE_S = 300  # start-up, then the first checkpoint (two ranks importing TensorFlow on a loaded
#                  2-core machine took over 120 s once); the stop itself takes seconds


def start(cmd, tmp_path):
    """The command in its own session, its output in files (read while it runs)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    out, err = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err,
                            start_new_session=True)


def output(tmp_path):
    return (tmp_path / "out").read_text(), (tmp_path / "err").read_text()


def wait_for(proc, tmp_path, text):
    deadline = time.monotonic() + DEADLINE_S
    while text not in output(tmp_path)[0]:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc)
            pytest.fail(f"no '{text}' within {DEADLINE_S} s:\n{output(tmp_path)}", pytrace=False)
        time.sleep(0.2)


def stop_group(proc):
    kill_tree(proc)
    proc.wait()


def interrupted(proc, tmp_path, signum, processes):
    """Sends signum to proc; its exit status and stdout + stderr, once every process in
    `processes` is gone (a failure naming the survivors after the deadline)."""
    proc.send_signal(signum)
    try:
        returncode = proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(processes, timeout=30)
    except subprocess.TimeoutExpired:
        alive = ["the launched command"]
    if alive:
        stop_group(proc)
        pytest.fail(f"still running 60 s after {signal.Signals(signum).name}: {alive}\n"
                    f"{output(tmp_path)}", pytrace=False)
    return returncode, "".join(output(tmp_path))


def interrupt_lines(text):
    return [line for line in text.splitlines() if "error: interrupted by" in line]


def saved_step(path):
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)["position"]["step"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_one_process_with_one_line_keeping_the_last_checkpoint(signum,
                                                                              tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = start([sys.executable, *DLRM, "--log_path", str(tmp_path / "log.json"),
                  "--save_checkpoint_path", str(ckpt)], tmp_path)
    wait_for(proc, tmp_path, "checkpoint saved at step")
    returncode, text = interrupted(proc, tmp_path, signum, [psutil.Process(proc.pid)])
    assert returncode == 2, text
    lines = interrupt_lines(text)
    assert len(lines) == 1 and "Traceback" not in text, text
    name = signal.Signals(signum).name
    assert lines[0].startswith(f"error: interrupted by {name} at step "), lines
    stopped_at = int(lines[0].split(" at step ")[1].split(":")[0])
    step = saved_step(ckpt)  # a scheduled checkpoint, none at the interrupt
    assert step % CHECKPOINT_STEPS == 0 and 0 < step <= stopped_at, (step, stopped_at)
    assert lines[0].endswith(f"(the checkpoint of step {step} stays at {ckpt})"), lines


def test_a_process_blocked_away_from_step_boundaries_still_ends(tmp_path):
    """The watcher ends a process whose loop never reaches a step boundary (as a rank
    waiting in a collective for a peer that already stopped)."""
    script = ("import threading; from training.interrupt import StopOnSignal\n"
              "with StopOnSignal(grace_s=1.0) as stop:\n"
              "    stop.step = 7; print('blocked', flush=True); threading.Event().wait()\n")
    proc = start([sys.executable, "-c", script], tmp_path)
    wait_for(proc, tmp_path, "blocked")
    returncode, text = interrupted(proc, tmp_path, signal.SIGTERM, [psutil.Process(proc.pid)])
    assert returncode == 2
    assert interrupt_lines(text) == [
        "error: interrupted by SIGTERM at step 7: training stopped; nothing is saved at an "
        "interrupt (the last checkpoint written stays)"], text


def start_two_ranks(tmp_path):
    """horovodrun -np 2 training DLRM, once it saved its first checkpoint: (horovodrun's
    process, every process of the job, the ranks' processes by rank)."""
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    proc = start([HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, *DLRM,
                  "--log_path", str(tmp_path / "log.json"), "--save_checkpoint_path",
                  str(tmp_path / "ckpt")], tmp_path)
    wait_for(proc, tmp_path, "checkpoint saved at step")
    processes = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    try:
        ranks = {rank: rank_process(str(tmp_path / "log.json"), str(rank)) for rank in (0, 1)}
    except BaseException:
        stop_group(proc)
        raise
    return proc, processes, ranks


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_horovodrun_stops_every_rank(signum, tmp_path):
    proc, processes, _ = start_two_ranks(tmp_path)
    ckpt = tmp_path / "ckpt"
    returncode, text = interrupted(proc, tmp_path, signum, processes)
    assert returncode != 0, text
    # horovodrun sends SIGTERM to every rank; rank 0 alone says so (horovodrun then adds its
    # own report of the ranks' exit status)
    lines = interrupt_lines(text)
    assert len(lines) == 1 and "error: interrupted by SIGTERM at step " in lines[0], text
    stopped_at = int(lines[0].split(" at step ")[1].split(":")[0])
    step = saved_step(ckpt)
    assert step % CHECKPOINT_STEPS == 0 and 0 < step <= stopped_at, (step, stopped_at)


def test_a_rank_stopped_alone_ends_the_job_with_one_line(tmp_path):
    """SIGTERM to rank 1 alone: rank 0's next collective fails as Horovod shuts down. Rank 0
    ends with one error line, no traceback: the interrupt's (horovodrun then sends it
    SIGTERM) or, if that signal is late, the line naming the peer's end (core.parallel)."""
    proc, processes, ranks = start_two_ranks(tmp_path)
    ranks[1].send_signal(signal.SIGTERM)
    try:
        returncode = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        pytest.fail(f"horovodrun still running 60 s after rank 1's SIGTERM:\n"
                    f"{output(tmp_path)}", pytrace=False)
    psutil.wait_procs(processes, timeout=30)
    text = "".join(output(tmp_path))
    # the ranks' lines (horovodrun adds its own report and traceback of their exit status)
    ranks_text = "\n".join(line for line in text.splitlines() if line.startswith("["))
    errors = [line for line in ranks_text.splitlines() if "error:" in line]
    assert returncode != 0 and "Traceback" not in ranks_text, text
    assert len(errors) == 1, text
    assert ("error: interrupted by SIGTERM at step " in errors[0]
            or "error: rank 0: another rank ended while this one was in " in errors[0]), text
