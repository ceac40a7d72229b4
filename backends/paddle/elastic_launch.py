"""paddle.distributed.launch as unitrain runs it, for every Paddle job: run as
``python -m unitrain.backends.paddle.elastic_launch <the launcher's arguments>``. The launcher as it
ships, with two changes (Paddle only: torchrun writes no environment and has no such race).

**It writes no environment to disk.** Tokens live in the environment, and the launcher as it ships
writes the whole of it, inherited variables included, into its ``--log_dir``:

* ``envlog.<rank>``: every worker's environment, one ``KEY=value`` a line
  (``Controller.save_pod_env`` -> ``_save_container_env``, controllers/controller.py:311-341),
  before every deploy of the pod; nothing reads it. Here it is not written.
* ``backup_env.<rank>.json``: the same environment as JSON (``ProcessContext._start``,
  utils/process_context.py:46-65), just before it starts each worker, which gets its path as
  ``PADDLE_BACKUP_ENV_PATH``. Its only reader, ``paddle.distributed.backup_env.getenv_or_backup``,
  looks there for a variable missing from the worker's environment, and the launcher leaves out of
  it only the endpoint lists it set itself that are longer than ``PADDLE_ENV_LIMIT_LEN`` (48000).
  Here the file holds those variables alone, and is written only when one was left out (thousands
  of workers); the worker is started as before otherwise.
* ``<job id>.<pod name>.log`` (``default.<pod>.log``): ``str(os.environ)`` on its first line, then
  the job's endpoints (``Controller.save_pod_log``, controllers/controller.py:289-309; the
  collective, parameter-server and RPC controllers call it). Here it holds the endpoints alone.
* The launcher's own output (``launcher.log`` in the run) shows a failed worker's container, with
  its whole environment when ``FLAGS_print_launcher_env`` is set (``Container.__str__``,
  job/container.py:170-174). Here never with it.

**Its elastic mode restarts the pod, as it means to.** A pod whose worker fails deletes every pod's
heartbeat in etcd (``ETCDMaster.restart_peer``), so that all of them restart, and relies on its
own watch of the heartbeats to turn its status from FAILED to RESTARTING. Its controller then waits
for every pod's heartbeat (``wait_peer_ready``), a wait that ends at once while the status is
still FAILED (FAILED counts as done). When the failed worker's processes were already gone, the
controller got there before the watch's callback: it found its peers "not ready" at once and
ended the job (seen on one node, and in one of seven restarts over two nodes here). Here the pod
that deletes the heartbeats is RESTARTING at once.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess

from paddle.distributed.launch.controllers.controller import Controller
from paddle.distributed.launch.controllers.master import ETCDMaster
from paddle.distributed.launch.job.container import Container
from paddle.distributed.launch.utils import process_context
from paddle.distributed.launch.utils.process_context import ProcessContext

from unitrain.host.processes import run_command

__all__: list = []

_restart_peer = ETCDMaster.restart_peer


def _restart_peer_and_wait_for_them(self: ETCDMaster) -> None:
    _restart_peer(self)
    self.ctx.status.restart()


def _save_no_container_env(self: Controller, container: Container, is_init: bool = False) -> None:
    """envlog.<rank>: not written (it would hold the worker's whole environment; nothing reads it)."""


def _save_pod_log_without_the_environment(self: Controller, info: object) -> None:
    """The pod's log (``<job id>.<pod name>.log``): the job's endpoints, without the launcher's
    environment on its first line."""
    if not self.ctx.args.log_dir:
        return
    path = os.path.join(self.ctx.args.log_dir, f"{self.job.id}.{self.pod.name}.log")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a+") as log:
            log.write(f"{info}\n")
    except Exception as e:  # as the launcher's own: a log it cannot write does not end the job
        self.ctx.logger.error(f"save log failed because {e}")


def _start_writing_no_environment(self: ProcessContext) -> None:
    """ProcessContext._start as it ships, but backup_env.<rank>.json holds only the variables the
    launcher left out of the worker's environment (its own endpoint lists, when too long), and
    exists only when it left one out."""
    log_dir = self._env["PADDLE_LOG_DIR"]
    os.makedirs(log_dir, exist_ok=True)
    env = self._env
    rank = self._env.get("PADDLE_TRAINER_ID")
    if rank is not None:
        longest = int(os.getenv("PADDLE_ENV_LIMIT_LEN", 48000))
        left_out = {k: v for k, v in self._env.items() if k in process_context.LIMIT_LEN_ENVS and len(v) >= longest}
        if left_out:
            backup = os.path.join(log_dir, f"backup_env.{int(rank)}.json")
            with open(os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(left_out, f, indent=4, sort_keys=True)
            env = {k: v for k, v in self._env.items() if k not in left_out}
            env["PADDLE_BACKUP_ENV_PATH"] = backup
    self._proc = subprocess.Popen(
        self._cmd,
        env=env,
        stdout=self._stdout,
        stderr=self._stderr,
        preexec_fn=self._preexec_fn or (os.setsid if self._group else None),
        shell=self._shell,
    )


def _container_without_its_environment(self: Container) -> str:
    """What the launcher says of a container, never with its environment (FLAGS_print_launcher_env)."""
    said = f"Container rank {self.rank} status {self.status} cmd {self.entrypoint}"
    return f"{said} code {self.exit_code} log {self.errfile}"


def _replace(cls: type, name: str, fixed: object) -> None:
    # Where a method it replaces has moved (another Paddle), say so, rather than run the
    # launcher as it ships.
    if name not in vars(cls):
        raise RuntimeError(
            f"{cls.__module__}.{cls.__qualname__}.{name} is gone: unitrain's fix of the launcher no longer fits"
        )
    setattr(cls, name, fixed)


def _fix_the_launcher() -> None:
    _replace(ETCDMaster, "restart_peer", _restart_peer_and_wait_for_them)
    _replace(Controller, "_save_container_env", _save_no_container_env)
    _replace(Controller, "save_pod_log", _save_pod_log_without_the_environment)
    _replace(ProcessContext, "_start", _start_writing_no_environment)
    _replace(Container, "__str__", _container_without_its_environment)


def _launch() -> None:
    runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _fix_the_launcher()
    run_command(_launch)
