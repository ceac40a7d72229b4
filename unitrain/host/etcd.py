"""An etcd server for one job (Debian's etcd-server): the key-value store whose leases
paddle.distributed.launch's elastic mode keeps its pods' state in (its --master etcd://...)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from unitrain.errors import UnitrainError
from unitrain.host import processes
from unitrain.host.ports import free_port

#: Seconds etcd may take to answer on its client port.
READY_S = 30.0


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def etcd_server(log_file: Path) -> Iterator[str]:
    """A fresh etcd on free local ports, its output in ``log_file``; yields its client endpoint
    (host:port) and stops it, however the block ends (it also dies with this process). Its data
    (a 64 MB write-ahead log however little is kept) lives in a temporary directory, removed after."""
    binary = shutil.which("etcd")
    if binary is None:
        raise UnitrainError(
            "no etcd on this machine: paddle.distributed.launch restarts workers only with an etcd server "
            "(`make elastic` installs Debian's etcd-server)"
        )
    with tempfile.TemporaryDirectory(prefix="unitrain-etcd-") as data_dir:
        with _running(binary, Path(data_dir), log_file) as endpoint:
            yield endpoint


@contextmanager
def _running(binary: str, data_dir: Path, log_file: Path) -> Iterator[str]:
    client, peer = free_port(), free_port()
    command = [
        binary,
        "--name=unitrain",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=unitrain=http://127.0.0.1:{peer}",
    ]
    with open(log_file, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=processes.die_with_parent)
    try:
        deadline = time.monotonic() + READY_S
        while not _listening(client):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise UnitrainError(f"etcd did not start (see {log_file})")
            time.sleep(0.1)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
