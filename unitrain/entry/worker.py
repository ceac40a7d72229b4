"""One worker, started by paddle.distributed.launch or torchrun (or directly, for a sweep job).

The main process hands over the resolved config as a file; the worker records its pid and
its end (done, failed with a message, or terminated by the launcher) in
``<run_dir>/.workers/rank<r>.json`` so that the main process can name the rank that failed.
The first status is written before anything of unitrain is imported, so that even a worker that
fails to start is accounted for.

A worker runs a user's code, so it ends as Python ends a program, SIGTERM too (raised as
:class:`Terminated` in the main thread). The one ``os._exit`` (``_end_from_a_thread``) is a last
resort for a main thread stuck in a framework's C++ call, which never returns to Python.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

Status = Callable[..., None]


def _start_time(pid: int) -> str | None:
    # As unitrain.host.processes.start_time; repeated here because the status is written before
    # anything of unitrain is imported (see main).
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _status(run_dir: Path, rank: int, local_rank: int, **fields: Any) -> None:
    folder = run_dir / ".workers"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".rank{rank}.json.tmp"
    # pid and start time: the main process signals this pid only while it is still this process.
    record = {
        "rank": rank,
        "local_rank": local_rank,
        "pid": os.getpid(),
        "start": _start_time(os.getpid()),
        "time": time.time(),
        **fields,
    }
    tmp.write_text(json.dumps(record))
    tmp.replace(folder / f"rank{rank}.json")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="the resolved config (YAML) the main process wrote")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--rank-env", required=True, help="the variable the launcher sets to this worker's global rank")
    parser.add_argument(
        "--local-rank-env", required=True, help="the variable the launcher sets to its rank on this node"
    )
    parser.add_argument(
        "--main-pid", type=int, help="the unitrain process this job belongs to: the worker ends when it is gone"
    )
    parser.add_argument(
        "--main-start", help="its start time (/proc/<pid>/stat field 22), so that a reused pid does not count"
    )
    parser.add_argument(
        "--workerlog", action="store_true", help="send this process's output to <run-dir>/workerlog.<local rank>"
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="this process's output is the user's terminal (a sweep's job): its records go to the run's log "
        "too, and detail (the step timer's table) only there",
    )
    parser.add_argument(
        "--ps",
        nargs=4,
        metavar=("BACKEND", "NODE", "SERVERS", "TRAINERS"),
        help="a parameter-server job: this process serves or trains on node NODE; servers and trainers per node, "
        "comma-separated",
    )
    return parser.parse_args(argv)


def _attempt(run_dir: Path, rank: int, job: str) -> int:
    """0, or how many times the launcher restarted this rank in this job (dist.max_restarts):
    its earlier status, written for the same main process, says how many times it ran."""
    try:
        previous = json.loads((run_dir / ".workers" / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return 0
    return previous.get("attempt", 0) + 1 if previous.get("job") == job else 0


def _identity(args: argparse.Namespace) -> tuple[Optional[Any], Status, str, int]:
    """This worker's role (parameter server jobs), its status writer, its log file's name and
    its attempt (0 unless the launcher restarted it)."""
    rank, local_rank = int(os.environ.get(args.rank_env, "0")), int(os.environ.get(args.local_rank_env, "0"))
    # Numbered by rank on this node, as paddle.distributed.launch numbers its logs.
    log_name, role = f"workerlog.{local_rank}", None
    if args.ps:
        from unitrain.interface.ps import PsLayout
        from unitrain.ps.job import role_from_env

        backend, node, servers, trainers = args.ps
        role = role_from_env(backend, os.environ, PsLayout.parse(servers, trainers), int(node))
        rank = local_rank = role.rank
        log_name = role.log_file
    named = {"name": role.name, "log": role.log_file} if role else {}
    job = f"{args.main_pid}:{args.main_start}"
    attempt = _attempt(Path(args.run_dir), rank, job)
    status = functools.partial(_status, Path(args.run_dir), rank, local_rank, job=job, attempt=attempt, **named)
    return role, status, log_name, attempt


def _log_to(run_dir: Path, log_name: Optional[str], console: bool) -> None:
    """unitrain's records at INFO, into ``log_name`` in the run directory when given; on the
    user's ``console``, also into the run's log as a one-process run's are."""
    if log_name:
        log_file = open(run_dir / log_name, "a", buffering=1)
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
    form = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    if console:
        from unitrain.host.console import quiet_when_unread

        quiet_when_unread()  # a sweep's job writes to the user's console, which `| head` may close
    logging.basicConfig(level=logging.INFO, format=form, stream=sys.stdout, force=True)
    if console:
        from unitrain.host.console import RUN_LOG

        handler = logging.FileHandler(run_dir / RUN_LOG)
        handler.setFormatter(logging.Formatter(form))
        logging.getLogger().addHandler(handler)
    # unitrain's own level: importing paddle 3.0.0 lowers the root logger to WARNING.
    logging.getLogger("unitrain").setLevel(logging.INFO)


