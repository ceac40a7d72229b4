"""Progress display for the main process: a rich bar on a terminal, periodic log lines elsewhere."""

from __future__ import annotations

import logging
import sys
from typing import Dict

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("unitrain")


class StepProgress:
    def __init__(self, total: int, description: str, enabled: bool = True, log_every: int = 10):
        self.total, self.log_every = total, log_every
        self.enabled = enabled
        # A live bar only where someone watches; logs (CI, files) get plain lines instead.
        self._bar = None
        if enabled and sys.stderr.isatty():
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task(description, total=total, stats="")
            self._bar.start()

    def update(self, step: int, record: Dict[str, float]) -> None:
        if not self.enabled:
            return
        stats = f"loss {record['loss']:.4f} top1 {record['top1']:.3f} {record['ips']:.1f} samples/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, stats=stats)
        elif step % self.log_every == 0 or step == self.total:
            log.info("step %d/%d  %s  lr %.4g", step, self.total, stats, record["lr"])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
