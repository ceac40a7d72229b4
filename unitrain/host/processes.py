"""Processes that die with the job: nothing unitrain starts outlives the command that started it.

The framework launcher runs in a session of its own (so that the main process can end its whole
tree), which also means no terminal hang-up or scheduler signal reaches it. Two lines of defence
keep it and its workers from running on, reparented to init, when the main process goes:

* Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel kills a child the moment
  its parent thread exits, whatever ended the parent, SIGKILL included;
* a watchdog thread in each worker that polls the main process (pid plus start time, so that a
  reused pid does not count) and ends the worker when it is gone, for the grandchildren that a
  launcher starts, whose parent is the launcher and not the main process.
"""

from __future__ import annotations

import ctypes
import functools
import signal
import threading
import time
from typing import Callable, Optional

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


@functools.cache
def _prctl() -> Optional[Callable[..., int]]:
    # Looked up once, in the parent: between fork and exec a child must not dlopen (another
    # thread may have held the loader's lock at the fork).
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux only; a no-op
    elsewhere). Usable as a subprocess ``preexec_fn``."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


_prctl()


def watch(pid: int, expected_start: Optional[str], on_gone) -> threading.Thread:
    """Call ``on_gone()`` from a daemon thread once process ``pid`` (started at
    ``expected_start``) no longer exists."""

    def loop() -> None:
        while start_time(pid) == expected_start:
            time.sleep(POLL_S)
        on_gone()

    thread = threading.Thread(target=loop, name="unitrain-lifeline", daemon=True)
    thread.start()
    return thread
