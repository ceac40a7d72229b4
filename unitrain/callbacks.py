"""Hydra callbacks: the comparison table at the end of a multirun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from unitrain.report import load_summaries, markdown_table


class ComparisonTable(Callback):
    """After a sweep, print one table of every job's summary and keep it as comparison.md."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        summaries = load_summaries([sweep_dir])
        if not summaries:
            return
        table = markdown_table(summaries)
        (sweep_dir / "comparison.md").write_text(table + "\n")
        print(f"\n{table}\n\nwritten to {sweep_dir / 'comparison.md'}", flush=True)
