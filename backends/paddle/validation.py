"""What Paddle cannot do of a unitrain config, said before anything starts (no paddle import)."""

from __future__ import annotations

import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from typing import Optional, Tuple

from unitrain.config.schema import DistConfig, UnitrainConfig
from unitrain.errors import ConfigError
from unitrain.host.memory import available_mb
from unitrain.spec.optimizers import BY_NAME

__all__ = ["check_all_reduce", "check_collective", "check_ps"]


#: The first paddlepaddle unitrain's collective training runs on.
COLLECTIVE_SINCE = (3, 3)


def _installed() -> Optional[Tuple[int, ...]]:
    """The installed paddlepaddle's version, from its metadata: paddle itself is not imported."""
    for package in ("paddlepaddle", "paddlepaddle-gpu"):
        try:
            return tuple(int(p) for p in re.findall(r"\d+", version(package))[:3])
        except PackageNotFoundError:
            continue
    return None


def check_collective(cfg: UnitrainConfig) -> None:
    installed = _installed()
    if installed is not None and installed < COLLECTIVE_SINCE:
        # 3.0.0, the parameter-server environment's, lacks what training uses (Optimizer.zero_grad).
        have = ".".join(map(str, installed))
        raise ConfigError(
            "backend",
            "paddle",
            f"a paddlepaddle of {'.'.join(map(str, COLLECTIVE_SINCE))} or later with dist.mode=collective (this "
            f"environment has {have}, as the parameter-server environment .venv-ps does; train from .venv)",
        )
    _check_apex(cfg)
    check_all_reduce(cfg.dist)
    _check_etcd(cfg.dist)


def _check_etcd(dist: DistConfig) -> None:
    """Restarts need an etcd server beside the launcher, started on node 0 (the others reach
    it): refused here, before the run directory is made, where this node would start it."""
    if dist.max_restarts and dist.node_rank == 0 and shutil.which("etcd") is None:
        raise ConfigError(
            "dist.max_restarts",
            dist.max_restarts,
            "0 with backend=paddle on this machine: paddle.distributed.launch restarts workers only with an etcd "
            "server, and there is none (`make etcd` installs Debian's etcd-server)",
        )


#: Fleet's client queues at most pserver_max_async_call_num + 1 pushes of a trainer.
MAX_MERGED_PUSHES = 14


def check_ps(cfg: UnitrainConfig) -> None:
    ps = cfg.dist.ps
    if ps.servers > 0 and cfg.optim.name == "adagrad":
        # the_one_ps.py: "The dense optimizer in PS is only supported SGD or Adam!"
        raise ConfigError(
            "optim",
            "adagrad",
            "sgd or adam with backend=paddle on parameter servers (Fleet's dense tables have no Adagrad rule; "
            "dist.ps.servers=0 trains Adagrad in one process)",
        )
    if ps.servers > 0 and ps.sync == "geo" and cfg.trainer.checkpoint_every:
        # MemorySparseGeoTable::Save writes nothing: a checkpoint would hold no embeddings.
        raise ConfigError(
            "trainer.checkpoint_every",
            cfg.trainer.checkpoint_every,
            "0 with dist.ps.sync=geo on backend=paddle (Fleet's geo tables cannot be saved; sync or async save them)",
        )
    if ps.merge_pushes is not None and ps.merge_pushes > MAX_MERGED_PUSHES:
        # A trainer's push waits while its client holds more than pserver_max_async_call_num
        # (13) of them, and the client would send only past the limit: both would wait forever.
        raise ConfigError(
            "dist.ps.merge_pushes",
            ps.merge_pushes,
            f"at most {MAX_MERGED_PUSHES} with backend=paddle (Fleet's client holds at most that many of a "
            "trainer's pushes), or null for Fleet's own merging",
        )
    if cfg.dist.nnodes > 1:
        _check_ps_hosts(cfg.dist)
    if ps.servers == 0:
        _check_whole_table(cfg)
    _check_apex(cfg)
    check_all_reduce(cfg.dist)


def _check_whole_table(cfg: UnitrainConfig) -> None:
    """One Paddle process holds the whole [buckets, 1 + dim] table (and as much again per
    optimizer moment), not only the rows its ids touch as the servers do."""
    free = available_mb()
    buckets, dim = cfg.model.sparse_buckets, cfg.model.embedding_dim
    per_row = 4 * (1 + dim) * (2 + len(BY_NAME[str(cfg.optim.name)].row_state))
    if free is not None and buckets * per_row / 2**20 > free:
        raise ConfigError(
            "model.sparse_buckets",
            buckets,
            f"at most {int(free * 2**20 / per_row)} with backend=paddle and dist.ps.servers=0 (one Paddle process "
            f"holds the whole table: {buckets * per_row / 2**30:.1f} GiB, more than the {free / 1024:.1f} GiB free "
            "here); or parameter servers, whose tables hold only the ids they see",
        )


def _check_apex(cfg: UnitrainConfig) -> None:
    if cfg.amp.impl == "apex":
        raise ConfigError("amp.impl", "apex", "native with backend=paddle (NVIDIA Apex is a PyTorch extension)")


def check_all_reduce(dist: DistConfig) -> None:
    if dist.grad_compression != "none":
        # fp16_allreduce and DGC in DistributedStrategy are static-graph meta-optimizers; the
        # dynamic graph's DataParallel all-reduces gradients in their own dtype, with no hook.
        raise ConfigError(
            "dist.grad_compression",
            dist.grad_compression,
            "none with backend=paddle: Paddle's dynamic-graph DataParallel has no gradient compression",
        )
    if dist.bucket_cap_mb is not None and dist.bucket_cap_mb != int(dist.bucket_cap_mb):
        raise ConfigError(
            "dist.bucket_cap_mb",
            dist.bucket_cap_mb,
            "a whole number of MB with backend=paddle (Fleet's fuse_grad_size_in_MB is an integer)",
        )


def _check_ps_hosts(dist: DistConfig) -> None:
    hosts = list(dist.ps.hosts)
    if not hosts:  # their count, when given, is the core's check
        raise ConfigError(
            "dist.ps.hosts",
            hosts,
            f"{dist.nnodes} addresses, node 0's first, with backend=paddle over several nodes (Fleet's launcher "
            "gives every server's and trainer's address to each node)",
        )
    # The launcher starts the endpoints that begin with its own address: 10.0.0.1 would also
    # start 10.0.0.12's.
    for host in hosts:
        clash = [other for other in hosts if other != host and other.startswith(host)]
        if clash or hosts.count(host) > 1:
            raise ConfigError(
                "dist.ps.hosts",
                hosts,
                f"distinct addresses none of which begins another (Fleet's launcher would take {host!r}'s "
                f"processes for {(clash or [host])[0]!r}'s)",
            )
