"""Hybrid-parallel training under horovodrun (Gloo, CPU, 2 or 3 processes) against 1 process
with the same global batch: losses step by step, final tables, eval AUC, checkpoint
cross-restore (also with a rank that holds no table), evaluation gathered on rank 0 only,
device configuration before TensorFlow starts, uneven batches and a killed rank."""
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import (HOROVODRUN, bounded_run, horovodrun, kill_tree, rank_process,
                      require_or_skip)
from core.dllog import read_log
from core.parallel.placement import make_plan
from test_training import main_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARDINALITIES = "3000,2000,300,50,700"
MODEL = ["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", CARDINALITIES,
         "--synthetic_dataset_num_numerical_features", "5", "--embedding_dim", "16",
         "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "64,32,1", "--cpu", "--seed", "11",
         "--synthetic_dataset_signal_strength", "3", "--valid_batch_size", "999",
         "--synthetic_dataset_valid_batches", "3",
         # table 0 (48k elements) and 1 (32k) are column-sliced, table 3 (800) is replicated
         "--column_slice_threshold", "30000", "--data_parallel_threshold", "1000"]
TRAIN = ["--batch_size", "512", "--synthetic_dataset_train_batches", "24", "--print_freq", "1",
         "--warmup_steps", "4", "--decay_start_step", "12", "--decay_steps", "12"]

require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}: the "
                "hybrid-parallel tests need horovod (tools/setup_env.sh builds it)")


def launch(np_, *args, timeout=600, env=None):
    if np_ == 1:
        cmd = [sys.executable, "main.py", *args]
    else:
        cmd = horovodrun(np_, sys.executable, "main.py", *args)
    return bounded_run(cmd, timeout, env)


def ok(proc):
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def train(np_, *args):
    """A run that must succeed and restores nothing: one process runs in this one (no
    interpreter and TensorFlow start-up), more under horovodrun."""
    if np_ == 1:
        main_in_process(args)
    else:
        ok(launch(np_, *args))


def losses(log):
    return {r["step"][1]: r["data"]["loss"] for r in read_log(log)
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"]
            and "loss" in r["data"]}


def final(log):
    return [r["data"] for r in read_log(log) if r["type"] == "LOG" and r["step"] == []][-1]


def test_plan_slices_and_replicates_as_configured():
    plan = make_plan([3000, 2000, 300, 50, 700], 16, 2, 30000, 1000)
    assert plan.replicated == (3,)
    assert sorted((p.table, p.col_start, p.col_stop) for p in plan.pieces) == [
        (0, 0, 8), (0, 8, 16), (1, 0, 8), (1, 8, 16), (2, 0, 16), (4, 0, 16)]
    assert {p.rank for p in plan.pieces_of(0)} == {0, 1}  # slices on different ranks
    assert abs(plan.bytes_on(0) - plan.bytes_on(1)) <= 700 * 16 * 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """1- and 2-process trainings with SGD and Adam, each saving a checkpoint."""
    base = tmp_path_factory.mktemp("hybrid")
    out = {}
    for optimizer, lr in (("sgd", "0.3"), ("adam", "0.01")):
        for np_ in (1, 2):
            d = base / f"{optimizer}{np_}"
            d.mkdir()
            train(np_, *MODEL, *TRAIN, "--optimizer", optimizer, "--learning_rate", lr,
                  "--log_path", str(d / "log.json"), "--save_checkpoint_path", str(d / "ckpt"))
            out[(optimizer, np_)] = d
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_processes_match_one(runs, optimizer):
    one, two = runs[(optimizer, 1)], runs[(optimizer, 2)]
    l1, l2 = losses(one / "log.json"), losses(two / "log.json")
    assert sorted(l1) == sorted(l2) == list(range(1, 25))
    for step in l1:
        assert abs(l1[step] - l2[step]) <= 1e-5, (step, l1[step], l2[step])
    assert l1[24] < l1[1]  # it trained
    for t in range(5):
        np.testing.assert_allclose(np.load(two / "ckpt" / f"table_{t}.npy"),
                                   np.load(one / "ckpt" / f"table_{t}.npy"), atol=1e-5)
    assert abs(final(one / "log.json")["auc"] - final(two / "log.json")["auc"]) <= 1e-5
    assert final(two / "log.json")["eval_samples"] == 3 * 999


def test_checkpoints_cross_restore(runs, tmp_path):
    for saved, restored in ((2, 1), (1, 2)):
        source = runs[("sgd", saved)]
        log = tmp_path / f"eval_{saved}_to_{restored}.json"
        ok(launch(restored, *MODEL, "--mode", "eval", "--restore_checkpoint_path",
                  str(source / "ckpt"), "--log_path", str(log)))
        assert abs(final(log)["auc"] - final(source / "log.json")["auc"]) <= 1e-5


