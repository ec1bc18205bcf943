"""`sbatch slurm_multinode.sh` on a real Slurm (Debian's slurm-wlm, installed if missing): a
private cluster of one slurmctld and two slurmd (nodes n1 and n2 on this machine, each on its
own port) in the test's temp dir; the job's training against the same run under
`horovodrun -np 2 --gloo`, for 1 node x 2 tasks and 2 nodes x 1 task; the ranks Horovod gets
from Slurm's task layout; a failing task fails the job."""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HOROVODRUN, ROOT, bounded_run, horovodrun, require_or_skip
from core.dllog import read_log

sys.path.insert(0, os.path.join(ROOT, "tools"))
import slurm_launch  # noqa: E402

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
JOB_TIMEOUT_S = 240
START_TIMEOUT_S = 30
END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
              "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
TRAINING = ["main.py", "--dataset_type", "synthetic", "--synthetic_dataset_cardinalities",
            "3000,2000,300,50,700", "--synthetic_dataset_num_numerical_features", "5",
            "--embedding_dim", "16", "--bottom_mlp_dims", "32,16", "--top_mlp_dims", "64,32,1",
            "--cpu", "--seed", "11", "--synthetic_dataset_signal_strength", "3",
            "--valid_batch_size", "999", "--synthetic_dataset_valid_batches", "3",
            "--column_slice_threshold", "30000", "--data_parallel_threshold", "1000",
            "--batch_size", "512", "--synthetic_dataset_train_batches", "8", "--print_freq", "1",
            "--learning_rate", "0.3"]
# each task prints what Horovod will read, then trains
SHOW_RANK = ("echo rank=$HOROVOD_RANK/$HOROVOD_SIZE local=$HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE "
             "cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE host=$HOROVOD_HOSTNAME")


def install_slurm() -> str:
    """Debian's slurm-wlm when a binary is missing; '' when installed, else why not."""
    if all(shutil.which(b) for b in DAEMONS + CLIENTS):
        return ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed and this user cannot apt-get install slurm-wlm"
    # keep the packages' init scripts from starting daemons with the system's configuration
    policy = "/usr/sbin/policy-rc.d"
    added_policy = not os.path.exists(policy)
    if added_policy:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for cmd in (["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm"]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode:
                return f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}"
    finally:
        if added_policy:
            os.remove(policy)
    return ""


def free_ports(n: int) -> list:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def write_config(d, nodes) -> str:
    ctld_port, slurmd_port, *node_ports = free_ports(2 + len(nodes))
    host = socket.gethostname().split(".")[0]
    node_lines = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} "
                           f"CPUs={os.cpu_count()} State=UNKNOWN"
                           for n, p in zip(nodes, node_ports))
    config = f"""ClusterName=dlrmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
{node_lines}
PartitionName=test Nodes={','.join(nodes)} Default=YES MaxTime=10 State=UP
"""
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(d, sub))
    path = os.path.join(d, "slurm.conf")
    with open(path, "w") as f:
        f.write(config)
    return path


