"""maxbatch's search for the largest batch that fits (the command is :mod:`unitrain.maxbatch`).

Paddle's own framework comparisons set each framework at its largest batch; this finds it the
same way for unitrain's job: each trial is ``python -m unitrain <overrides> trainer.batch_size=B``
for a few steps in a process of its own, with B doubling from ``--start`` until a trial does
not fit, then bisecting between the last fit and the first failure.

Whether a trial fits:
- on an accelerator, the framework's own out-of-memory error ends it (nothing else is watched);
- on the CPU, where running out of memory means the kernel's OOM killer or swap rather than an
  error, ``--memory-limit`` stands for the device's memory: a trial fits if the peak resident
  memory of its processes stays under it. A watcher ends a trial the moment it goes over, so the
  search never drives the machine itself out of memory.

Any other failure stops the search with the trial's own last line. Writes ``maxbatch.json``
into ``--out`` (a new directory under runs/maxbatch/ by default) and prints one line per trial.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from unitrain.config.schema import register_configs
from unitrain.host.memory import OOM_PATTERNS
from unitrain.interface.launch import launch_module
from unitrain.launch.preflight import one_line

_UNITS = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024}


class UsageError(Exception):
    """One line for the user; exit status 2."""


@dataclass
class Trial:
    batch_size: int
    fits: bool
    why: str  # "fits", "over the memory limit", "out of memory (framework)"
    peak_mb: Optional[float]
    seconds: float


@dataclass(kw_only=True)
class _Watched:
    """How a trial's process ended, and the most memory its tree held while it was watched."""

    returncode: int
    stderr: str
    peak: float
    over: bool


def parse_megabytes(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
        raise UsageError(
            f"--memory-limit={text!r} is not allowed: a size such as 4096, 4096MiB or 4GiB (MiB when no unit is given)"
        )
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (the launcher's workers too), from /proc."""
    children: dict = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


class Search:
    def __init__(
        self, overrides: List[str], limit_mb: Optional[float], steps: int, work: Path, python: str = sys.executable
    ):
        self.overrides, self.limit_mb, self.steps, self.work, self.python = overrides, limit_mb, steps, work, python
        self.trials: List[Trial] = []

    def trial(self, batch: int) -> Trial:
        run_dir = self.work / f"batch{batch}"
        started = time.perf_counter()
        watched = self._watch(self._command(batch, run_dir))
        result = self._judge(batch, run_dir, watched, time.perf_counter() - started)
        self.trials.append(result)
        return result

    def _command(self, batch: int, run_dir: Path) -> List[str]:
        return [
            self.python,
            "-m",
            "unitrain",
            *self.overrides,
            f"trainer.batch_size={batch}",
            f"trainer.steps={self.steps}",
            "trainer.progress=false",
            "trainer.eval_every=0",
            f"hydra.run.dir={run_dir}",
        ]

    def _watch(self, cmd: List[str]) -> _Watched:
        """Runs the trial to its end, or kills it the moment its memory goes over the limit."""
        peak, over = 0.0, False
        with tempfile.TemporaryFile("w+") as err:
            # A session of its own: the whole tree (launcher and workers) ends together.
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
            try:
                while proc.poll() is None:
                    if self.limit_mb is not None:
                        peak = max(peak, _tree_rss_mb(proc.pid))
                        if peak > self.limit_mb:
                            over = True
                            os.killpg(proc.pid, signal.SIGKILL)
                            proc.wait()
                            break
                    time.sleep(0.1)
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            err.seek(0)
            return _Watched(returncode=proc.returncode, stderr=err.read(), peak=peak, over=over)

    def _judge(self, batch: int, run_dir: Path, watched: _Watched, seconds: float) -> Trial:
        peak = watched.peak
        if watched.over:
            return Trial(batch, False, "over the memory limit", round(peak, 1), seconds)
        if watched.returncode == 0:
            summary = json.loads((run_dir / "summary.json").read_text())
            memory = summary.get("memory") or {}
            device = memory.get("peak_device_mb")
            recorded = max(device) if device else sum(memory.get("peak_host_rss_mb") or [0])
            fits = self.limit_mb is None or device is not None or recorded <= self.limit_mb
            return Trial(
                batch, fits, "fits" if fits else "over the memory limit", round(max(recorded, peak), 1), seconds
            )
        if OOM_PATTERNS.search(watched.stderr):
            return Trial(batch, False, "out of memory (framework)", round(peak, 1) if peak else None, seconds)
        last = (watched.stderr.strip().splitlines() or [f"exit status {watched.returncode}"])[-1]
        raise UsageError(f"the trial at batch {batch} failed for another reason than memory: {last}")

    def run(self, start: int, maximum: int, report=print, resolution: int = 1) -> int:
        """The largest batch in [1, maximum] that fits, to within ``resolution`` (the next batch
        that does not is at most that much larger); 0 if not even batch 1 fits."""

        def tried(batch: int) -> bool:
            t = self.trial(batch)
            report(
                f"batch {batch:6d}: {t.why}"
                + (f" (peak {t.peak_mb:.0f} MiB)" if t.peak_mb else "")
                + f", {t.seconds:.1f} s"
            )
            return t.fits

        low, high = 0, None  # the largest batch known to fit, the smallest known not to
        batch = start
        while high is None:
            if not tried(batch):
                high = batch
            elif batch >= maximum:
                return batch
            else:
                low, batch = batch, min(batch * 2, maximum)
        while high - low > max(resolution, 1):
            middle = (low + high) // 2
            if tried(middle):
                low = middle
            else:
                high = middle
        return low


def has_accelerator(overrides: List[str]) -> bool:
    """Whether the job will run on an accelerator: asked for, or auto with one present (asked of
    the framework in a child process: this one imports none)."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="unitrain.conf", version_base=None):
            job = compose("config", overrides=[o for o in overrides if "=" in o and not o.startswith("-")])
    except Exception as err:  # noqa: BLE001 - whatever Hydra raises, the user gets one line
        raise UsageError(one_line(err)) from None
    finally:
        GlobalHydra.instance().clear()
    if job.backend.device == "cpu":
        return False
    probe = launch_module(job.backend.name).ACCELERATOR_PROBE
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip().endswith("True")
