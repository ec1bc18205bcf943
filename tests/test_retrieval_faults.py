"""The retrieval CLI's faults: a training run killed (SIGKILL) or stopped (SIGTERM) mid-run
resumes and ends as an uninterrupted one; every write error is one `error:` line naming the
path, with what was there before kept; a new run into a run's directory is refused unless a
flag says what to do; number flags outside their range are refused; the SavedModel looks up
every non-zero raw id, negative ones included, and counts the ids its table lacks."""
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, bounded_run, fill, kill_tree
from core.feature_spec import DynamicSpec
from core.files import OutputLock
from retrieval.export import export
from retrieval.model import Encoder, RetrievalConfig
from test_retrieval_model import np_encode, randomised
from test_retrieval_training import TINY, prepare, results, retrieval, successor_lines

WAIT_S = 300
# 6 epochs of about 10 steps, a checkpoint every 4 steps and at every epoch's end
RESUMABLE = ["--model", "sasrec", *TINY, "--early_stopping_patience", "0", "--epochs", "6",
             "--checkpoint_steps", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("faults"), "successors", successor_lines(300))


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("straight") / "run")
    retrieval(*RESUMABLE, "--dataset_dir", data, "--output_dir", out)
    return out


def arrays(out) -> dict:
    with np.load(os.path.join(out, "checkpoint", "arrays.npz")) as a:
        return {name: a[name] for name in a.files}


def error_lines(proc) -> list:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def one_error(proc) -> str:
    errors = error_lines(proc)
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def run_main(*args, prelude=""):
    """retrieval.main in a subprocess; prelude: Python run first (a simulated fault)."""
    code = f"import runpy, sys\n{prelude}\nsys.argv = ['retrieval.main', *{list(args)!r}]\n" \
           f"runpy.run_module('retrieval.main', run_name='__main__')"
    return bounded_run([sys.executable, "-c", code], timeout=WAIT_S)


def files_of(directory) -> dict:
    return {os.path.relpath(os.path.join(d, f), directory): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(directory) for f in names}