class Cluster:
    """slurmctld and one slurmd per node, each in its own process group, on `config`."""

    def __init__(self, d, config, nodes):
        self.dir, self.env = d, dict(os.environ, SLURM_CONF=config)
        self.daemons = [self._start(["slurmctld", "-D", "-f", config], "slurmctld")]
        self.daemons += [self._start(["slurmd", "-D", "-f", config, "-N", n], f"slurmd.{n}")
                         for n in nodes]

    def _start(self, cmd, name):
        out = open(os.path.join(self.dir, f"{name}.out"), "w")
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)

    def client(self, *cmd, **kwargs):
        return subprocess.run(cmd, env=kwargs.pop("env", self.env), capture_output=True,
                              text=True, timeout=30, **kwargs)

    def idle_nodes(self) -> int:
        states = self.client("sinfo", "-h", "-N", "-o", "%T").stdout.split()
        return sum(s == "idle" for s in states)

    def logs(self) -> str:
        tails = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    tails.append(f"--- {name}\n{f.read()[-1500:]}")
        return "\n".join(tails)

    def stop(self):
        """Cancel what still runs (its steps end with it), then end the daemons."""
        if self.daemons[0].poll() is None:
            try:
                jobs = self.client("squeue", "-h", "-o", "%i").stdout.split()
                if jobs:
                    self.client("scancel", *jobs)
            except subprocess.TimeoutExpired:
                pass  # a controller that does not answer is killed below
        for daemon in self.daemons:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = install_slurm()
    require_or_skip(not why, why)
    require_or_skip(os.geteuid() == 0, "the private Slurm cluster runs its daemons as root")
    d = str(tmp_path_factory.mktemp("slurm"))
    nodes = ["n1", "n2"]
    running = Cluster(d, write_config(d, nodes), nodes)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while running.idle_nodes() < len(nodes) and time.monotonic() < deadline:
            time.sleep(0.5)
        started = running.idle_nodes() == len(nodes)
        require_or_skip(started, f"the private Slurm cluster did not start within "
                        f"{START_TIMEOUT_S} s:\n{running.logs()}")
        yield running
    finally:
        running.stop()


