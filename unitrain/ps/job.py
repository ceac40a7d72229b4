"""Parameter-server training (``dist.mode=ps``): wide&deep on Criteo-format rows.

Servers hold the parameters (above all the sparse embedding tables); trainers read disjoint
shards, push gradients and pull parameters. The frameworks' own engines do the work (Paddle
Fleet's parameter server, PyTorch's torch.distributed.rpc), each behind a backend module
``backends/<name>/ps.py`` that builds a :class:`PsProgram` for one process. This module is the
framework-neutral rest: each process's role and what it runs (a trainer's loop, the metrics
computed identically for both, is :mod:`unitrain.ps.trainer`; the data each trainer reads,
:mod:`unitrain.ps.data`), and the job's summary from its trainers' results.

The process layout is the same on both frameworks: ``dist.ps.servers`` servers numbered 0..S-1
and ``dist.ps.trainers`` trainers 0..T-1, numbered node after node over several nodes (each node
runs its servers, then its trainers: :class:`~unitrain.interface.ps.PsLayout`). ``servers=0`` is
the baseline: one trainer, no servers, the same model trained in one process.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from unitrain.errors import UnitrainError
from unitrain.host import machine
from unitrain.host.atomic import replace_text
from unitrain.host.memory import peak_rss_mb
from unitrain.interface.backend import get_backend
from unitrain.interface.launch import launch_module
from unitrain.interface.ps import PsLayout, Role, ps_module
from unitrain.ps import checkpoint
from unitrain.ps.trainer import mean, train
from unitrain.train import summary as summaries

RESULTS = "ps"  # per-trainer results, <run_dir>/ps/trainer<i>.json


def role_from_env(backend: str, env: Mapping[str, str], layout: PsLayout, node: int) -> Role:
    """This process's role, read from what the framework's launcher set on node ``node``."""
    if layout.total_servers == 0:
        return Role("trainer", 0, 0, 1, local=0)
    role = launch_module(backend).ps_role(env, layout)
    here = layout.server_indices(node) if role.kind == "server" else layout.trainer_indices(node)
    return replace(role, local=role.index - here.start)


def _write_result(run_dir: Path, role: Role, result: Dict[str, Any]) -> None:
    folder = run_dir / RESULTS
    folder.mkdir(exist_ok=True)
    replace_text(folder / f"{role.kind}{role.index}.json", json.dumps(result, indent=2) + "\n")


def run_process(cfg, run_dir: Path, role: Role, on_connected: Callable[[], None] = lambda: None) -> None:
    """What each process of the job runs (entry/worker.py calls it): serve, or train.
    ``on_connected`` is called once the engine has reached the job's other processes."""
    backend = get_backend(cfg.backend.name)
    backend.set_threads(cfg.trainer.threads)
    backend.seed(cfg.trainer.seed)
    resumed = checkpoint.find(cfg, run_dir)
    program = ps_module(cfg.backend.name).build(cfg, role, resumed.path if resumed else None)
    on_connected()
    try:
        if role.kind == "server":
            program.run_server()
            _write_result(run_dir, role, {"role": role.name, "peak_rss_mb": peak_rss_mb()})
        else:
            _write_result(run_dir, role, train(cfg, program, role, run_dir, backend.describe(), resumed))
    finally:
        program.close()


def _node_processes(layout: PsLayout, node: int) -> Dict[str, Any]:
    return {
        "rank": node,
        "servers": list(layout.server_indices(node)),
        "trainers": list(layout.trainer_indices(node)),
    }


def _server_memory(run_dir: Path, servers: Iterable[int]) -> List[Optional[float]]:
    """Each server's peak RSS, as it wrote it when it stopped serving (None: it did not)."""
    out = []
    for i in servers:
        path = run_dir / RESULTS / f"server{i}.json"
        out.append(json.loads(path.read_text())["peak_rss_mb"] if path.exists() else None)
    return out


def _trainer_results(cfg, run_dir: Path) -> List[Dict[str, Any]]:
    """What this node's trainers wrote when they ended."""
    here = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes).trainer_indices(cfg.dist.node_rank)
    results = []
    for local, i in enumerate(here):
        path = run_dir / RESULTS / f"trainer{i}.json"
        if not path.exists():
            raise UnitrainError(
                f"trainer {i} ended without writing its results ({path}); see workerlog.{local} in {run_dir}"
            )
        results.append(json.loads(path.read_text()))
    return results


def _job_settings(cfg) -> Dict[str, Any]:
    """What the summary's table shows of how the job was set."""
    ps = cfg.dist.ps
    return {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "mode": "local" if ps.servers == 0 else ps.sync,
        "servers": ps.servers,
        "trainers": ps.trainers,
        "geo_k_steps": ps.geo_k_steps if ps.sync == "geo" and ps.servers else None,
        "optimizer": cfg.optim.name,
        "lr": cfg.optim.lr,
        "batch_size": cfg.trainer.batch_size,
        "seed": cfg.trainer.seed,
    }


def _beats_base_rate(evaluation: Optional[Dict[str, float]]) -> Optional[bool]:
    if not evaluation or "base_rate_logloss" not in evaluation:
        return None
    return evaluation["val_logloss"] < evaluation["base_rate_logloss"]


def summarize(cfg, run_dir: Path, wall: float) -> Optional[Dict[str, Any]]:
    """summary.json of the job, from its trainers' results (the main process writes it). Over
    several nodes, each node has its own processes' results: the node of trainer 0, which
    evaluates, writes the summary of its processes; the others write none (None)."""
    ps = cfg.dist.ps
    layout = PsLayout.of(ps, cfg.dist.nnodes)
    node = cfg.dist.node_rank
    if 0 not in layout.trainer_indices(node):
        _trainer_results(cfg, run_dir)  # that they ended well
        return None
    results = _trainer_results(cfg, run_dir)
    first = results[0]
    summary = {
        "kind": "ps",
        **{key: first[key] for key in ("backend", "framework", "version", "threads")},
        **_job_settings(cfg),
        "rows": sum(r["rows"] for r in results),
        "steps": first["steps"],
        "examples_per_s_per_trainer": [r["examples_per_s"] for r in results],
        "examples_per_s": sum(r["examples_per_s"] for r in results),
        "examples_per_s_overall": sum(r["examples_per_s_overall"] or 0 for r in results),
        "first_loss": first["first_loss"],
        "final_loss": mean([r["final_loss"] for r in results]),
        "eval": first["eval"],
        # False: the held-out log loss is no better than the base rate's (the model learned nothing).
        "beats_base_rate": _beats_base_rate(first["eval"]),
        "resumed_from": first.get("resumed_from"),
        "observed": first["observed"],
        # What the servers' tables hold at the end (rows created, bytes of rows and their
        # optimizer state), as the engine reports it.
        "tables": first["observed"].get("tables"),
        "memory": {
            "trainer_peak_rss_mb": [r["peak_rss_mb"] for r in results],
            "server_peak_rss_mb": _server_memory(run_dir, layout.server_indices(node)),
        },
        # Several nodes: the processes this summary covers (the others' are on their nodes).
        "node": _node_processes(layout, node) if cfg.dist.nnodes > 1 else None,
        "wall_time_s": wall,
        "cpu": machine.cpu(),
    }
    summaries.write(run_dir, summary)
    return summary
