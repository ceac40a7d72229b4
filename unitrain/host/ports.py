"""TCP ports on this machine, for the rendezvous of a job's processes."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Optional, Tuple

#: Where Linux keeps the range it takes a port from for every outgoing connection.
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default, where that file cannot be read.
EPHEMERAL_DEFAULT = (32768, 60999)
#: Below this, the ports that services usually listen on.
LOWEST = 10000
#: A quiet range narrower than this is no better than asking the kernel.
NARROWEST = 1000

# Its own generator: a job that seeds Python's `random` would otherwise hand the same ports to
# every job started alike.
_draw = random.SystemRandom()


def ephemeral_range() -> Tuple[int, int]:
    try:
        low, high = (int(word) for word in EPHEMERAL_FILE.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def quiet_range() -> Optional[Tuple[int, int]]:
    """The widest run of ports that the kernel never hands out by itself, or None if too narrow.

    A port found free in the ephemeral range may be taken by any process's next outgoing
    connection before the job's server binds it (a parameter server then never listens, the
    others wait for it until they give up); one from this range stays free until somebody binds
    it on purpose."""
    low, high = ephemeral_range()
    widest = max((LOWEST, low - 1), (high + 1, 65535), key=lambda r: r[1] - r[0])
    return widest if widest[1] - widest[0] >= NARROWEST else None


def free_port() -> int:
    """A port that nothing listens on now, outside the ephemeral range where there is room."""
    quiet = quiet_range()
    if quiet:
        for _ in range(100):
            port = _draw.randint(*quiet)
            if port_in_use(port) is None:
                return port
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