# more ranks (3) than tables (2): rank 2 holds no table and reads no ids
TWO_TABLES = [*MODEL[:MODEL.index("--column_slice_threshold")], "--batch_size", "384"]
TWO_TABLES[TWO_TABLES.index(CARDINALITIES)] = "3000,2000"


@pytest.fixture(scope="module")
def tableless_rank_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tableless")
    for np_ in (1, 3):
        d = base / f"np{np_}"
        d.mkdir()
        train(np_, *TRAIN, *TWO_TABLES, "--learning_rate", "0.3", "--log_path",
              str(d / "log.json"), "--save_checkpoint_path", str(d / "ckpt"))
    return base


def test_rank_without_tables_trains_like_one_process(tableless_rank_runs):
    assert make_plan([3000, 2000], 16, 3).pieces_on(2) == []
    one, three = tableless_rank_runs / "np1", tableless_rank_runs / "np3"
    l1, l3 = losses(one / "log.json"), losses(three / "log.json")
    assert sorted(l1) == sorted(l3) == list(range(1, 25))
    for step in l1:
        assert abs(l1[step] - l3[step]) <= 1e-5, (step, l1[step], l3[step])
    assert abs(final(one / "log.json")["auc"] - final(three / "log.json")["auc"]) <= 1e-5
    assert final(three / "log.json")["eval_samples"] == 3 * 999


def test_rank_without_tables_checkpoints_cross_restore(tableless_rank_runs, tmp_path):
    for saved, restored in ((3, 1), (1, 3)):
        source = tableless_rank_runs / f"np{saved}"
        log = tmp_path / f"eval_{saved}_to_{restored}.json"
        ok(launch(restored, *TWO_TABLES, "--mode", "eval", "--restore_checkpoint_path",
                  str(source / "ckpt"), "--log_path", str(log)))
        assert abs(final(log)["auc"] - final(source / "log.json")["auc"]) <= 1e-5


def run_script(np_, code, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + code)
    proc = ok(bounded_run(horovodrun(np_, sys.executable, str(script)), timeout=300))
    return proc.stdout


def test_evaluation_gathers_to_rank_zero_only(tmp_path):
    out = run_script(3, """
import numpy as np
from core.parallel.comm import make_communicator
comm = make_communicator(cpu=True)
gathered = comm.gather_to_root(np.full(comm.rank + 1, comm.rank, np.float32))
figures = comm.broadcast_from_root(np.array([comm.rank + 0.5, 7.0]))
print(f"RESULT {comm.rank} {gathered.tolist()} {figures.tolist()}", flush=True)
""", tmp_path)
    results = sorted(line.split("RESULT ")[1] for line in out.splitlines() if "RESULT " in line)
    assert results == ["0 [0.0, 1.0, 1.0, 2.0, 2.0, 2.0] [0.5, 7.0]", "1 [] [0.5, 7.0]",
                       "2 [] [0.5, 7.0]"]


def test_devices_are_configured_before_tensorflow_initialises(tmp_path):
    """main.py start-up: TensorFlow refuses device settings (visible GPU, memory growth) once
    its eager context exists, so that must not exist yet when they are applied."""
    argv = ["main.py", *MODEL, "--print_plan", "--log_path", str(tmp_path / "log.json")]
    out = run_script(2, f"""
from core import runtime
runtime.configure()
import tensorflow as tf
from tensorflow.python.eager import context
real = tf.config.set_visible_devices

def spy(*args, **kwargs):
    print("CONTEXT_INITIALISED", context.context()._context_handle is not None, flush=True)
    return real(*args, **kwargs)

tf.config.set_visible_devices = spy
sys.argv = {argv!r}
import main
main.run()
""", tmp_path)
    assert out.count("CONTEXT_INITIALISED False") == 2, out
    assert "CONTEXT_INITIALISED True" not in out


def test_global_batch_smaller_than_the_world_is_rejected(tmp_path):
    proc = launch(3, *MODEL, *TRAIN, "--batch_size", "2", "--log_path",
                  str(tmp_path / "log.json"))
    assert proc.returncode != 0
    assert "--batch_size 2 is smaller than the number of processes (3)" in \
        proc.stdout + proc.stderr


