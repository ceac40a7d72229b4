"""A sweep's jobs that failed: each records itself as it ends (its number, run directory, exit
status and error), so that the sweep goes on with the others, its table reports the jobs that
finished, and one line after it names the failed ones, whose status the sweep then exits with."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

#: In the sweep's directory, a line per failed job.
FILE = "failed_jobs.jsonl"


def record(sweep_dir: Path, hydra_cfg: Any, code: int, error: str) -> None:
    """Append the job's line (one write of one line: jobs run in parallel append whole lines)."""
    entry = {
        "job": int(hydra_cfg.job.num),
        "run_dir": str(hydra_cfg.runtime.output_dir),
        "exit_code": int(code),
        "error": error,
    }
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(sweep_dir) / FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def forget(sweep_dir: Path) -> None:
    """An earlier sweep's record in the same directory (one whose every job failed) is not this one's."""
    (Path(sweep_dir) / FILE).unlink(missing_ok=True)


def read(sweep_dir: Path) -> List[Dict[str, Any]]:
    path = Path(sweep_dir) / FILE
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed job
    return sorted(entries, key=lambda e: e["job"])


def summary_line(failed: List[Dict[str, Any]]) -> str:
    """One line naming every failed job and its run directory (its error was printed as it ended)."""
    jobs = ", ".join(f"#{e['job']} (exit {e['exit_code']}: {e['run_dir']})" for e in failed)
    return f"{len(failed)} job(s) of the sweep failed: {jobs}; the table holds the jobs that finished"


def exit_status(failed: List[Dict[str, Any]]) -> int:
    """The sweep's status: the first failed job's (non-zero)."""
    return next((e["exit_code"] for e in failed if e["exit_code"]), 1)
