"""A directory every node of a job reaches at the same path (``dist.shared_dir``), checked
before anything starts: each node leaves a mark in it and waits to see every other node's.

A parameter-server checkpoint is written by every server (its shard of the tables) and read by
every server on resume; a data-parallel checkpoint is written by rank 0 and read, after a
restart (dist.max_restarts), by the restarted workers of any node. Over several nodes both need
a directory they all see: a network file system mounted at the same path. A directory that is
only local would spread one checkpoint over the hosts, or hide it from a restarted worker; the
marks show that before the job trains.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager, Iterator, List

from unitrain.config.schema import DistConfig
from unitrain.errors import Refusal

log = logging.getLogger("unitrain")

#: Seconds between looks for the other nodes' marks.
LOOK_EVERY_S = 0.5
MARKS = ".unitrain-nodes"


def _marks(shared: Path, dist: DistConfig) -> Path:
    # One folder per job: the nodes of one job agree on node 0's address and port.
    return shared / MARKS / f"{dist.master_addr}_{dist.master_port}"


def _missing(folder: Path, dist: DistConfig, since: float) -> List[int]:
    """The nodes whose mark of this start is not there yet (an older mark is a past job's)."""
    missing = []
    for node in range(dist.nnodes):
        try:
            mark = json.loads((folder / f"node{node}.json").read_text())
        except (OSError, ValueError):
            missing.append(node)
            continue
        if mark.get("started", 0.0) < since:
            missing.append(node)
    return missing


def seen_by_every_node(dist: DistConfig) -> ContextManager[None]:
    """Over several nodes, dist.shared_dir seen by every node before anything starts."""
    if dist.nnodes > 1 and dist.shared_dir:
        return shared_between_nodes(Path(dist.shared_dir), dist)
    return nullcontext()


@contextmanager
def shared_between_nodes(shared: Path, dist: DistConfig) -> Iterator[None]:
    """Leave this node's mark in ``shared``, wait up to dist.timeout_s for every node's, and
    take the mark away when the job ends. One line when a node's mark never comes. Node 0, whose
    launcher holds what the others' talk to (Paddle's etcd master, started beside it), leaves
    last after a job that ended well: it waits up to dist.timeout_s for their marks to go."""
    folder = _marks(shared, dist)
    started = time.time()
    mine = folder / f"node{dist.node_rank}.json"
    folder.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed: another node never reads half a mark.
    partial = folder / f".node{dist.node_rank}.{os.getpid()}"
    partial.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": started}))
    os.replace(partial, mine)
    try:
        _wait_for_marks(folder, dist, started - dist.timeout_s)
        log.info("dist.shared_dir=%s: every node's mark is there (shared by the %d nodes)", shared, dist.nnodes)
        yield
        if dist.node_rank == 0:
            _wait_for_the_others_to_leave(folder, dist, started - dist.timeout_s)
    finally:
        mine.unlink(missing_ok=True)


def _wait_for_the_others_to_leave(folder: Path, dist: DistConfig, since: float) -> None:
    deadline = time.monotonic() + dist.timeout_s
    others = set(range(1, dist.nnodes))
    while still := sorted(others - set(_missing(folder, dist, since))):
        if time.monotonic() > deadline:
            log.warning("node(s) %s had not ended %gs after node 0 (dist.timeout_s)", still, dist.timeout_s)
            return
        time.sleep(LOOK_EVERY_S)


def _wait_for_marks(folder: Path, dist: DistConfig, since: float) -> None:
    deadline = time.monotonic() + dist.timeout_s
    while missing := _missing(folder, dist, since):
        if time.monotonic() > deadline:
            nodes = ", ".join(map(str, missing))
            raise Refusal(
                f"dist.shared_dir={str(folder.parent.parent)!r}: node(s) {nodes} left no mark in it within "
                f"dist.timeout_s={dist.timeout_s:g}s: they did not start, or the directory is not shared; allowed: a "
                "directory every node reaches at the same path (a network file system), with the same command "
                "started on every node"
            )
        time.sleep(LOOK_EVERY_S)
