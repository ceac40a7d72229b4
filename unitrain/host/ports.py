"""TCP ports on this machine, for the rendezvous of a job's processes."""

from __future__ import annotations

import socket
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> Optional[str]:
    """Why ``port`` cannot be listened on, or None. Binds as the rendezvous stores do (every
    address, SO_REUSEADDR), so that a port another address holds counts and one in TIME_WAIT does not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as err:
            return err.strerror or str(err)
    return None
