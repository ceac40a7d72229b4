"""Which network interface a node of a multi-node job speaks on.

On one machine every address is loopback and nothing needs choosing. Between hosts, gloo (torch's
and Paddle's) binds to the address the host name resolves to, which on many machines is
127.0.0.1 or 127.0.1.1 (Debian's /etc/hosts), and its peers then try to reach that. So a
multi-node job names its interface: ``dist.interface`` when given, otherwise the one this host
reaches ``dist.master_addr`` through (as the routing table says; node 0 finds its own address).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Set

from unitrain.errors import ConfigError

SIOCGIFADDR = 0x8915  # <linux/sockios.h>


@dataclass(frozen=True, kw_only=True)
class NodeNetwork:
    interface: str
    address: str  # this node's IPv4 address on it


def addresses() -> Dict[str, str]:
    """Every interface of this host that has an IPv4 address: name -> address."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            out[name] = socket.inet_ntoa(reply[20:24])
    return out


def _route_to(host: str) -> Optional[str]:
    """The local address the kernel would send from to reach ``host`` (nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def node_network(interface: Optional[str], master_addr: str) -> NodeNetwork:
    """The interface a node speaks on: ``interface`` (dist.interface), or the route to the master."""
    found = addresses()
    if interface is not None:
        if interface not in found:
            listed = ", ".join(f"{n} ({a})" for n, a in sorted(found.items())) or "none"
            raise ConfigError("dist.interface", interface, f"an interface of this host with an IPv4 address: {listed}")
        return NodeNetwork(interface=interface, address=found[interface])
    local = _route_to(master_addr)
    names = [n for n, a in found.items() if a == local]
    if not names:
        raise ConfigError(
            "dist.master_addr",
            master_addr,
            "an address this host can reach (no interface routes to it; name one with dist.interface)",
        )
    return NodeNetwork(interface=names[0], address=local)


#: /proc/net/tcp's state of an established connection.
_ESTABLISHED = "01"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host order), as text; an
    IPv4-mapped IPv6 address as its IPv4 form."""
    raw = b"".join(struct.pack("<I", int(hex_address[i : i + 8], 16)) for i in range(0, len(hex_address), 8))
    if len(raw) == 4:
        return socket.inet_ntoa(raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntoa(raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def _own_addresses() -> Set[str]:
    own = set(addresses().values()) | {"127.0.0.1", "::1"}
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            own.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(line.split()[0])))
    except OSError:
        pass
    return own


def remote_peers(pids: Iterable[int]) -> Set[str]:
    """The addresses of other hosts that processes ``pids`` hold established TCP connections
    with (IPv4 and IPv6, read from /proc): whether a process was reached from another node."""
    own = _own_addresses()
    peers: Set[str] = set()
    for pid in pids:
        inodes = _socket_inodes(pid)
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for fields in map(str.split, lines):
                if fields[3] == _ESTABLISHED and fields[9] in inodes:
                    remote = _address(fields[2].split(":")[0])
                    if remote not in own and not remote.startswith("127."):
                        peers.add(remote)
    return peers
