"""Processes that die with the job: nothing unitrain starts outlives the command that started it.

The framework launcher runs in a session of its own (so that the main process can end its whole
tree), which also means no terminal hang-up or scheduler signal reaches it. Two lines of defence
keep it and its workers from running on, reparented to init, when the main process goes:

* Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel kills a child the moment
  its parent thread exits, whatever ended the parent, SIGKILL included;
* a watchdog thread in each worker that polls the main process (pid plus start time, so that a
  reused pid does not count) and ends the worker when it is gone, for the grandchildren that a
  launcher starts, whose parent is the launcher and not the main process.

Every command ends through :func:`run_command` (a worker, ``sys.exit(main())``) as Python ends a
program: ``sys.exit`` with its status, then the interpreter's own exit (threads, ``atexit``,
finalizers, module teardown, C and C++ libraries' exit work), which finishes what a user's code
left open. No fast ``os._exit``: it lost exactly that (gzip and zip files without their ends,
cProfile's output, temporary files).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import signal
import sys
import threading
import time
from typing import Callable, NoReturn, Optional

from unitrain.host.console import quiet_when_unread, unread

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


def running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (another user's too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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


def run_command(main: Callable[[], object], stop_when_unread: bool = False) -> NoReturn:
    """Run a command's ``main`` and end the process as Python ends it, with its exit status (what
    it returned, or the ``SystemExit`` it raised; an exception, with its traceback).

    Its console is quiet once nobody reads it (``| head``): a job runs on to its own outcome
    and status, its output dropped; with ``stop_when_unread`` (a command whose output is its only
    product) the command stops there, with status 0, as a reader that has had enough is no error.
    """
    quiet_when_unread(stop=stop_when_unread)
    try:
        status = main()
    except BrokenPipeError:
        if not (stop_when_unread and unread(sys.stdout)):
            raise
        status = 0
    sys.exit(status)


#: Whether this process has imported a user's code (a model factory's module, a converted copy).
_user_code = False


def user_code_loaded() -> None:
    """Called before a user's module is imported: from then on every object is collected as
    Python collects it (see keep_out_of_collection)."""
    global _user_code
    _user_code = True


def keep_out_of_collection() -> None:
    """Take the objects made so far out of the cyclic collector's scans (gc.freeze): called once
    a framework is imported, so that each full collection, and the interpreter's at exit (three
    quarters of torch's teardown, about 0.7 CPU s of every process measured), no longer walks
    its objects (torch's are about 200,000). Not once a user's code is loaded: an object of
    theirs in a reference cycle (a module's globals are one) would then never be collected, and
    a file it holds never closed. What is made later is collected as ever, and the exit still
    runs every atexit hook and finalizer and tears the modules down."""
    if not _user_code:
        gc.freeze()
