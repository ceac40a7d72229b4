"""dist.max_restarts: what a worker does when the framework's launcher restarted it.

torchrun (``--max-restarts``) and Paddle's launcher (``--max_restart`` with ``--elastic_level 1``)
restart every worker of a node after one fails (over several nodes, every node's: the others
lose their peer); unitrain's part is that the restarted workers continue the run instead of
starting it again: each resumes from the run's latest checkpoint (the same one on every rank:
a checkpoint is renamed into place whole; over several nodes in dist.shared_dir, which every
node reads), or, when none was written yet, from where the job started (its own
trainer.resume, or step 0), and rank 0 records the restart in
``restarts.jsonl``: the step the run had reached and the step it resumed after, whose
difference is the steps repeated. The main process adds them up in ``summary.json``
(:func:`summarize`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from unitrain.train import summary as summaries
from unitrain.train.checkpoint import checkpoint_home, find_checkpoint, read_meta
from unitrain.train.metrics import metrics_history

log = logging.getLogger("unitrain")

RESTARTS = "restarts.jsonl"


def _latest_step(home: Path) -> Optional[int]:
    latest = home / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    return int(read_meta(latest.parent / latest.read_text().strip())["step"])


def _reached_step(run_dir: Path) -> int:
    """The last training step the failed attempt recorded in metrics.jsonl."""
    return max((int(r["step"]) for r in metrics_history(run_dir, math.inf) if "loss" in r), default=0)


def _first_step(cfg: Any, run_dir: Path) -> int:
    """The step the job itself started after: that of the checkpoint its trainer.resume names."""
    if not cfg.trainer.resume:
        return 0
    roots = [Path.cwd() / "runs", Path.cwd() / "multirun"]
    return int(read_meta(find_checkpoint(cfg.trainer.resume, roots, exclude=run_dir))["step"])


def resume_after_restart(cfg: Any, run_dir: Path, rank: int, attempt: int) -> None:
    """Point ``cfg.trainer.resume`` at the run's own latest checkpoint; without one yet, the job
    starts again where it started (its own trainer.resume, or step 0)."""
    home = checkpoint_home(cfg, run_dir)
    resumed = _latest_step(home)
    if resumed is None:
        resumed = _first_step(cfg, run_dir)
        why = f"no checkpoint yet, starting again after step {resumed}"
    else:
        cfg.trainer.resume, why = str(home), f"resuming after step {resumed}"
    log.info("restart %d of at most %d: %s", attempt, cfg.dist.max_restarts, why)
    if rank != 0:
        return
    record = {"attempt": attempt, "reached_step": _reached_step(run_dir), "resumed_after_step": resumed}
    with open(run_dir / RESTARTS, "a", encoding="utf-8") as f:
        f.write(json.dumps({**record, "time": time.time()}) + "\n")


def summarize(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The job's restarts for summary.json, or None when there were none."""
    path = run_dir / RESTARTS
    if not path.exists():
        return None
    events: List[Dict[str, Any]] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    repeated = sum(max(0, e["reached_step"] - e["resumed_after_step"]) for e in events)
    return {"count": len(events), "steps_repeated": repeated, "events": events}


def add_to_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    """Write the restarts into rank 0's summary.json; the summary, updated."""
    summary_path, restarts = run_dir / "summary.json", summarize(run_dir)
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    summary["restarts"] = restarts or {"count": 0, "steps_repeated": 0, "events": []}
    summaries.write(run_dir, summary)
    return summary
