"""Why a comparison may not be fair, as one-line warnings for the report: settings that differ
between runs beyond the compared axes (in the Hydra configs, or resolved only at run time such
as threads and device), what a backend observed that slowed its own run, and runs resumed from
the other framework's checkpoint, whose curves and clock mix two frameworks, and runs that
trained at the same time on one host.
"""

from __future__ import annotations

import json
from typing import List

from unitrain.report.runs import Run, is_compared
from unitrain.tracking.mlflow_runs import flatten


def mixed_framework_warnings(runs: List[Run]) -> List[str]:
    """Runs resumed from the other framework's checkpoint: their steps up to it, the clock
    and the curves are the other framework's, which a time to target would silently count."""
    warnings = []
    for run in runs:
        others = {}
        for record in run.metrics:
            if "framework" in record:
                others.setdefault(record["framework"], []).append(record["step"])
        for framework, steps in others.items():
            warnings.append(
                f"{run.label} ({run.dir.name}) continued a {framework} run: steps {min(steps)}-{max(steps)}, their "
                "time and held-out "
                f"results are {framework}'s, so its time to target and curves mix two frameworks; its samples/s "
                "counts its own steps only"
            )
    return warnings


def overlap_warnings(runs: List[Run]) -> List[str]:
    """Runs whose training loops overlapped in time on one host (parallel sweep launchers,
    a SLURM array on one node): their timings competed for the same cores."""
    spans = []
    for run in runs:
        start, wall = run.summary.get("loop_started_at"), run.summary.get("wall_time_s")
        if start is not None and wall is not None:
            spans.append((run.summary.get("host"), start, start + wall, run))
    warnings = []
    for i, (host, start, end, run) in enumerate(spans):
        for other_host, other_start, other_end, other in spans[i + 1 :]:
            if host == other_host and start < other_end and other_start < end:
                warnings.append(
                    f"{run.label} ({run.dir.name}) and {other.label} ({other.dir.name}) trained at the same time on "
                    f"{host or 'one host'}: their timings competed for its cores; compare speeds from jobs run one "
                    "at a time"
                )
    return warnings


def fairness_warnings(runs: List[Run]) -> List[str]:
    """What differs between runs beyond the axes being compared, and runs that mix frameworks."""
    if len(runs) < 2:
        return mixed_framework_warnings(runs)
    overlaps = overlap_warnings(runs)
    swept = {k for r in runs for k in r.swept}
    allowed = lambda key: is_compared(key, swept)  # noqa: E731
    flat = [flatten(r.config) for r in runs]
    warnings = []
    for key in sorted(set().union(*flat)):
        values = {json.dumps(f.get(key), sort_keys=True, default=str) for f in flat}
        if len(values) > 1 and not allowed(key):
            warnings.append(f"runs differ in {key} ({' vs '.join(sorted(values))}): the comparison would not be fair")
    # Resolved at run time, so the configs can agree (threads: null) while the runs did not.
    for fact, key in (("threads", "trainer.threads"), ("device", "backend.device"), ("image_size", "data.image_size")):
        values = {str(r.summary.get(fact)) for r in runs}
        if len(values) > 1 and not allowed(key) and not any(w.startswith(f"runs differ in {key} ") for w in warnings):
            warnings.append(f"runs differ in {fact} ({' vs '.join(sorted(values))}): the comparison would not be fair")
    # What a backend observed that slowed its own run (summary.json's speed_warnings).
    warnings += sorted({w for r in runs for w in r.summary.get("speed_warnings", [])})
    return warnings + overlaps + mixed_framework_warnings(runs)
