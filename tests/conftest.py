"""Shared test fixtures: the repository root on sys.path, a small dataset writer,
require_or_skip for tests of layers that need tools a machine may lack, and bounded_run for
commands that could hang."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from core.spark import HUGE_METHODS  # noqa: E402

# The tests' Spark jobs are small and short: the JVMs pyspark starts (in process, and in
# the jobs the tests launch) compile with the quick JIT tier only (measured: the Outbrain
# job's three test runs 158 -> 139 s). These options replace a job's own driver options,
# so the one a job sets (HUGE_METHODS) is kept in them.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-java-options "
                      f"'-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {HUGE_METHODS}' pyspark-shell")

REQUIRE_ALL = "DLRM_REQUIRE_ALL"
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def bash_lines(text: str) -> list:
    """The command lines of a README text's bash blocks: continuation lines joined, comments
    dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def horovodrun(np_: int, *command) -> list:
    """The command line running `command` on np_ local Gloo ranks, launched by horovod's
    runner without its per-launch build check (tests/horovodrun_unchecked.py)."""
    return [sys.executable, os.path.join(ROOT, "tests", "horovodrun_unchecked.py"), "-np",
            str(np_), "-H", f"localhost:{np_}", "--gloo", *command]


def require_or_skip(condition: bool, reason: str) -> None:
    """Skip the calling test (or module, at import time) with `reason` unless `condition`;
    under DLRM_REQUIRE_ALL=1 (set by .ci/run) fail instead, so that a green CI run has
    exercised the distributed, Spark and CUDA-op layers."""
    if condition:
        return
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{REQUIRE_ALL}=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def random_arrays(spec, rows: int, seed: int = 0) -> dict:
    """Random (numerical, [categorical...], label) arrays of one mapping fitting `spec`,
    with each categorical feature's extreme ids 0 and cardinality-1 present."""
    rng = np.random.default_rng(seed)
    numerical = rng.standard_normal((rows, len(spec.numerical_features)))
    if spec.numerical_features:
        numerical = numerical.astype(spec.dtype(spec.numerical_features[0]))
    categorical = []
    for name, card in zip(spec.categorical_features, spec.cardinalities):
        ids = rng.integers(0, card, rows, dtype=np.int64)
        ids[:2] = [0, card - 1][:rows]
        categorical.append(ids.astype(spec.dtype(name)))
    label = (rng.random(rows) < 0.4).astype(spec.dtype(spec.label_feature))
    return {"numerical": numerical, "categorical": categorical, "label": label}


@pytest.fixture
def write_dataset(tmp_path):
    """write_dataset(spec, rows={'train': n, 'test': m}, name='data', seed=0)
    -> (FeatureSpec loaded from disk, {mapping: arrays})."""
    from core.sources import load_spec
    from dlrm_contract import DLRM_CONTRACT
    from datasets import SplitBinaryWriter

    def write(spec, rows, name="data", seed=0, pieces=3):
        out, arrays = tmp_path / name, {}
        with SplitBinaryWriter(str(out), spec) as writer:
            for k, (mapping, n) in enumerate(rows.items()):
                a = arrays[mapping] = random_arrays(spec, n, seed + k)
                bounds = [n * i // pieces for i in range(pieces + 1)]  # several write() calls
                for lo, hi in zip(bounds[:-1], bounds[1:]):
                    writer.write(mapping, a["numerical"][lo:hi],
                                 [c[lo:hi] for c in a["categorical"]], a["label"][lo:hi])
        return load_spec(str(out), DLRM_CONTRACT), arrays

    return write



# files that share a session fixture (spark_runs) run in the same test process under
# `make test`'s --dist loadfile, so that the fixture is made once, not once per process
SAME_PROCESS_AS = {"tests/test_preproc_cluster.py": "tests/test_preproc.py"}


def scope_of(nodeid: str) -> str:
    """The test file a test runs with (its own, or the one it shares a fixture with)."""
    path = nodeid.split("::")[0]
    return SAME_PROCESS_AS.get(path, path)


# seconds each test file took in a whole run (tools/file_seconds.py writes it): the
# longest files start first, so that no long file is left to run alone at the end
FILE_SECONDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_seconds.json")
NEW_FILE_SECONDS = 60.0  # a file not in FILE_SECONDS yet: early, among the long ones


def file_seconds() -> dict:
    try:
        with open(FILE_SECONDS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config, items):
    """Longest file first (the files' own order of tests kept)."""
    seconds = file_seconds()
    if not seconds:
        return
    scope_seconds = {}
    for path in {item.nodeid.split("::")[0] for item in items}:
        scope_seconds[scope_of(path)] = (scope_seconds.get(scope_of(path), 0.0)
                                         + seconds.get(path, NEW_FILE_SECONDS))
    items.sort(key=lambda item: (-scope_seconds[scope_of(item.nodeid)], scope_of(item.nodeid)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling
    config.option.loadscopereorder = False  # keep the collection's longest-first order

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return scope_of(super()._split_scope(nodeid))
    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def spark_runs(tmp_path_factory):
    """preproc/prepare_dataset.sh's Spark runs on the real Criteo rows (test_preproc.py), made
    once a session: test_preproc_cluster.py compares a cluster's output with the local one."""
    from test_preproc import spark_preproc_runs
    return spark_preproc_runs(str(tmp_path_factory.mktemp("preproc")))


def drop_cli_flags(module_name: str) -> None:
    """Forget the absl flags (and the import) of a CLI module: each CLI defines its flags
    once on absl's global registry (one CLI per process in real use), so a test session that
    runs another absl CLI in-process afterwards (DLRM's main, then sim.main) must drop them."""
    from absl import flags
    for name in list(flags.FLAGS):
        if flags.FLAGS.find_module_defining_flag(name) == module_name:
            delattr(flags.FLAGS, name)
    sys.modules.pop(module_name, None)
    package, _, name = module_name.rpartition(".")
    if package in sys.modules:  # else `from sim import main` gets the forgotten module back
        vars(sys.modules[package]).pop(name, None)


def kill_tree(proc) -> None:
    """SIGKILL to a process started with start_new_session and everything below it:
    horovodrun runs each rank in a session of its own, out of reach of its group's signal."""
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    for p in below:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def rank_process(log_path, rank, wait_s=30):
    """The python process of one rank, found among all processes by the log path on its
    command line (unique to the test): horovodrun's launcher may re-parent its ranks, so
    they need not be descendants of the horovodrun process."""
    deadline = time.time() + wait_s
    while time.time() < deadline:
        for p in psutil.process_iter():
            try:
                cmdline = " ".join(p.cmdline())
                if ("main.py" in cmdline and log_path in cmdline
                        and p.environ().get("HOROVOD_RANK") == rank):
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(0.5)
    pytest.fail(f"no process of rank {rank} with {log_path} on its command line",
                pytrace=False)


def bounded_run(cmd, timeout, env=None, cwd=ROOT):
    """subprocess.run under a deadline: a hang kills the command and every process below it
    (horovodrun and its ranks) and fails the test saying so."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **(env or {}))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"did not finish within {timeout} s (hung?): {' '.join(cmd)}\n"
                    f"{out[-2000:]}\n{err[-2000:]}", pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def fill(directory, leave: int) -> None:
    """Fill the filesystem of directory but `leave` bytes."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(directory / "filler", os.path.getsize(directory / "filler") - leave)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs (mounting needs root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
