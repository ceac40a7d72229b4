"""A data-parallel job started inside a SLURM allocation (``hydra/launcher=submitit_slurm`` with
``hydra.launcher.nodes=N``, or ``srun python -m unitrain ...``) takes its layout from SLURM.

SLURM starts the same command once per node (one task per node: unitrain's own launcher starts
the workers) and says in each where it runs: ``SLURM_NNODES``, ``SLURM_NODEID`` and
``SLURM_JOB_NODELIST``, whose first host becomes node 0. What the user gave on the command line
wins; the port, which every node must agree on, is drawn from the job id.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional

log = logging.getLogger("unitrain")

#: dist.master_port of a multi-node SLURM job without one: PORT_BASE + job id mod PORT_SPAN.
PORT_BASE, PORT_SPAN = 20000, 20000


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[07-09,12],cpu01`` -> ``gpu07``."""
    head = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not head:
        return nodelist
    prefix, ranges = head.group(1), head.group(3)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


@dataclass(frozen=True, kw_only=True)
class SlurmLayout:
    job_id: str
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def layout(env: Mapping[str, str]) -> Optional[SlurmLayout]:
    """This process's place in its SLURM job, or None outside one."""
    if "SLURM_JOB_ID" not in env or "SLURM_NODEID" not in env:
        return None
    job = env["SLURM_JOB_ID"]
    return SlurmLayout(
        job_id=job,
        nnodes=int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1),
        node_rank=int(env["SLURM_NODEID"]),
        master_addr=first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"),
        master_port=PORT_BASE + int(re.sub(r"\D", "", job) or 0) % PORT_SPAN,
    )


def apply(cfg: Any, overrides: Iterable[str], env: Mapping[str, str]) -> Dict[str, Any]:
    """Set ``cfg.dist``'s layout from SLURM where the user did not (``overrides``: the job's
    command-line overrides); what was set, by key. For the jobs whose nodes SLURM gives
    (:attr:`unitrain.jobs.kind.JobKind.nodes_from_slurm`)."""
    found = layout(env)
    if found is None:
        return {}
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    values = {
        "dist.nnodes": found.nnodes,
        "dist.node_rank": found.node_rank,
        "dist.master_addr": found.master_addr if found.nnodes > 1 else cfg.dist.master_addr,
    }
    if found.nnodes > 1 and cfg.dist.master_port is None:
        values["dist.master_port"] = found.master_port
    applied = {key: value for key, value in values.items() if key not in given}
    for key, value in applied.items():
        setattr(cfg.dist, key.split(".", 1)[1], value)
    if applied:
        taken = ", ".join(f"{k}={v}" for k, v in applied.items())
        log.info("SLURM job %s: %s from SLURM's variables", found.job_id, taken)
    return applied
