"""Processes that die with the job: nothing unitrain starts outlives the command that started it.

The framework launcher runs in a session of its own (so that the main process can end its whole
tree), which also means no terminal hang-up or scheduler signal reaches it. Two lines of defence
keep it and its workers from running on, reparented to init, when the main process goes:

* Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel kills a child the moment
  its parent thread exits, whatever ended the parent, SIGKILL included;
* a watchdog thread in each worker that polls the main process (pid plus start time, so that a
  reused pid does not count) and ends the worker when it is gone, for the grandchildren that a
  launcher starts, whose parent is the launcher and not the main process.

Every command and worker also ends here (``run_command``), without the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import io
import os
import signal
import sys
import threading
import time
from typing import Callable, NoReturn, Optional

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


def run_command(main: Callable[[], object]) -> NoReturn:
    """Run a command's ``main`` and end the process with its exit status (what it returned, or
    the status of the ``SystemExit`` it raised), as :func:`end_process` ends it. An exception
    other than ``SystemExit`` ends the process as Python does, with its traceback."""
    try:
        status = main()
    except SystemExit as done:
        status = done.code
    end_process(status)


def end_process(status: object) -> NoReturn:
    """End this process with ``status`` (None is 0, a message is printed and is 1, as
    ``sys.exit`` takes them), once everything a normal exit finishes has finished: the threads
    that are not daemons, the ``atexit`` callbacks (logging's flush and close, temporary
    directories, multiprocessing's children, MLflow's queue), and every buffered write, Python's
    and C's. What it skips is the interpreter's teardown, object by object, of torch's or Paddle's
    modules and their C++ destructors: about a second of CPU in a process that trained, spent on
    memory the kernel frees at once."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    # As the interpreter's own exit begins: threading's exit hooks (they stop the workers of
    # concurrent.futures' pools, which are not daemons), then the join of every such thread.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    _flush_everything()
    os._exit(code & 0xFF)


#: The file objects that hold written data back (the raw FileIO writes at once).
_BUFFERED = (io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)


def _flush_everything() -> None:
    """Every buffered write out: files still open keep theirs until the teardown would free them."""
    found = gc.get_objects()
    # By type: isinstance would read each object's ``__class__``, which some answer with a warning.
    files = {kind for kind in set(map(type, found)) if issubclass(kind, _BUFFERED)}
    for obj in (obj for obj in found if type(obj) in files):
        try:
            if not obj.closed:
                obj.flush()
        except (OSError, ValueError):
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)  # C's stdio buffers (frameworks' C++ output), which exit() flushes
