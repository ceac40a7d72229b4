"""The processes of a launched job: their status files, their logs, and ending every one of them.

Each worker records its pid and its end in ``<run_dir>/.workers/rank<r>.json``; the main process
reads them to find the workers still running (reparented to init if the launcher is gone) and to
name the one that failed. Nothing is signalled by pid alone: a pid is signalled only while its
start time is the one seen, never a reused one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from unitrain.host import processes

STOP_GRACE_S = 5.0


# How often the main process looks at the launcher and its workers.
DEATH_POLL_S = 0.2


def dies_with_this_process():
    """A ``preexec_fn``: the child gets SIGKILL when this process ends, however it ends. (The
    kernel sends it when the *thread* that started the child ends: start it from one that
    lives as long as the job, as the main thread does here.)"""
    parent = os.getpid()

    def preexec() -> None:
        processes.die_with_parent()
        # This process may have died between fork and prctl: then no signal would ever come.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class LogFollower:
    """Echo the lines a worker appends to its log, as ``tail -f`` would, but only unitrain's own:
    the frameworks' start-up output (topology tables, flag dumps, warnings) stays in the file.

    A unitrain record starts with ``[<time>][unitrain]`` (or ``unitrain:``) and may go on over
    lines of its own (tables); a line that starts any other record ends it."""

    OWN = re.compile(r"^(\[[0-9-]+ [0-9:,]+\]\[unitrain\]|unitrain(\.\w+)?: )")
    # torchrun prefixes a failed worker's traceback with "[rank<r>]:".
    FOREIGN = re.compile(
        r"^(\[?\d{4}-\d\d-\d\d[ ,]|[IWEF]\d{4} |\S+\.py:\d+: \w*Warning|LAUNCH|Traceback|\*\*\*|\[rank\d+\]:)"
    )

    def __init__(self, path: Path, prefix: str):
        self.path, self.prefix, self.offset, self.partial = path, prefix, 0, ""
        self.echoing = False

    def pump(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.offset)
            text = self.partial + f.read()
            self.offset = f.tell()
        *lines, self.partial = text.split("\n")
        for line in lines:
            if self.OWN.match(line):
                self.echoing = True
            elif self.FOREIGN.match(line):
                self.echoing = False
            if self.echoing:
                print(f"{self.prefix}{line}", flush=True)


def worker_statuses(run_dir: Path) -> List[Dict[str, Any]]:
    folder = run_dir / ".workers"
    return (
        sorted((json.loads(f.read_text()) for f in folder.glob("rank*.json")), key=lambda s: s["rank"])
        if folder.exists()
        else []
    )


def main_process_args() -> List[str]:
    """Who the workers watch: this process, by pid and start time (a pid can be reused)."""
    return ["--main-pid", str(os.getpid()), "--main-start", processes.start_time(os.getpid()) or ""]


def _children(pid: int) -> List[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # it ended meanwhile (a glob there raises then)
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return found


def _job_processes(proc: subprocess.Popen, run_dir: Path) -> Dict[int, str]:
    """pid -> start time of every process of the job still there: the launcher's descendants
    (both launchers start each worker in a session of its own, out of reach of killpg) and the
    workers still marked running (reparented to init if the launcher is gone already)."""
    found: Dict[int, Optional[str]] = {}
    for s in worker_statuses(run_dir):
        start = processes.start_time(s["pid"])
        if s["status"] == "running" and start is not None and s.get("start", start) == start:
            found[s["pid"]] = start
    # The workers' own children too: a process a worker forked (Paddle's parameter server 0
    # forks its gloo key-value server) inherits neither its parent-death signal nor its watchdog.
    todo = [proc.pid, *found]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found[child] = processes.start_time(child)
                todo.append(child)
    return {pid: start for pid, start in found.items() if start is not None}


def _still_there(pids: Dict[int, str]) -> Dict[int, str]:
    return {pid: start for pid, start in pids.items() if processes.start_time(pid) == start and not zombie(pid)}


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def exited(proc: subprocess.Popen) -> bool:
    """Whether the launcher has exited, without reaping it: while it is a zombie its pid, which
    is also its process group's id, cannot be given to another process."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop_everything(proc: subprocess.Popen, run_dir: Path) -> None:
    """End the launcher's process group, its descendants and every worker still marked running,
    then reap the launcher: no orphans. A pid is signalled only while its start time is the one
    seen, never a reused one."""
    pids: Dict[int, str] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # Looked up again before SIGKILL (a worker may have started meanwhile), keeping those seen
        # before: SIGTERM may already have ended the launcher and orphaned them.
        pids = _still_there({**pids, **_job_processes(proc, run_dir)})
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (not exited(proc) or _still_there(pids)):
            time.sleep(0.05)
        if exited(proc) and not _still_there(pids):
            break
    proc.wait()