def test_killed_rank_ends_the_job(tmp_path):
    log = tmp_path / "log.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    cmd = horovodrun(2, sys.executable, "main.py", *MODEL, *TRAIN,
                     "--synthetic_dataset_train_batches", "100000", "--log_path", str(log),
                     "--learning_rate", "0.5")  # the default 24 diverges on this long run
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (log.exists() and len(losses(log)) >= 3):
            time.sleep(0.5)
        assert log.exists() and len(losses(log)) >= 3, "training never started"
        victim = rank_process(str(log), rank="1")
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        try:
            returncode = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the job still ran 60 s after rank 1 was killed", pytrace=False)
        assert returncode != 0
        assert time.time() - killed_at < 60
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        shutil.rmtree(tmp_path, ignore_errors=True)


# A Criteo-like table mix: big tables (column-sliced), a mid-size one placed whole and
# several tiny ones (replicated). Replicating two or more tables used to hang: the sparse
# gradient sums got Horovod names from graph tensors, numbered differently on each rank.
MIX_CARDINALITIES = "4000,3000,600,40,30,20,3"
MIX = ["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities", MIX_CARDINALITIES,
       "--synthetic_dataset_num_numerical_features", "5", "--embedding_dim", "16",
       "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "32,1", "--cpu", "--seed", "5",
       "--synthetic_dataset_signal_strength", "3", "--valid_batch_size", "600",
       # 400 rows: 200 per rank on 2 processes, 133/133/134 on 3 (uneven slices)
       "--synthetic_dataset_valid_batches", "2", "--batch_size", "400",
       "--synthetic_dataset_train_batches", "8", "--print_freq", "1", "--warmup_steps", "2",
       "--learning_rate", "0.5", "--collective_timeout_s", "90"]
# (processes, --column_slice_threshold, --data_parallel_threshold); None: the flag's default
MIX_LAYOUTS = [(2, "40000", "1000"), (3, "20000", "500"), (2, None, None)]


def mix_layout_flags(slice_threshold, replicate_threshold):
    if slice_threshold is None:
        return []
    return ["--column_slice_threshold", slice_threshold,
            "--data_parallel_threshold", replicate_threshold]


@pytest.fixture(scope="module")
def mix_runs(tmp_path_factory):
    """One 1-process run (placement does not change the maths) and one run per layout."""
    base = tmp_path_factory.mktemp("mix")
    out = {}
    for key in [(1, None, None), *MIX_LAYOUTS]:
        log = base / ("_".join(map(str, key)) + ".json")
        train(key[0], *MIX, *mix_layout_flags(*key[1:]), "--log_path", str(log))
        out[key] = log
    return out


def test_mix_layouts_slice_replicate_and_place_whole():
    cards = [int(c) for c in MIX_CARDINALITIES.split(",")]
    for np_, slice_threshold, replicate_threshold in MIX_LAYOUTS[:2]:
        plan = make_plan(cards, 16, np_, int(slice_threshold), int(replicate_threshold))
        sliced = {p.table for p in plan.pieces if len(plan.pieces_of(p.table)) > 1}
        whole = {p.table for p in plan.pieces} - sliced
        assert len(plan.replicated) >= 3 and sliced and whole, plan.describe()


@pytest.mark.parametrize("layout", MIX_LAYOUTS, ids=lambda k: f"np{k[0]}_{k[1]}_{k[2]}")
def test_mix_of_replicated_sliced_and_whole_tables_matches_one_process(mix_runs, layout):
    one, many = mix_runs[(1, None, None)], mix_runs[layout]
    l1, ln = losses(one), losses(many)
    assert sorted(l1) == sorted(ln) == list(range(1, 9))
    for step in l1:
        assert abs(l1[step] - ln[step]) <= 1e-5, (step, l1[step], ln[step])
    assert abs(final(one)["auc"] - final(many)["auc"]) <= 1e-4
    assert final(many)["eval_samples"] == 2 * 600


def test_a_rank_that_stops_coming_is_named_and_ends_the_job(tmp_path):
    """Rank 1 sleeps before step 2 far longer than the stall limit: rank 0, waiting in that
    step's collectives, names them, the step and rank 1, and the job exits non-zero. The limit
    (20 s) leaves room for step 1's tracing on a loaded machine, far below the 120 s sleep."""
    proc = launch(2, *MIX, "--column_slice_threshold", "40000", "--data_parallel_threshold",
                  "1000", "--collective_timeout_s", "20", "--log_path", str(tmp_path / "l.json"),
                  env={"DLRM_TEST_DELAY_RANK": "1:2:120"}, timeout=110)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "error: rank 0" in line]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    message = lines[0]
    assert "in the training step's collectives (embedding_alltoall," in message
    assert "replicated_grad_table_3" in message and "at step 2" in message
    assert "waiting for rank(s) [1]" in message
    assert "rank 1 is outside collectives, last in the same collectives at step 1" in message
