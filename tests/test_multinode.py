"""Multi-node jobs between hosts that are really separate on the network: Linux network
namespaces made by scripts/netns_hosts.py, each with its own address and loopback, a node per
namespace running the command a user runs on each machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from conftest import BACKENDS, FAST

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import netns_hosts  # noqa: E402 - scripts/netns_hosts.py

PORT = 29555

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need root and iproute2 (`ip netns`)",
    ),
]


@pytest.fixture
def hosts():
    name = f"t{uuid.uuid4().hex[:6]}"
    with netns_hosts.Hosts.up(name, 2) as made:
        yield made
    # Nothing left behind: no namespace, so no interface and no process in one.
    assert netns_hosts.namespaces(name) == []


def _node(host, backend: str, node: int, master: str, run_dir: Path, extra: List[str]) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "unitrain",
        f"backend={backend}",
        *FAST,
        "trainer.threads=1",
        "dist.nnodes=2",
        "dist.nproc_per_node=1",
        f"dist.master_addr={master}",
        f"dist.master_port={PORT}",
        f"dist.node_rank={node}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    return host.popen(argv, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(run_dir: Path) -> List[float]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_hosts_train_as_one_host_with_two_processes(backend, hosts, tmp_path):
    """Each node talks on its own interface, not the loopback its host name resolves to; the
    job is the same job: the losses of 2 nodes x 1 process are those of 1 node x 2 processes."""
    steps = ["trainer.steps=6", "dist.timeout_s=60"]
    nodes = [_node(h, backend, h.index, hosts[0].address, tmp_path / f"node{h.index}", steps) for h in hosts]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert f"node 1 talks on eth0 ({hosts[1].address})" in "".join(outputs[1])
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            f"backend={backend}",
            *FAST,
            "trainer.threads=1",
            "dist.nproc_per_node=2",
            *steps[:1],
            f"hydra.run.dir={tmp_path / 'one'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    summary = json.loads((tmp_path / "node0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    assert _losses(tmp_path / "node0") == pytest.approx(_losses(tmp_path / "one"), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_node_that_starts_late_is_waited_for(backend, hosts, tmp_path):
    extra = ["trainer.steps=3", "dist.timeout_s=60"]
    first = _node(hosts[0], backend, 0, hosts[0].address, tmp_path / "node0", extra)
    time.sleep(8)
    second = _node(hosts[1], backend, 1, hosts[0].address, tmp_path / "node1", extra)
    outputs = [node.communicate(timeout=240) for node in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_node_that_never_comes_is_named_after_the_timeout(backend, hosts, tmp_path):
    started = time.monotonic()
    node = _node(hosts[0], backend, 0, hosts[0].address, tmp_path / "node0", ["dist.timeout_s=8"])
    _, stderr = node.communicate(timeout=120)
    took = time.monotonic() - started
    assert node.returncode != 0
    lines = stderr.strip().splitlines()
    assert "dist.nnodes=2: the other node(s) did not join" in lines[0] and "dist.timeout_s=8s" in lines[0], lines
    assert took < 60, took
    assert netns_hosts._pids(hosts[0].namespace) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_node_that_dies_mid_run_ends_the_other_in_seconds(backend, hosts, tmp_path):
    extra = ["trainer.steps=5000", "dist.timeout_s=60"]
    nodes = [_node(h, backend, h.index, hosts[0].address, tmp_path / f"node{h.index}", extra) for h in hosts]
    metrics = tmp_path / "node0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.stat().st_size) and time.monotonic() < deadline:
        assert nodes[0].poll() is None, nodes[0].communicate()
        time.sleep(0.2)
    assert metrics.exists(), "node 0 never trained"
    netns_hosts._signal(netns_hosts._pids(hosts[1].namespace), signal.SIGKILL)  # the whole machine gone
    killed = time.monotonic()
    _, stderr = nodes[0].communicate(timeout=120)
    nodes[1].communicate(timeout=30)
    assert nodes[0].returncode == 1 and time.monotonic() - killed < 30
    assert stderr.strip().splitlines()[0] == (
        "unitrain: error: dist.nnodes=2: rank(s) 0 of node 0 lost the connection to another node mid-run (it "
        "stopped, or the network between the nodes went away: its own run directory says which); "
        f"{'torch.distributed.run' if backend == 'torch' else 'paddle.distributed.launch'} exited with code "
        + stderr.split("exited with code ", 1)[1].split("\n", 1)[0]
    )
    assert netns_hosts._pids(hosts[0].namespace) == []
