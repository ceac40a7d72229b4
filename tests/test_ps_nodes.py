"""Where the processes of a parameter-server job over several nodes run, and the layouts a user
cannot run refused in one line (the jobs themselves: tests/test_multinode.py)."""

from __future__ import annotations

import os
import socket

import pytest

from backends.paddle.launch import ps_endpoints
from conftest import run_unitrain
from unitrain.config.schema import DistConfig, PsConfig
from unitrain.host.network import remote_peers
from unitrain.host.ports import ephemeral_range, free_port, port_in_use
from unitrain.interface.ps import PsLayout

PS = ["experiment=wide_deep_ps", "data.num_samples=3000", "data.val_samples=1000"]
TWO = ["dist.nnodes=2", "dist.master_port=29571"]


def test_the_totals_spread_evenly_and_roles_follow_the_nodes():
    layout = PsLayout.of(PsConfig(servers=3, trainers=2), 2)
    assert (layout.servers, layout.trainers) == ((2, 1), (1, 1))
    # Each node's servers first, then its trainers; numbered node after node.
    roles = [
        (layout.role(node, local).kind, layout.role(node, local).index)
        for node in (0, 1)
        for local in range(layout.processes(node))
    ]
    assert roles == [("server", 0), ("server", 1), ("trainer", 0), ("server", 2), ("trainer", 1)]
    assert PsLayout.parse(*layout.arguments()) == layout


def test_picked_ports_lie_where_no_outgoing_connection_takes_one_first():
    """A port picked in the kernel's ephemeral range can be taken by any outgoing connection
    before the server it was picked for binds it (CI saw a parameter server never listen)."""
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(30)]
    assert not any(low <= port <= high for port in ports), (low, high, ports)
    assert all(port_in_use(port) is None for port in ports)
    assert len(set(ports)) > 20  # drawn, not the same few each time


def test_paddle_gets_every_endpoint_on_every_node_in_node_order():
    dist = DistConfig(nnodes=2, master_port=29600)
    dist.ps = PsConfig(servers=2, trainers=3, node_servers=[2, 0], node_trainers=[1, 2], hosts=["10.0.0.1", "10.0.0.2"])
    servers, trainers = ps_endpoints(dist)
    assert servers == ["10.0.0.1:29601", "10.0.0.1:29602"]
    assert trainers == ["10.0.0.1:29603", "10.0.0.2:29601", "10.0.0.2:29602"]


@pytest.mark.parametrize(
    "backend,args,message",
    [
        (
            "torch",
            ["dist.ps.servers=2", "dist.ps.trainers=2", "dist.ps.node_servers=[2,1]"],
            "dist.ps.node_servers=[2, 1] is not allowed: 2 counts (one per node, node 0's first) that add up to "
            "dist.ps.servers=2",
        ),
        (
            "torch",
            ["dist.ps.servers=1", "dist.ps.trainers=1", "dist.ps.node_trainers=[1,0]"],
            "dist.ps.node_servers=[1, 0] is not allowed: a layout in which every node runs a server or a trainer "
            "(node 1 would run nothing",
        ),
        ("torch", ["dist.ps.servers=0", "dist.ps.trainers=1"], "dist.ps.servers=0 is not allowed: at least 1"),
        (
            "torch",
            ["trainer.checkpoint_every=10"],
            "trainer.checkpoint_every=10 is not allowed: unset with dist.mode=ps over several nodes (dist.nnodes > 1), "
            "unless dist.shared_dir names a directory every node reaches at the same path",
        ),
        (
            "torch",
            ["trainer.checkpoint_every=10", "dist.shared_dir=relative/dir"],
            "dist.shared_dir='relative/dir' is not allowed: an absolute path to an existing directory",
        ),
        (
            "torch",
            ["trainer.checkpoint_every=10", "dist.shared_dir=/no/such/dir"],
            "dist.shared_dir='/no/such/dir' is not allowed: an absolute path to an existing directory",
        ),
        (
            "paddle",
            [],
            "dist.ps.hosts=[] is not allowed: 2 addresses, node 0's first, with backend=paddle over several nodes",
        ),
        (
            "paddle",
            ["dist.ps.hosts=[10.0.0.1,10.0.0.12]"],
            "dist.ps.hosts=['10.0.0.1', '10.0.0.12'] is not allowed: distinct addresses none of which begins another",
        ),
    ],
)
def test_layouts_that_cannot_run_are_refused_in_one_line(backend, args, message, tmp_path):
    result = run_unitrain([*PS, f"backend={backend}", *TWO, *args], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_a_host_list_that_does_not_name_this_node_is_refused(tmp_path):
    args = [*PS, "backend=torch", *TWO, "dist.master_addr=127.0.0.1", "dist.ps.hosts=[192.0.2.7,127.0.0.1]"]
    result = run_unitrain(args, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "dist.ps.hosts[0]='192.0.2.7' is not allowed: it is not an address of this node" in lines[0]
    )


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_connections_within_this_host_are_not_another_node(family, host):
    """What keeps a node of servers waiting is a connection from another host: one over this
    host's own loopback (IPv4 or IPv6) is not."""
    try:
        server = socket.socket(family)
        server.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} on this machine")
    with server:
        server.listen()
        with socket.create_connection((host, server.getsockname()[1])) as client:
            accepted, _ = server.accept()
            with accepted:
                assert client.fileno() > 0 and remote_peers([os.getpid()]) == set()
