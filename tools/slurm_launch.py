"""Horovod ranks over Gloo under Slurm without MPI (slurm_multinode.sh without a container).

`launch` runs in the batch step (on the allocation's first node): it starts Horovod's own
rendezvous HTTP server (the one horovodrun starts), then `srun`s one `task` per Slurm task.
`task` turns the task's Slurm variables into the HOROVOD_* rendezvous variables and execs the
training command. srun starts the processes (no ssh between nodes, Slurm accounts and
signals them); ranks are Slurm's task ids.

    python tools/slurm_launch.py launch -- "python main.py ..."   # srun_flags from the env
"""
import os
import re
import shlex
import socket
import subprocess
import sys

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer

HOSTS_VARIABLE = "SLURM_LAUNCH_HOSTS"  # node:tasks,... from launch to every task


class LaunchError(Exception):
    pass


def slurm_variable(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise LaunchError(f"{name} is unset: run this inside a Slurm job (sbatch "
                          "slurm_multinode.sh)")
    return value


def tasks_per_node(compressed: str) -> list:
    """Slurm's SLURM_TASKS_PER_NODE, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in compressed.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not match:
            raise LaunchError(f"SLURM_TASKS_PER_NODE={compressed!r}: expected e.g. '2(x3),1'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def allocation_hosts() -> str:
    """The job's nodes with their task counts in Horovod's host syntax ('n1:2,n2:1')."""
    nodes = subprocess.run(["scontrol", "show", "hostnames", slurm_variable("SLURM_JOB_NODELIST")],
                           check=True, capture_output=True, text=True).stdout.split()
    counts = tasks_per_node(slurm_variable("SLURM_TASKS_PER_NODE"))
    if len(nodes) != len(counts):
        raise LaunchError(f"SLURM_JOB_NODELIST names {len(nodes)} nodes but "
                          f"SLURM_TASKS_PER_NODE counts tasks on {len(counts)}")
    return ",".join(f"{node}:{count}" for node, count in zip(nodes, counts))


def rendezvous_address(hosts: str) -> str:
    """An address of this node that the other nodes reach: Slurm's NodeAddr of this node
    (slurmctld reaches slurmd there); loopback when the job has one node."""
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    if "," not in hosts:
        return "127.0.0.1"
    node = slurm_variable("SLURMD_NODENAME")
    info = subprocess.run(["scontrol", "show", "node", "-o", node], check=True,
                          capture_output=True, text=True).stdout
    match = re.search(r"\bNodeAddr=(\S+)", info)
    if not match:
        raise LaunchError(f"scontrol shows no NodeAddr for node {node}: set "
                          "HOROVOD_GLOO_RENDEZVOUS_ADDR to an address of it the other nodes reach")
    return socket.gethostbyname(match.group(1))


def launch(command: str) -> int:
    hosts = allocation_hosts()
    plan = get_host_assignments(parse_hosts(hosts), 1)
    server = RendezvousServer()
    port = server.start()
    server.init(plan)  # scope sizes: the server clears a scope once all its ranks are done
    env = dict(os.environ, HOROVOD_GLOO_RENDEZVOUS_ADDR=rendezvous_address(hosts),
               HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
               HOROVOD_CPU_OPERATIONS="gloo", **{HOSTS_VARIABLE: hosts})
    # --mpi=none: Gloo needs no PMI, and a cluster's MpiDefault must not start one;
    # --kill-on-bad-exit: a failed rank ends the others (they would wait in collectives)
    srun = ["srun", "--mpi=none", "--kill-on-bad-exit=1", *shlex.split(os.environ.get("srun_flags", "")),
            sys.executable, os.path.abspath(__file__), "task", "--", command]
    try:
        return subprocess.run(srun, env=env).returncode
    finally:
        server.stop()


def interface_towards(address: str) -> str:
    """The name of the network interface this node uses to reach `address` (Gloo's device)."""
    import psutil
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # UDP connect sends nothing; it only picks the route
        local = probe.getsockname()[0]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return name
    raise LaunchError(f"no network interface holds {local} (the route to {address}): set "
                      "HOROVOD_GLOO_IFACE")


def rank_variables() -> dict:
    """HOROVOD_* of this Slurm task: rank and size are Slurm's, local and cross ranks those
    Horovod's host assignment gives this node's slot (as horovodrun would)."""
    node, local_rank = slurm_variable("SLURMD_NODENAME"), int(slurm_variable("SLURM_LOCALID"))
    plan = get_host_assignments(parse_hosts(slurm_variable(HOSTS_VARIABLE)), 1)
    size = int(slurm_variable("SLURM_NTASKS"))
    if size != len(plan):
        raise LaunchError(f"the job step has {size} tasks but the allocation "
                          f"{os.environ[HOSTS_VARIABLE]} has {len(plan)}: srun_flags must not "
                          "change the number of tasks")
    slot = next((s for s in plan if s.hostname == node and s.local_rank == local_rank), None)
    if slot is None:
        raise LaunchError(f"task {local_rank} on node {node} is outside the allocation "
                          f"{os.environ[HOSTS_VARIABLE]}")
    return {"HOROVOD_HOSTNAME": node, "HOROVOD_RANK": slurm_variable("SLURM_PROCID"),
            "HOROVOD_SIZE": str(size), "HOROVOD_LOCAL_RANK": str(local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size), "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_IFACE": os.environ.get("HOROVOD_GLOO_IFACE") or interface_towards(
                slurm_variable("HOROVOD_GLOO_RENDEZVOUS_ADDR"))}


def task(command: str) -> None:
    os.environ.update(rank_variables())
    os.execvp("bash", ["bash", "-c", command])


def main(argv) -> int:
    if len(argv) != 3 or argv[0] not in ("launch", "task") or argv[1] != "--":
        print(f"usage: {os.path.basename(__file__)} launch|task -- COMMAND", file=sys.stderr)
        return 2
    try:
        if argv[0] == "launch":
            return launch(argv[2])
        task(argv[2])
    except (LaunchError, subprocess.CalledProcessError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