def _tie_to_main_process(args: argparse.Namespace, parent: int, status: Status) -> None:
    """The kernel ends this worker with its parent (the launcher, or the main process), and the
    watchdog with the main process, however either ends."""
    from unitrain.host import processes

    processes.die_with_parent()
    if not args.main_pid:
        return

    def on_main_gone() -> None:
        status(status="terminated", error="the unitrain main process ended")
        _end_from_a_thread(128 + signal.SIGKILL)

    # The start time the main process read of itself; read here only if it did not pass it
    # (then a pid reused before this line would pass for the main process).
    main_started = args.main_start or processes.start_time(args.main_pid)
    # The parent may have ended before prctl took effect: then no signal will ever come.
    if os.getppid() != parent or main_started is None or processes.start_time(args.main_pid) != main_started:
        on_main_gone()
    processes.watch(args.main_pid, main_started, on_main_gone)


def _run(args: argparse.Namespace, role: Optional[Any], on_sigterm: Callable, attempt: int, status: Status) -> None:
    from omegaconf import OmegaConf

    from unitrain.config.schema import UnitrainConfig
    from unitrain.host.threads import export_threads
    from unitrain.interface.backend import get_backend
    from unitrain.ps.job import run_process
    from unitrain.train.trainer import train

    cfg = OmegaConf.merge(OmegaConf.structured(UnitrainConfig), OmegaConf.load(args.config))
    # Resolved by the main process to this process's share of the node's cores.
    export_threads(cfg.trainer.threads)
    get_backend(cfg.backend.name)
    # Importing paddle installs its own C++ SIGTERM handler, which dumps a stack and never
    # records that the launcher stopped this rank: take the signal back.
    signal.signal(signal.SIGTERM, on_sigterm)
    if role:
        # Connected: its engine reached the job's other processes (the main process's clock on
        # nodes that have not joined stops when all of this node's are).
        run_process(cfg, Path(args.run_dir), role, on_connected=lambda: status(status="running", connected=True))
        return
    if attempt:
        from unitrain.train.restarts import resume_after_restart

        resume_after_restart(cfg, Path(args.run_dir), int(os.environ.get(args.rank_env, "0")), attempt)
    train(cfg, Path(args.run_dir))


def _forked_helper() -> None:
    """In a process a framework forks from this worker (Paddle's gloo key-value store and its
    multiprocessing Manager): it is not the worker, so it must not report as one, and it ends
    with it (the parent-death signal is not inherited; such helpers outlived killed workers)."""
    from unitrain.host import processes

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    processes.die_with_parent()


class Terminated(SystemExit):
    """SIGTERM (from the launcher, or the main process gone): the worker unwinds and ends as
    Python ends a program, a user's files and atexit hooks included, with this status."""


#: Seconds a worker asked to end from its watchdog thread has to unwind before that thread ends it.
UNWIND_S = 10.0


def _end_from_a_thread(code: int) -> None:
    """End this worker from a thread other than the main one: SIGTERM to itself, which its main
    thread turns into :class:`Terminated` (so Python's exit runs). The one ``os._exit`` left: a
    main thread stuck in a framework's C++ call (a collective waiting for a peer that is gone)
    never returns to Python to see the signal, and a worker must not live on orphaned; after
    UNWIND_S it ends without its own teardown."""
    _pending_code[0] = code
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(UNWIND_S)
    os._exit(code)


#: The status the next SIGTERM ends the worker with (128 + SIGTERM unless a watchdog set it).
_pending_code = [0]


def main(argv: list[str] | None = None) -> int:
    parent = os.getppid()
    args = _arguments(argv)
    role, status, log_name, attempt = _identity(args)
    _log_to(Path(args.run_dir), log_name if args.workerlog else None, args.console)

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
        if not _pending_code[0]:
            status(status="terminated")
        raise Terminated(_pending_code[0] or 128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    status(status="running")
    _tie_to_main_process(args, parent, status)
    os.register_at_fork(after_in_child=_forked_helper)

    from unitrain.errors import NothingLeftToRun, Refusal, UnitrainError

    try:
        _run(args, role, on_sigterm, attempt, status)
    except NothingLeftToRun as err:
        print(f"unitrain: {err}", flush=True)
        status(status="done", nothing_left=str(err))
        return 0
    except UnitrainError as err:
        print(f"unitrain: error: {err}", file=sys.stderr, flush=True)
        code = getattr(err, "exit_code", 2)
        status(status="failed", error=str(err), user_error=True, refusal=isinstance(err, Refusal), exit_code=code)
        return code
    except Terminated:
        raise
    except KeyboardInterrupt:
        # Ctrl-C reaches the whole foreground process group, this process too when the main
        # process started it directly (sweeps, repeats): the main process says it in one line.
        status(status="terminated", error="interrupted (Ctrl-C)")
        return 128 + signal.SIGINT
    except BaseException as err:  # noqa: BLE001 - recorded for the main process, then re-raised
        status(status="failed", error=f"{type(err).__name__}: {err}".splitlines()[0])
        raise
    status(status="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
