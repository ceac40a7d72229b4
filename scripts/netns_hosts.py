"""Separate network hosts on this machine, for tests and benchmarks of multi-node jobs.

    python scripts/netns_hosts.py up --name ut1 --hosts 2     # prints the hosts as JSON
    python scripts/netns_hosts.py exec ut1 0 -- python -m unitrain ...
    python scripts/netns_hosts.py down --name ut1              # or: down --all

Each host is a Linux network namespace with its own loopback and one interface, ``eth0``, with an
address in a private subnet; the hosts meet on a bridge that lives in a namespace of its own, so
their traffic never touches this machine's own interfaces. ``down`` stops every process left in
the namespaces (SIGTERM, then SIGKILL) and deletes them, which takes their interfaces with them;
``down --all`` removes every set this script made (a test that died before its own ``down``).
Needs root and iproute2 (``ip netns``). From Python: ``with Hosts.up("ut1", 2) as hosts: ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Iterator, List, Sequence

#: Every namespace this script makes starts with it: ``down --all`` finds them by it.
PREFIX = "untr-"
INTERFACE = "eth0"
#: Seconds processes left in a namespace get between SIGTERM and SIGKILL.
GRACE_S = 3.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _subnet(name: str) -> str:
    """A /24 of 10.231.0.0/16 chosen by the name: sets made side by side do not share one."""
    return f"10.231.{zlib.crc32(name.encode()) % 250}"


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str
    interface: str = INTERFACE

    def command(self, argv: Sequence[str]) -> List[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)


class Hosts:
    """A set of hosts on one bridge; a context manager that always takes them down."""

    def __init__(self, name: str, hosts: List[Host]):
        self.name, self.hosts = name, hosts

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        down(self.name)

    @classmethod
    def up(cls, name: str, count: int) -> "Hosts":
        if not name.replace("-", "").isalnum() or len(name) > 8:
            raise ValueError(f"name {name!r}: up to 8 letters, digits or '-'")
        down(name)  # what a killed earlier run of the same name left
        try:
            return cls(name, _build(name, count))
        except BaseException:
            down(name)
            raise


def _build(name: str, count: int) -> List[Host]:
    switch, subnet = f"{PREFIX}{name}-sw", _subnet(name)
    _ip("netns", "add", switch)
    _ip("-n", switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", switch, "link", "set", "br0", "up")
    hosts = []
    for i in range(count):
        namespace = f"{PREFIX}{name}-h{i}"
        _ip("netns", "add", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
        # Made inside the host's namespace, the pair never has an end in this machine's own.
        _ip("-n", namespace, "link", "add", INTERFACE, "type", "veth", "peer", "name", f"p{i}", "netns", switch)
        _ip("-n", switch, "link", "set", f"p{i}", "master", "br0")
        _ip("-n", switch, "link", "set", f"p{i}", "up")
        address = f"{subnet}.{i + 1}"
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", INTERFACE)
        _ip("-n", namespace, "link", "set", INTERFACE, "up")
        hosts.append(Host(index=i, namespace=namespace, address=address))
    return hosts


def namespaces(name: str | None = None) -> List[str]:
    """This script's namespaces: of the set ``name``, or all of them."""
    listed = _ip("netns", "list", check=False).stdout.split()
    start = f"{PREFIX}{name}-" if name else PREFIX
    return [n for n in listed if n.startswith(start)]


def _pids(namespace: str) -> List[int]:
    return [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(name: str | None = None) -> List[str]:
    """Stop every process in the set's namespaces and delete them (``name`` None: every set)."""
    found = namespaces(name)
    pids = [p for n in found for p in _pids(n)]
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [p for n in found for p in _pids(n)]
    _signal(pids, signal.SIGKILL)
    for namespace in found:
        for _ in range(50):
            if _ip("netns", "del", namespace, check=False).returncode == 0 or namespace not in namespaces():
                break
            time.sleep(0.1)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/netns_hosts.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="make --hosts hosts named --name")
    up.add_argument("--name", required=True)
    up.add_argument("--hosts", type=int, default=2)
    gone = sub.add_parser("down", help="stop their processes and remove them")
    gone.add_argument("--name")
    gone.add_argument("--all", action="store_true")
    run = sub.add_parser("exec", help="run a command on host INDEX of set NAME")
    run.add_argument("name")
    run.add_argument("index", type=int)
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.what == "up":
        hosts = Hosts.up(args.name, args.hosts)
        print(json.dumps([asdict(h) for h in hosts], indent=2))
    elif args.what == "down":
        if not (args.name or args.all):
            parser.error("down needs --name or --all")
        print(" ".join(down(None if args.all else args.name)) or "nothing to remove")
    else:
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        namespace = f"{PREFIX}{args.name}-h{args.index}"
        return subprocess.call(["ip", "netns", "exec", namespace, *command])
    return 0


if __name__ == "__main__":
    sys.exit(main())
