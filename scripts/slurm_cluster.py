"""A one-node SLURM cluster on this machine, for tests of sweeps sent to a scheduler.

    python scripts/slurm_cluster.py up --dir /tmp/slurm      # prints: export SLURM_CONF=...
    SLURM_CONF=/tmp/slurm/slurm.conf sinfo
    python scripts/slurm_cluster.py down --dir /tmp/slurm

Debian's slurm-wlm (slurmctld, slurmd) with munge for authentication, all state under ``--dir``:
slurm.conf names this host as the one compute node (its cores and memory), no accounting
database (``sacct`` then answers with an error, which submitit tolerates: it waits for a
job's result file). ``up`` waits until the node is idle; ``down`` cancels every job, stops the
daemons it started (their pid files) and leaves nothing running. Needs root and
``apt-get install slurm-wlm munge`` (``make slurm``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Sequence

#: Seconds ``up`` waits for the node to be idle.
READY_S = 60.0
MUNGE_SOCKET = "munge.socket"

CONF = """\
ClusterName=unitrain
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={dir}/{socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 512
    return 1024


def env(folder: Path) -> Dict[str, str]:
    """What SLURM's commands (sbatch, squeue, ...) need to talk to this cluster."""
    return {"SLURM_CONF": str(folder / "slurm.conf")}


def _write_conf(folder: Path) -> Path:
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text(
        CONF.format(
            host=socket.gethostname(),
            dir=folder,
            socket=MUNGE_SOCKET,
            ctld_port=6817,
            d_port=6818,
            cpus=os.cpu_count() or 1,
            memory=_memory_mb(),
        )
    )
    return conf


def _start_munge(folder: Path) -> None:
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True)
    subprocess.run(
        [
            "munged",
            "--force",
            f"--socket={folder / MUNGE_SOCKET}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        ],
        check=True,
    )


def _ready(conf: Path) -> bool:
    done = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env={**os.environ, **env(conf.parent)}
    )
    return done.returncode == 0 and done.stdout.strip() in ("idle", "mixed", "allocated")


def up(folder: Path) -> Path:
    folder = folder.resolve()
    down(folder)  # what an earlier run of the same folder left
    folder.mkdir(parents=True, exist_ok=True)
    conf = _write_conf(folder)
    try:
        _start_munge(folder)
        subprocess.run(["slurmctld", "-f", str(conf)], check=True)
        subprocess.run(["slurmd", "-f", str(conf)], check=True)
        deadline = time.monotonic() + READY_S
        while not _ready(conf):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the SLURM node did not become idle within {READY_S:g}s; see {folder}/*.log")
            time.sleep(0.5)
    except BaseException:
        down(folder)
        raise
    return conf


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def down(folder: Path) -> None:
    """Cancel every job, stop slurmd, slurmctld and munged (those this folder's pid files name)."""
    folder = folder.resolve()
    if (folder / "slurm.conf").exists() and (folder / "slurmctld.pid").exists():
        subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, env={**os.environ, **env(folder)})
    for daemon in ("slurmd", "slurmctld", "munged"):
        _stop(folder / f"{daemon}.pid")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/slurm_cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["up", "down"])
    parser.add_argument("--dir", required=True, type=Path, help="where the cluster keeps its config, state and logs")
    args = parser.parse_args(argv)
    if args.what == "up":
        conf = up(args.dir)
        print(f"export SLURM_CONF={conf}")
    else:
        down(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
