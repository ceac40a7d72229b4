"""Which rank brought a data-parallel job down, named from its workers' status files alone."""

from __future__ import annotations

import json

from unitrain.interface.launch import launch_module
from unitrain.launch.diagnosis import diagnose


def _statuses(run_dir, *records):
    folder = run_dir / ".workers"
    folder.mkdir(parents=True)
    for record in records:
        (folder / f"rank{record['rank']}.json").write_text(json.dumps({"local_rank": record["rank"], **record}))


def test_a_rank_stopped_by_sigterm_from_outside_is_named_not_the_launcher(tmp_path):
    """Both ranks end 'terminated' (each one's SIGTERM handler says so): the one stopped first was
    stopped from outside, the other by the launcher after it. Before, with no rank 'failed', the
    job was said to have ended 'before any worker reported' after 30 reported steps, and Paddle
    named rank 0 first for a rank-1 kill."""
    _statuses(
        tmp_path,
        {"rank": 0, "pid": 1, "status": "terminated", "time": 100.4},
        {"rank": 1, "pid": 2, "status": "terminated", "time": 100.1},
    )
    for backend in ("torch", "paddle"):
        said = str(diagnose(tmp_path, launch_module(backend).LAUNCHER, 1))
        assert said.startswith("rank 1 was stopped first, by SIGTERM from outside the job; rank(s) 0 were then stopped")
        assert "before any worker reported" not in said and said.endswith("workerlog.1")
