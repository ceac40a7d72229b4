"""The training comparison's plots, drawn with matplotlib's Agg backend (no display needed):
training loss and top-1 by step (curves.png), held-out top-1 (a language model's held-out loss)
by step and by wall time (held_out.png, only when runs evaluated), throughput with its spread (throughput.png) and the
step time split into compute and waiting for data (step_time.png). One line or bar per row of
the table; a row's repeats are drawn fainter, in its colour.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import List

from unitrain.report.runs import Run
from unitrain.report.stats import throughput
from unitrain.tasks.registry import common_task
from unitrain.tasks.task import Task


def plot(groups: List[List[Run]], out: Path) -> List[Path]:
    """curves.png, held_out.png (when there are evaluations), throughput.png, step_time.png."""
    import matplotlib

    matplotlib.use("Agg")
    files = [_save(_curves(groups), out / "curves.png")]
    if any(r.evals for g in groups for r in g):
        files.append(_save(_held_out_curves(groups), out / "held_out.png"))
    files.append(_save(_throughput_bars(groups), out / "throughput.png"))
    files.append(_save(_step_time_bars(groups), out / "step_time.png"))
    return files


def _curves(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for group in groups:
        for j, run in enumerate(group):
            steps = [r["step"] for r in run.metrics]
            label = run.label if j == 0 else None
            color = None if j == 0 else ax_loss.lines[-1].get_color()
            ax_loss.plot(
                steps, [r["loss"] for r in run.metrics], label=label, color=color, alpha=1.0 if j == 0 else 0.5
            )
            ax_acc.plot(steps, [r["top1"] for r in run.metrics], label=label, color=color, alpha=1.0 if j == 0 else 0.5)
    ax_loss.set(title="training loss", xlabel="step", ylabel="loss")
    ax_acc.set(title="top-1 accuracy (training batches)", xlabel="step", ylabel="top-1", ylim=(0, 1.02))
    ax_loss.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _task(groups: List[List[Run]]) -> Task:
    """The task every row ran (a language model's measure is its held-out loss, its rate
    tokens/s); a classifier's where the rows differ (held-out top-1, samples/s)."""
    return common_task(g[0].task for g in groups)


def _held_out_curves(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    measure = _task(groups).measure
    key, name = measure.key, measure.label
    fig, (ax_step, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for group in groups:
        for j, run in enumerate(group):
            if not run.evals:
                continue
            style = {
                "label": run.label if j == 0 else None,
                "alpha": 1.0 if j == 0 else 0.5,
                "marker": "o",
                "markersize": 3,
            }
            line = ax_step.plot([r["step"] for r in run.evals], [r[key] for r in run.evals], **style)[0]
            ax_time.plot(
                [r["elapsed_s"] for r in run.evals], [r[key] for r in run.evals], color=line.get_color(), **style
            )
    ax_step.set(title=f"{name} by step", xlabel="step", ylabel=name)
    ax_time.set(title=f"{name} by wall time (training + evaluation)", xlabel="seconds", ylabel=name)
    ax_step.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _throughput_bars(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    labels = [g[0].label for g in groups]
    task = _task(groups)
    # A language model's rate in tokens: every position of a sample is a prediction.
    per = [task.summary_rate(g[0].summary) for g in groups]
    t = [throughput(g) for g in groups]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups)), 4))
    medians = [x["median"] * k for x, k in zip(t, per)]
    errors = [
        [m - x["low"] * k for m, x, k in zip(medians, t, per)],
        [x["high"] * k - m for m, x, k in zip(medians, t, per)],
    ]
    ax.bar(labels, medians, yerr=errors, capsize=4, color="tab:blue")
    ax.set(title="throughput (median, spread)", ylabel=task.rate_unit)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig


def _step_time_bars(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    labels = [g[0].label for g in groups]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups)), 4))
    reader = [statistics.median(r["reader_cost"] for r in g[0].own_steps) * 1e3 for g in groups]
    compute = [statistics.median(r["batch_cost"] - r["reader_cost"] for r in g[0].own_steps) * 1e3 for g in groups]
    ax.bar(labels, compute, label="compute", color="tab:orange")
    ax.bar(labels, reader, bottom=compute, label="waiting for data", color="tab:gray")
    ax.set(title="step time breakdown (median)", ylabel="ms per step")
    ax.tick_params(axis="x", rotation=20)
    ax.legend()
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