# ---- a run cut short resumes exactly --------------------------------------------------------
def stop_after_a_checkpoint(command, signum, out_file) -> tuple:
    """Start `command`; once it saved a checkpoint at step 12 or later (past the first epoch,
    between two saves), send `signum`. (exit status, its output, the saved step)."""
    with open(out_file, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=out,
                                text=True, start_new_session=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    seen, saved = [], None
    try:
        for line in proc.stdout:
            seen.append(line)
            found = re.match(r"checkpoint saved at step (\d+): .*checkpoint$", line.strip())
            if found and int(found.group(1)) >= 12:
                saved = int(found.group(1))
                os.kill(proc.pid, signum)
                break
        rest = proc.stdout.read()
        status = proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail(f"still running {WAIT_S} s after {signal.Signals(signum).name}",
                    pytrace=False)
    assert saved is not None, "".join(seen)[-3000:]
    return status, "".join(seen) + rest + open(out_file).read(), saved


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_stopped_mid_run_resumes_to_the_uninterrupted_one(data, straight, tmp_path,
                                                                signum):
    out = str(tmp_path / "cut")
    command = [sys.executable, "-m", "retrieval.main", *RESUMABLE, "--dataset_dir", data,
               "--output_dir", out]
    status, text, saved = stop_after_a_checkpoint(command, signum, tmp_path / "stderr")
    assert not os.path.exists(os.path.join(out, "results.json")), "the run was not cut short"
    meta = json.load(open(os.path.join(out, "checkpoint", "meta.json")))
    assert meta["position"]["step"] >= saved
    if signum == signal.SIGTERM:
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert status == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
        step = meta["position"]["step"]
        assert errors[0].endswith(f"(the checkpoint of step {step} stays at "
                                  f"{os.path.join(out, 'checkpoint')})"), errors
    else:
        assert status == -signal.SIGKILL
    retrieval(*RESUMABLE, "--dataset_dir", data, "--output_dir", out, "--resume")
    assert results(out) == results(straight)
    want, got = arrays(straight), arrays(out)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# ---- a run's directory is not taken over silently -------------------------------------------
def test_a_new_run_into_a_runs_directory_is_refused_unless_a_flag_says_what_to_do(
        data, straight, tmp_path):
    out = str(tmp_path / "run")
    retrieval("--model", "sasrec", "--dataset_dir", data, "--output_dir", out, *TINY,
              "--max_steps", "3")
    before = files_of(out)
    line = one_error(run_main("--model", "sasrec", "--dataset_dir", data, "--output_dir", out,
                              *TINY, "--max_steps", "3"))
    assert line.startswith(f"error: --output_dir {out} holds a finished training run"), line
    assert all(flag in line for flag in ("--resume", "--warm_start", "--overwrite")), line
    assert files_of(out) == before  # not even a log line

    retrieval("--model", "hstu", "--dataset_dir", data, "--output_dir", out, *TINY,
              "--max_steps", "2", "--overwrite")
    assert len([line for line in open(os.path.join(out, "log.json"))
                if '"PARAMETER"' in line]) == 1
    assert json.load(open(os.path.join(out, "checkpoint", "meta.json")))["position"]["step"] \
        == 2


def test_a_run_refused_at_its_start_writes_nothing(data, tmp_path):
    """A run holds the log as it holds its checkpoint: a second one aiming there ends at
    once, without a line in the holder's log."""
    out = tmp_path / "held"
    out.mkdir()
    (out / "log.json").write_text("the holder's\n")
    holder = OutputLock(str(out / "log.json"))
    holder.acquire()
    try:
        line = one_error(run_main("--model", "sasrec", "--dataset_dir", data, "--output_dir",
                                  str(out), *TINY))
    finally:
        holder.release()
    assert "log.json is in use by another run" in line, line
    assert sorted(os.listdir(out)) == ["log.json"]
    assert (out / "log.json").read_text() == "the holder's\n"


# ---- write errors: one line, nothing lost -----------------------------------------------------
def test_a_file_as_output_dir_is_one_line(data, tmp_path):
    path = tmp_path / "a_file"
    path.write_text("kept\n")
    line = one_error(run_main("--model", "sasrec", "--dataset_dir", data, "--output_dir",
                              str(path), *TINY))
    assert line == f"error: --output_dir {path} is a file, not a directory"
    assert path.read_text() == "kept\n"


def test_a_full_filesystem_at_the_start_is_one_line_leaving_nothing(data, tmp_path,
                                                                    small_filesystem):
    fill(small_filesystem, leave=0)
    out = small_filesystem / "run"
    line = one_error(run_main("--model", "sasrec", "--dataset_dir", data, "--output_dir",
                              str(out), *TINY))
    assert line.startswith(f"error: cannot write {out}/"), line
    assert "No space left on device" in line, line
    assert sorted(os.listdir(small_filesystem)) == ["filler", "run"]
    assert os.listdir(out) == []

    source = tmp_path / "seq.txt"
    source.write_text("\n".join(successor_lines(20)) + "\n")
    dst = small_filesystem / "prepared"
    line = one_error(bounded_run([sys.executable, "-m", "retrieval.prepare_dataset", "--src",
                                  str(source), "--format", "lines", "--dst", str(dst)],
                                 timeout=WAIT_S))
    assert "No space left on device" in line and str(dst) in line, line
    assert sorted(os.listdir(small_filesystem)) == ["filler", "run"]


# a full disk under one writer: it writes half its file, then fails as the disk does
FULL_AT = """
import errno, os
def full(path):
    open(path, "wb").write(b"half")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
"""
FULL_AT_CURVES = FULL_AT + """
import matplotlib.figure
matplotlib.figure.Figure.savefig = lambda self, path, **kwargs: full(path)
"""
FULL_AT_EMBEDDINGS = FULL_AT + """
import numpy as np
np.savez = lambda path, **arrays: full(path)
"""


def test_a_full_disk_at_the_curves_keeps_the_previous_png(data, tmp_path):
    out = str(tmp_path / "run")
    common = ["--model", "sasrec", "--dataset_dir", data, "--output_dir", out, *TINY,
              "--max_steps", "3"]
    retrieval(*common)
    before = files_of(out)
    curves = os.path.join(out, "curves.png")
    line = one_error(run_main(*common, "--resume", prelude=FULL_AT_CURVES))
    assert line.startswith(f"error: cannot write {curves} ({curves}.tmp.png): No space left "
                           f"on device"), line
    assert open(curves, "rb").read() == before["curves.png"]
    assert [f for f in os.listdir(out) if ".tmp" in f] == []
    assert results(out)["best_epoch"] == 0  # the resumed run's results are written first


def test_a_full_disk_at_the_embeddings_file_keeps_the_previous_export(data, tmp_path):
    out = str(tmp_path / "run")
    common = ["--model", "sasrec", "--dataset_dir", data, "--output_dir", out, *TINY]
    retrieval(*common, "--max_steps", "3")
    retrieval(*common, "--mode", "export", "--top_k", "5")
    saved_model = os.path.join(out, "saved_model")
    before = files_of(saved_model)
    line = one_error(run_main(*common, "--mode", "export", "--top_k", "7",
                              prelude=FULL_AT_EMBEDDINGS))
    assert line.startswith(f"error: cannot write {saved_model} ("), line
    assert "No space left on device; nothing was left half-written" in line, line
    assert files_of(saved_model) == before
    assert [f for f in os.listdir(out) if ".tmp" in f or f.startswith(".")] == []


# ---- numbers in range --------------------------------------------------------------------
@pytest.mark.parametrize("flag,value", [
    ("--lr", "-1"), ("--lr", "0"), ("--temperature", "-1"), ("--temperature", "0"),
    ("--dropout_rate", "2"), ("--dropout_rate", "1"), ("--attention_dropout", "1"),
    ("--weight_decay", "-1"), ("--divergence_factor", "-1"), ("--checkpoint_steps", "-1"),
])
def test_a_number_flag_outside_its_range_is_one_line(data, tmp_path, flag, value):
    out = tmp_path / "out"
    line = one_error(run_main("--model", "sasrec", "--dataset_dir", data, "--output_dir",
                              str(out), *TINY, flag, value))
    assert flag in line, line
    assert not out.exists()


# ---- serving raw ids --------------------------------------------------------------------
def served(model, tmp_path, histories):
    path = str(tmp_path / "saved_model")
    if not os.path.exists(path):
        export(model, path, k=4)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    got = serve(item_ids=tf.constant(histories, tf.int64))
    return got["top_k_ids"].numpy(), got["unknown_ids"].numpy()


def brute_force(model, rows, ids_of_rows, k=4):
    """numpy: the top-k ids for a history of table rows (left-padded to the model's length)."""
    padded = np.zeros(model.config.length, np.int64)
    padded[-len(rows):] = rows
    query = np_encode(model, padded[None])[0, -1]
    table = model.named["item_embeddings"].numpy()[1:len(ids_of_rows) + 1]
    return np.asarray(ids_of_rows)[np.argsort(-(table @ query), kind="stable")[:k]]


def test_negative_raw_ids_are_served_and_unknown_ones_counted(tmp_path):
    config = RetrievalConfig(model="sasrec", items=8, length=4, width=8, normalize=False)
    model = randomised(Encoder(config, DynamicSpec()))
    raw = [-7, -3, 5, -(10 ** 12), 11, -2]
    rows, _ = model.rows(tf.constant(raw, tf.int64), training=True)
    assert rows.numpy().tolist() == [1, 2, 3, 4, 5, 6]
    top, unknown = served(model, tmp_path, [[-7, -3, -2, 0], [-7, 42, -3, -9], [0, 0, 0, 0]])
    np.testing.assert_array_equal(top[0], brute_force(model, [1, 2, 6], raw))
    # 42 and -9 were never mapped: left out (the history is -7, -3) and counted
    np.testing.assert_array_equal(top[1], brute_force(model, [1, 2], raw))
    assert unknown.tolist() == [0, 2, 0]
    assert not np.array_equal(top[0], top[2])  # not read as an empty history


def test_a_static_table_leaves_out_and_counts_ids_outside_it(tmp_path):
    config = RetrievalConfig(model="hstu", items=10, length=4, width=8, normalize=False)
    model = randomised(Encoder(config))
    top, unknown = served(model, tmp_path, [[3, -2, 9, 11, 8], [3, 9, 8, 0, 0]])
    np.testing.assert_array_equal(top[0], top[1])
    np.testing.assert_array_equal(top[0], brute_force(model, [3, 9, 8], range(1, 11)))
    assert unknown.tolist() == [2, 0]


def test_an_open_vocabulary_split_by_rows_is_one_line(data, tmp_path):
    """--sharding row splits a static table; the dynamic one (mapped on every process) is
    refused at the start, naming the flag to give instead."""
    out = tmp_path / "run"
    line = one_error(run_main("--dataset_dir", data, "--output_dir", str(out), *TINY,
                              "--dynamic_features", "item_ids", "--sharding", "row"))
    assert line.startswith("error: --sharding row splits a static item table") and \
        "--sharding data_parallel" in line, line
    assert not os.path.exists(out / "checkpoint")
