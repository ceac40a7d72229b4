"""A speed ratio between two exported models measured as interleaved pairs.

Timing each artifact alone, minutes apart, lets whatever else the machine does in between decide
the ratio. Here both run in the same process on the same input, in blocks that alternate (reference
then candidate, then the other way round), and each pair of blocks gives one ratio; the median
over the pairs and its 95% interval (:mod:`unitrain.report.intervals`) are the claim. The process
runs at a raised priority where the system allows, and records the CPU other work took meanwhile
(:mod:`unitrain.host.contention`): a ratio timed on a busy machine is flagged so. The pairs are
spread over several processes, and the interval resamples both the processes and the pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from unitrain.deploy import artifacts
from unitrain.deploy.runtimes import runtimes_for, thread_env
from unitrain.host import contention
from unitrain.host.machine import cpu
from unitrain.host.processes import die_with_parent
from unitrain.interface.infer import Runtime
from unitrain.report.intervals import ratio_summary

#: Seconds a block of runs of the slower model lasts: long enough to swamp the clock's cost.
BLOCK_S = 0.05
#: Pairs measured by one process; the rest go to further processes, one after another. A
#: process's pairs share what it drew (memory layout, compiled kernels): the ratio of a
#: fake-quantized model in torch eager moved by a fifth from one process to the next on a quiet
#: machine, more than within any one, so the interval has to see several processes.
PAIRS_PER_PROCESS = 2

#: Pairs behind one ratio a command may ask for: past this the interval stops narrowing in any way
#: that matters and the run takes hours.
MAX_PAIRS = 100


@dataclass(frozen=True, kw_only=True)
class Side:
    """One side of the ratio: an artifact, and which of its runtimes runs it."""

    artifact: artifacts.Artifact
    runtime: str

    def to_json(self) -> Dict[str, Any]:
        a = self.artifact
        return {
            "artifact": {**asdict(a), "directory": str(a.directory), "files": list(a.files)},
            "runtime": self.runtime,
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Side":
        a = data["artifact"]
        artifact = artifacts.Artifact(
            Path(a["directory"]), a["name"], a["framework"], a["format"], tuple(a["files"]), a["batch"]
        )
        return cls(artifact=artifact, runtime=data["runtime"])


def _load(side: Side, threads: int) -> Runtime:
    runtime = next((r for r in runtimes_for(side.artifact, threads) if r.name == side.runtime), None)
    if runtime is None:
        raise ValueError(f"{side.artifact.name} has no runtime {side.runtime!r}")
    runtime.load()
    return runtime


def interleave(runtimes: List[Runtime], inputs: List[Any], pairs: int, warmup: int) -> Dict[str, Any]:
    """Seconds per run of each, in alternating blocks; ratios reference / candidate; the CPUs
    other work took meanwhile."""
    for runtime, x in zip(runtimes, inputs):
        for _ in range(max(1, warmup)):
            runtime.run(x)
    once = []
    for runtime, x in zip(runtimes, inputs):
        started = time.perf_counter()
        runtime.run(x)
        once.append(time.perf_counter() - started)
    per_block = max(1, int(BLOCK_S / max(once)))
    # After the warm-up: torch.compile's compile workers are processes of their own.
    start = contention.sample()
    seconds: List[List[float]] = [[], []]
    for i in range(pairs):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            started = time.perf_counter()
            for _ in range(per_block):
                runtimes[k].run(inputs[k])
            seconds[k].append((time.perf_counter() - started) / per_block)
    return {
        "reference_s": seconds[0],
        "candidate_s": seconds[1],
        "ratios": [a / b for a, b in zip(*seconds)],
        "other_cpus": contention.other_cpus(start, contention.sample()),
    }


def ratio_worker(spec_file: str) -> int:
    """Runs in a child process: its share of the pairs, written as JSON next to the spec."""
    die_with_parent()
    spec = json.loads(Path(spec_file).read_text())
    sides = [Side.from_json(spec[k]) for k in ("reference", "candidate")]
    export = {"config": spec["config"], "input": spec.get("input")}
    dataset, _ = artifacts.evaluation_data(export, sides[0].artifact.directory, spec["batch"])
    images, _ = artifacts.stack(dataset, range(spec["batch"]))
    runtimes = [_load(side, spec["threads"]) for side in sides]
    inputs = [r.prepare(images) for r in runtimes]
    measured = interleave(runtimes, inputs, spec["pairs"], spec["warmup"])
    Path(spec["result"]).write_text(json.dumps({**measured, "nice": os.getpriority(os.PRIO_PROCESS, 0)}))
    return 0


def _timing_process() -> None:
    die_with_parent()
    contention.raise_priority()


def _one_process(spec: Dict[str, Any], tmp: Path, index: int, threads: int) -> Dict[str, Any]:
    """One ratio process's measurements, or ``{"error": ...}``."""
    spec = {**spec, "result": str(tmp / f"ratio{index}.json")}
    spec_file = tmp / f"ratio{index}.spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.infer", "--ratio", str(spec_file)],
        env=thread_env(threads),
        preexec_fn=_timing_process,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not Path(spec["result"]).exists():
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        return {
            "error": f"the ratio process ended with exit status {done.returncode}"
            + (f": {said[-1][:200]}" if said else "")
        }
    return json.loads(Path(spec["result"]).read_text())


def measure_ratio(
    reference: Side,
    candidate: Side,
    config: Dict[str, Any],
    batch: int,
    threads: int,
    pairs: int,
    warmup: int,
    inputs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """reference's time / candidate's time per run at ``batch``, as a median over ``pairs``
    interleaved pairs, :data:`PAIRS_PER_PROCESS` to a process, with its 95% interval over both
    levels; ``{"error": ...}`` when either cannot run. ``inputs``: the export manifest's
    ``input`` (a language model's token windows are re-read with the export's tokenizer)."""
    spec = {
        "reference": reference.to_json(),
        "candidate": candidate.to_json(),
        "config": config,
        "input": inputs,
        "batch": batch,
        "threads": threads,
        "warmup": warmup,
    }
    shares = [min(PAIRS_PER_PROCESS, pairs - start) for start in range(0, pairs, PAIRS_PER_PROCESS)]
    measured = []
    with tempfile.TemporaryDirectory(prefix="unitrain-ratio-") as tmp:
        for index, share in enumerate(shares):
            measured.append(_one_process({**spec, "pairs": share}, Path(tmp), index, threads))
            if "error" in measured[-1]:
                return measured[-1]
    others = [m["other_cpus"] for m in measured if m["other_cpus"] is not None]
    combined = {key: [v for m in measured for v in m[key]] for key in ("reference_s", "candidate_s", "ratios")}
    return {
        **ratio_summary(combined["ratios"], groups=[m["ratios"] for m in measured]),
        "busy": any(contention.busy(o, cpu()["logical_cpus"], threads) for o in others),
        "batch": batch,
        "processes": len(measured),
        "nice": max(m["nice"] for m in measured),
        "other_cpus": max(others) if others else None,
        "by_process": [m["ratios"] for m in measured],
        **combined,
    }
