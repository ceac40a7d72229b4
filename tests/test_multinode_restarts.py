"""Restarts over several nodes (dist.max_restarts with dist.shared_dir) between the network-
namespace hosts of test_multinode.py: a worker killed on node 1, and a host lost for good."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from test_multinode import _losses, _node, netns_hosts

from conftest import BACKENDS, FAST, run_unitrain
from unitrain.host.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need root and iproute2 (`ip netns`)",
    ),
]


#: A job long enough to kill a worker in its middle, with checkpoints to resume from.
RESTARTED_JOB = ["trainer.steps=60", "trainer.checkpoint_every=20", "trainer.save_final_weights=true"]


def _weights(run_dir: Path) -> dict:
    with np.load(run_dir / "final_weights.rank0.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_killed_on_node_1_restarts_there_and_the_job_ends_as_if_uninterrupted(backend, hosts, tmp_path):
    """Rank 0 writes the checkpoints into dist.shared_dir; the worker killed on node 1 is
    restarted there (and node 0's, which lost their peer, on node 0), every one resumes from the
    latest checkpoint, and the job ends with the uninterrupted job's losses and final weights,
    bit for bit. Paddle's pods meet in the etcd server node 0 starts, on the master port."""
    if backend == "paddle" and shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    job = [f"backend={backend}", *FAST, "trainer.threads=1", *RESTARTED_JOB]
    whole = run_unitrain([*job, "dist.nproc_per_node=2", f"dist.master_port={free_port()}"], tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    shared = tmp_path / "shared"
    shared.mkdir()
    extra = [*RESTARTED_JOB, "dist.max_restarts=1", f"dist.shared_dir={shared}", "dist.timeout_s=60"]
    nodes = [_node(h, backend, h.index, hosts[0].address, tmp_path / f"node{h.index}", extra) for h in hosts]
    deadline = time.monotonic() + 180
    while len(_losses(tmp_path / "node0") if (tmp_path / "node0" / "metrics.jsonl").exists() else []) < 30:
        assert nodes[0].poll() is None and time.monotonic() < deadline, nodes[0].communicate()
        time.sleep(0.1)
    victim = json.loads((tmp_path / "node1" / ".workers" / "rank1.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer would
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [o[1][-3000:] for o in outputs]
    summary = json.loads((tmp_path / "node0" / "summary.json").read_text())
    event = summary["restarts"]["events"][0]
    assert event["resumed_after_step"] >= 20 and event["resumed_after_step"] % 20 == 0
    assert summary["steps"] == 60 and (shared / "checkpoints" / "step60" / "meta.json").exists()
    assert not (tmp_path / "node0" / "checkpoints").exists()  # only in the shared directory
    assert _losses(tmp_path / "node0") == _losses(whole.run_dir)
    a, b = _weights(tmp_path / "node0"), _weights(whole.run_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in b)
    assert not list((shared / ".unitrain-nodes").rglob("node*.json"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_node_lost_with_restarts_left_ends_the_other_after_the_timeout(backend, hosts, tmp_path):
    """Node 0's workers, restarted after their peer's host went away, wait for it at most
    dist.timeout_s: then one line, nothing left running."""
    if backend == "paddle" and shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    shared = tmp_path / "shared"
    shared.mkdir()
    extra = ["trainer.steps=5000", "trainer.checkpoint_every=20", "dist.max_restarts=1", f"dist.shared_dir={shared}"]
    nodes = [
        _node(h, backend, h.index, hosts[0].address, tmp_path / f"node{h.index}", [*extra, "dist.timeout_s=20"])
        for h in hosts
    ]
    deadline = time.monotonic() + 180
    while len(_losses(tmp_path / "node0") if (tmp_path / "node0" / "metrics.jsonl").exists() else []) < 30:
        assert nodes[0].poll() is None and time.monotonic() < deadline, nodes[0].communicate()
        time.sleep(0.1)
    netns_hosts._signal(netns_hosts._pids(hosts[1].namespace), signal.SIGKILL)  # the whole machine gone
    killed = time.monotonic()
    _, stderr = nodes[0].communicate(timeout=300)
    nodes[1].communicate(timeout=30)
    took = time.monotonic() - killed
    assert nodes[0].returncode == 1 and took < 20 + 40, (took, stderr[-3000:])
    assert stderr.strip().count("\n") == 0, stderr[-3000:]
    assert stderr.startswith(
        "unitrain: error: dist.nnodes=2: rank(s) 0 of node 0 lost the connection to another node mid-run"
    ), stderr
    assert netns_hosts._pids(hosts[0].namespace) == []
