"""The commands a benchmark starts, each in a process group of its own, and how they are ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List


class Processes:
    """Every command still running, so that an interrupted benchmark leaves none behind."""

    def __init__(self) -> None:
        self.live: Dict[int, subprocess.Popen] = {}

    def spawn(self, cmd: List[str], **kw) -> subprocess.Popen:
        """Start a command in a process group of its own (its launcher's workers with it), which
        stop() ends as a whole; Ctrl-C at the terminal then reaches only this harness."""
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
        )
        self.live[proc.pid] = proc
        return proc

    def finish(self, proc: subprocess.Popen, what: str) -> str:
        """Wait for a command; its stdout, or RuntimeError with the end of its stderr."""
        out, err = proc.communicate()
        self.live.pop(proc.pid, None)
        if proc.returncode != 0:
            last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "no error output")
            raise RuntimeError(f"{what} failed (exit status {proc.returncode}): {last}\n{err[-3000:]}")
        return out

    def run(self, cmd: List[str], what: str, **kw) -> str:
        return self.finish(self.spawn(cmd, **kw), what)

    def stop(self, grace_s: float = 10.0) -> None:
        """End every command still running: SIGTERM to its group (unitrain then stops its own
        workers and says so), SIGKILL to what is left after ``grace_s``."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            self._signal_all(sig, wait_s)
            if not self.live:
                return

    def _signal_all(self, sig: signal.Signals, wait_s: float) -> None:
        for proc in self.live.values():
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        for proc in list(self.live.values()):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
        # A launcher's workers can outlive it in its group: the group, not the leader, decides.
        self.live = {pid: p for pid, p in self.live.items() if group_alive(pid)}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Stopped(Exception):
    """SIGTERM or SIGHUP: ends the benchmark the way Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def stop_on_termination() -> None:
    """SIGTERM and SIGHUP raise Stopped, so that ``with Bench(...)`` ends the commands it started
    (their own process groups do not hear the signal that ends this script)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stopped)


def ignore_interrupts() -> None:
    """A second Ctrl-C must not cut the clean-up short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
