"""preproc/prepare_dataset.sh on a Spark standalone cluster (one master, one worker, both on
127.0.0.1, started with the daemon script bundled in the pyspark package) gives the same bytes
as Spark's local mode, on the real Criteo rows."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import require_or_skip
from test_preproc import HAS_JAVA, HEAD, dirs_env, models_content, run_script, tree_digest

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def free_ports(count):
    """Ports free right now on 127.0.0.1 (the sockets stay open until all are picked, so the
    ports differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for(condition, what, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive_workers(ui_port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return json.load(r).get("aliveworkers", 0)
    except OSError:
        return 0


@pytest.fixture
def standalone_cluster(tmp_path):
    """spark://127.0.0.1:<port> with one worker (2 cores, 1g); stopped even when the test
    fails. Pid and log files live in tmp_path, so parallel runs do not meet."""
    require_or_skip(HAS_JAVA, "Spark needs Java (a JRE on PATH or JAVA_HOME)")
    import pyspark
    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    daemon = os.path.join(spark_home, "sbin", "spark-daemon.sh")
    require_or_skip(os.path.isfile(daemon), f"{daemon} missing from the pyspark package")
    master_port, master_ui, worker_port, worker_ui = free_ports(4)
    env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_MASTER_HOST="127.0.0.1", SPARK_PID_DIR=str(tmp_path / "pids"),
               SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_WORKER_DIR=str(tmp_path / "work"),
               SPARK_IDENT_STRING=f"preproc-test-{os.getpid()}")
    url = f"spark://127.0.0.1:{master_port}"
    daemons = [(MASTER, ["--host", "127.0.0.1", "--port", str(master_port),
                         "--webui-port", str(master_ui)]),
               (WORKER, ["--host", "127.0.0.1", "--port", str(worker_port),
                         "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g",
                         url])]
    started = []
    try:
        for cls, args in daemons:
            subprocess.run(["bash", daemon, "start", cls, "1", *args], env=env, check=True,
                           capture_output=True, timeout=60)
            started.append(cls)
        wait_for(lambda: alive_workers(master_ui) >= 1, "the worker to register")
        yield url, env
    finally:
        for cls in reversed(started):
            subprocess.run(["bash", daemon, "stop", cls, "1"], env=env, capture_output=True,
                           timeout=60)


def test_standalone_cluster_output_is_byte_identical_to_local_mode(spark_runs,
                                                                    standalone_cluster,
                                                                    tmp_path):
    """The cluster run against test_preproc.py's local-mode run of the same command (threshold
    2, the same day files), made once a session."""
    require_or_skip(os.path.isfile(HEAD), "needs the real Criteo rows (shared/data/criteo)")
    url, cluster_env = standalone_cluster
    local = spark_runs[2]["env"]
    env = dict(dirs_env(str(tmp_path), "cluster"), download_dir=local["download_dir"],
               SPARK_LOCAL_IP="127.0.0.1", SPARK_MASTER=url, TOTAL_MEMORY="768m",
               DRIVER_MEMORY="1g", EXECUTOR_CORES="2")
    run_script(["CPU", "2"], env)
    outputs = {}
    for tag, dirs in (("local", local), ("cluster", env)):
        with open(os.path.join(dirs["spark_output_path"], "summary.json")) as f:
            summary = json.load(f)
        outputs[tag] = (tree_digest(dirs["final_output_dir"]),
                        models_content(os.path.join(dirs["spark_output_path"], "models")),
                        summary)
    assert outputs["cluster"][2]["master"] == url
    assert outputs["local"][2]["master"].startswith("local")
    assert outputs["cluster"][2]["rows"] == outputs["local"][2]["rows"]
    assert outputs["cluster"][0] == outputs["local"][0]
    assert outputs["cluster"][1] == outputs["local"][1]