def submit(cluster, tmp_path, nodes, tasks, cmd, name):
    """sbatch slurm_multinode.sh with `cmd`; waits for the job -> (state, exit code, log)."""
    log = tmp_path / f"{name}.out"
    env = dict(cluster.env, cmd=cmd, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = cluster.client("sbatch", "--parsable", "-N", str(nodes), "-n", str(tasks),
                          "-o", str(log), "-t", "5", "slurm_multinode.sh", env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        info = cluster.client("scontrol", "show", "job", "-o", job).stdout
        state = re.search(r"\bJobState=(\S+)", info).group(1)
        if state in END_STATES:
            exit_code = int(re.search(r"\bExitCode=(\d+):", info).group(1))
            return state, exit_code, log.read_text()
        time.sleep(0.5)
    cluster.client("scancel", job)
    text = log.read_text() if log.exists() else "(no job log)"
    pytest.fail(f"Slurm job {job} ({nodes} node(s) x {tasks // nodes} task(s)) did not end "
                f"within {JOB_TIMEOUT_S} s (hung?):\n{text[-3000:]}\n{cluster.logs()}",
                pytrace=False)


def parameters(log):
    return next(r["data"] for r in read_log(log) if r["type"] == "PARAMETER")


def final(log):
    return [r["data"] for r in read_log(log) if r["type"] == "LOG" and r["step"] == []][-1]


def losses(log):
    return {r["step"][1]: r["data"]["loss"] for r in read_log(log)
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"]
            and "loss" in r["data"]}


@pytest.fixture(scope="module")
def horovodrun_log(tmp_path_factory):
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    log = tmp_path_factory.mktemp("horovodrun") / "log.json"
    proc = bounded_run(horovodrun(2, sys.executable, *TRAINING, "--log_path", str(log)),
                       JOB_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return log


def ranks_shown(text) -> dict:
    found = re.findall(r"rank=(\d+)/(\d+) local=(\d+)/(\d+) cross=(\d+)/(\d+) host=(\S+)", text)
    return {int(r[0]): (r[6], *map(int, r[1:6])) for r in found}


# rank -> (host, size, local rank, local size, cross rank, cross size), as Horovod defines them
@pytest.mark.parametrize("nodes,tasks,expected_ranks", [
    (1, 2, {0: ("n1", 2, 0, 2, 0, 1), 1: ("n1", 2, 1, 2, 0, 1)}),
    (2, 2, {0: ("n1", 2, 0, 1, 0, 2), 1: ("n2", 2, 0, 1, 1, 2)}),
], ids=["1node_x_2tasks", "2nodes_x_1task"])
def test_sbatch_trains_as_horovodrun(cluster, horovodrun_log, tmp_path, nodes, tasks,
                                     expected_ranks):
    log = tmp_path / "log.json"
    cmd = f"{SHOW_RANK}; python {shlex.join(TRAINING)} --log_path {log}"
    state, exit_code, text = submit(cluster, tmp_path, nodes, tasks, cmd, "job")
    assert (state, exit_code) == ("COMPLETED", 0), f"{text[-3000:]}\n{cluster.logs()}"
    assert ranks_shown(text) == expected_ranks, text[-3000:]
    assert "global batch 512, 2 process(es)" in text
    assert parameters(log)["world_size"] == parameters(horovodrun_log)["world_size"] == 2
    reference, got = losses(horovodrun_log), losses(log)
    assert sorted(got) == sorted(reference) == list(range(1, 9))
    for step in reference:
        assert abs(got[step] - reference[step]) < 1e-6, (step, got[step], reference[step])
    assert abs(final(log)["auc"] - final(horovodrun_log)["auc"]) < 1e-6


def test_a_failing_task_fails_the_job(cluster, tmp_path):
    # rank 1 fails at once; rank 0 would wait forever without srun's --kill-on-bad-exit
    cmd = 'if [ "$HOROVOD_RANK" = 1 ]; then exit 3; fi; sleep 600'
    state, exit_code, text = submit(cluster, tmp_path, 1, 2, cmd, "failing")
    assert state == "FAILED" and exit_code != 0, (state, exit_code, text)


def test_tasks_per_node_expands_slurms_compressed_form():
    assert slurm_launch.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm_launch.tasks_per_node("4") == [4]
    with pytest.raises(slurm_launch.LaunchError, match="SLURM_TASKS_PER_NODE='2x'"):
        slurm_launch.tasks_per_node("2x")


def test_uneven_layout_gives_horovods_local_and_cross_ranks(monkeypatch):
    # 3 tasks: two on a, one on b; local rank 1 exists only on a
    monkeypatch.setenv(slurm_launch.HOSTS_VARIABLE, "a:2,b:1")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("HOROVOD_GLOO_IFACE", "lo")
    expected = {("a", 0): ("2", "0", "2"), ("a", 1): ("2", "0", "1"), ("b", 0): ("1", "1", "2")}
    for procid, ((node, local), (local_size, cross_rank, cross_size)) in enumerate(
            expected.items()):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        monkeypatch.setenv("SLURM_LOCALID", str(local))
        monkeypatch.setenv("SLURM_PROCID", str(procid))
        got = slurm_launch.rank_variables()
        assert (got["HOROVOD_RANK"], got["HOROVOD_SIZE"], got["HOROVOD_LOCAL_SIZE"],
                got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == (
                    str(procid), "3", local_size, cross_rank, cross_size)


def test_outside_slurm_is_one_error_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "slurm_launch.py"),
                           "launch", "--", "true"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: SLURM_JOB_NODELIST is unset: run this inside a Slurm job (sbatch "
        "slurm_multinode.sh)"]


def test_with_a_container_srun_runs_cmd_in_it_over_pmix(tmp_path):
    # no pyxis/enroot here: a stand-in srun records the command line the script builds
    (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp_path / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", cmd="python main.py --amp",
               cont="dlrm:latest", mounts="/raid:/data", srun_flags="--gpus-per-task=1 -l")
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm_multinode.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == [
        "--mpi=pmix", "--container-image=dlrm:latest", "--container-workdir=/workspace/dlrm",
        "--container-mounts=/raid:/data", "--gpus-per-task=1", "-l", "bash", "-c",
        "python main.py --amp"]


def test_submitted_outside_the_repository_is_one_error_line(tmp_path):
    env = dict(os.environ, cmd="python main.py", SLURM_SUBMIT_DIR=str(tmp_path))
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm_multinode.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: submit slurm_multinode.sh from the repository root ({tmp_path} has no "
        "tools/slurm_launch.py)"]
