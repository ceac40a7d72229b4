"""Sweeps sent to a cluster scheduler (a real one-node SLURM made by scripts/slurm_cluster.py)
or run in parallel on this machine (joblib), through Hydra's launcher plugins; and the layout a
data-parallel job takes from SLURM's variables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import FAST
from unitrain.config.schema import UnitrainConfig
from unitrain.launch import slurm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import slurm_cluster  # noqa: E402 - scripts/slurm_cluster.py

SWEEP = ["-m", "backend=paddle,torch", *FAST, "trainer.steps=3"]


@pytest.mark.parametrize(
    "nodelist,first",
    [("vm", "vm"), ("gpu[07-09,12],cpu01", "gpu07"), ("a1,a2", "a1"), ("node[3]", "node3"), ("x-[010-011]", "x-010")],
)
def test_the_first_host_of_a_slurm_node_list_is_node_0(nodelist, first):
    assert slurm.first_host(nodelist) == first


def test_a_job_in_a_slurm_allocation_takes_its_nodes_from_slurm_unless_given():
    env = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "n[04-06]"}
    cfg = OmegaConf.structured(UnitrainConfig)
    applied = slurm.apply(cfg, ["backend=torch"], env)
    assert (cfg.dist.nnodes, cfg.dist.node_rank, cfg.dist.master_addr) == (3, 2, "n04")
    # Every node draws the same port from the job id.
    assert cfg.dist.master_port == slurm.PORT_BASE + 4242 % slurm.PORT_SPAN and "dist.master_port" in applied
    given = OmegaConf.structured(UnitrainConfig)
    given.dist.master_addr = "10.0.0.1"
    slurm.apply(given, ["dist.master_addr=10.0.0.1"], env)
    assert given.dist.master_addr == "10.0.0.1" and given.dist.nnodes == 3
    outside = OmegaConf.structured(UnitrainConfig)
    assert slurm.apply(outside, [], {}) == {} and outside.dist.nnodes == 1


def _table_rows(stdout: str) -> list:
    return [line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith(("| paddle", "| torch"))]


@pytest.fixture
def cluster(tmp_path):
    if os.geteuid() != 0 or not (shutil.which("slurmctld") and shutil.which("munged")):
        pytest.skip("a SLURM cluster needs root and slurm-wlm with munge (make slurm)")
    folder = tmp_path / "slurm"
    slurm_cluster.up(folder)
    pids = [int((folder / f"{daemon}.pid").read_text().split()[0]) for daemon in ("slurmd", "slurmctld", "munged")]
    try:
        yield folder
    finally:
        slurm_cluster.down(folder)
    # Nothing left running: every daemon this cluster started is gone.
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []


@pytest.mark.serial
@pytest.mark.slow
def test_a_sweep_runs_each_job_as_a_slurm_job_and_still_writes_the_table(cluster, tmp_path):
    launcher = ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10"]
    done = subprocess.run(
        [sys.executable, "-m", "unitrain", *SWEEP, *launcher, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **slurm_cluster.env(cluster)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert sorted(_table_rows(done.stdout)) == ["paddle", "torch"]
    # Each job ran under SLURM: submitit's log of it, and the layout it took from SLURM.
    logs = list((tmp_path / "sweep" / ".submitit").rglob("*_log.out"))
    assert len(logs) == 2
    assert all("from SLURM's variables" in log.read_text() for log in logs), [log.read_text()[-500:] for log in logs]
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("summary.json")]
    assert sorted(s["backend"] for s in summaries) == ["paddle", "torch"]
    assert (tmp_path / "sweep" / "comparison.md").exists()


@pytest.mark.slow
def test_a_sweep_runs_its_jobs_in_parallel_with_joblib(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            *SWEEP,
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(_table_rows(done.stdout)) == ["paddle", "torch"]
    assert "run in parallel" in done.stdout + done.stderr
