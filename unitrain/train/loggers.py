"""Optional metric sinks beside metrics.jsonl: TensorBoard (tensorboardX), VisualDL and MLflow.

Selected with ``trainer.loggers=[tensorboard]`` / ``[visualdl]`` / ``[mlflow]``; off by default.
Their packages load only when chosen, and a missing one stops the run at start naming the extra.
MLflow tracks more than the steps (:mod:`unitrain.tracking.mlflow_runs`): its sink sends them to the
run the job opened.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

from unitrain.errors import BackendUnavailableError
from unitrain.tracking.mlflow_runs import MlflowSink

SCALARS = ("loss", "top1", "top5", "lr", "ips", "batch_cost", "reader_cost", "loss_scale")


class MetricSink:
    def log(self, step: int, record: Dict[str, float]) -> None:
        for key in SCALARS:
            if key in record:
                self.scalar(f"train/{key}", step, record[key])

    def scalar(self, tag: str, step: int, value: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.writer.close()


@contextmanager
def _needs(install: str) -> Iterator[None]:
    """A sink's writer imported inside: its ImportError is the one line ``install`` (the package and its extra)."""
    try:
        yield
    except ImportError:
        raise BackendUnavailableError(install) from None


class TensorBoardSink(MetricSink):
    def __init__(self, log_dir: Path):
        with _needs("trainer.loggers=[tensorboard] needs tensorboardX: pip install 'unitrain[tensorboard]'"):
            from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(logdir=str(log_dir))

    def scalar(self, tag: str, step: int, value: float) -> None:
        self.writer.add_scalar(tag, value, step)


class VisualDLSink(MetricSink):
    def __init__(self, log_dir: Path):
        with _needs("trainer.loggers=[visualdl] needs VisualDL: pip install 'unitrain[visualdl]'"):
            from visualdl import LogWriter
        self.writer = LogWriter(logdir=str(log_dir))

    def scalar(self, tag: str, step: int, value: float) -> None:
        self.writer.add_scalar(tag=tag, step=step, value=value)


SINKS = {
    "tensorboard": lambda run_dir: TensorBoardSink(run_dir / "tensorboard"),
    "visualdl": lambda run_dir: VisualDLSink(run_dir / "visualdl"),
    "mlflow": MlflowSink,
}


def make_sinks(names: List[str], run_dir: Path) -> List[MetricSink | MlflowSink]:
    return [SINKS[name](run_dir) for name in names]
