"""Hydra callbacks: the comparison report at the end of a multirun (training or quantization)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from unitrain.config.schema import Logger
from unitrain.report import failed_jobs
from unitrain.report import hyperparameter_search as search_report
from unitrain.report.runs import results_under
from unitrain.report.training import write_report
from unitrain.tracking import mlflow_runs
from unitrain.train.objective import searching


class ComparisonReport(Callback):
    """After a sweep: one table of every job, printed, plus comparison.md, plots and report.html."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed_jobs.forget(sweep_dir)
        if searching(config.hydra) or Logger.mlflow in config.trainer.loggers:
            # Hydra's launcher makes it later; a search's study and MLflow's store live in it.
            sweep_dir.mkdir(parents=True, exist_ok=True)
        if searching(config.hydra):
            search_report.record(config, sweep_dir)
        if Logger.mlflow in config.trainer.loggers:
            mlflow_runs.start_sweep(config, sweep_dir)
        # hydra/launcher=joblib: a table of timings from jobs that shared the cores compares little.
        jobs = config.hydra.launcher.get("n_jobs")
        if jobs is not None and jobs != 1:
            print(
                f"unitrain: the jobs of this sweep run in parallel (hydra.launcher.n_jobs={jobs}): their timings "
                "compete for the same cores; compare speeds from a sweep with n_jobs=1",
                flush=True,
            )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if results_under(sweep_dir, "summary.json"):
            table = write_report([sweep_dir])
            print(f"\n{table}\n\nreport: {sweep_dir / 'report.html'}", flush=True)
        sweep = mlflow_runs.TrackedRun.read(sweep_dir)
        if sweep is not None:
            mlflow_runs.log_files(sweep, [sweep_dir / name for name in mlflow_runs.RUN_FILES + ("multirun.yaml",)])
            mlflow_runs.log_files(sweep, sorted(sweep_dir.glob("*.png")), "plots")
            sweep.client().set_terminated(sweep.run_id, "FINISHED")
        failed = failed_jobs.read(sweep_dir)
        if failed:  # each said why as it ended; the sweep's status says that some did
            print(f"unitrain: error: {failed_jobs.summary_line(failed)}", file=sys.stderr, flush=True)
            sys.exit(failed_jobs.exit_status(failed))


class QuantizationReport(Callback):
    """After a ``python -m unitrain.quantize -m`` sweep: one table of every job, printed and
    written as quantize.md in the sweep directory."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from unitrain.report.quantize import combined_markdown, plot, results

        sweep_dir = Path(config.hydra.sweep.dir)
        found = results([sweep_dir])
        if found:
            reports = [report for _, report in found]
            text = combined_markdown(reports)
            (sweep_dir / "quantize.md").write_text(text + "\n")
            plot([row for r in reports for row in r["rows"]], reports[0]["batches"], sweep_dir / "quantize.png")
            print(f"\n{text}\n\ntable: {sweep_dir / 'quantize.md'}", flush=True)
