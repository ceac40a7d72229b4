"""The parameter-server comparison: one row per job (backend x mode), a table and a plot.

Rows come from each job's summary.json (``"kind": "ps"``) and metrics.jsonl; compare.py adds
them to comparison.md and report.html, and a single ps job prints its own row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unitrain.report.runs import results_under

SMOOTH = 20  # steps in the plotted moving mean

NOTE = (
    "examples/s: median over steps (the first 2 left out), per trainer and summed over trainers. "
    "AUC and log loss on held-out rows, evaluated by trainer 0 after every trainer finished; a log loss no "
    "better than predicting the held-out positive rate for every row says so (the model learned nothing). "
    "Table rows: the rows the servers' sparse tables created (an id's row is created when it is first seen). "
    "Peak RSS: each process's own peak resident memory. "
    "Traffic: what the engine reports (Paddle) or unitrain counts on the servers (torch). "
    "Anchor: Paddle's own CTR-DNN benchmark on Criteo lost AUC as async trainers grew (0.7938 with 5, 0.7896 with 20)."
)


def results(dirs: Sequence[str | Path]) -> List[Tuple[Path, Dict[str, Any]]]:
    found = []
    for d in map(Path, dirs):
        files = [d / "summary.json"] if (d / "summary.json").exists() else results_under(d, "summary.json")
        for f in files:
            try:
                summary = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(summary, dict) and summary.get("kind") == "ps":
                found.append((f.parent, summary))
    return found


def _traffic(summary: Dict[str, Any]) -> str:
    traffic = (summary.get("observed") or {}).get("traffic")
    if not traffic:
        return "n/a"
    return ", ".join(
        f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
        for k, v in traffic.items()
    )


def _memory(summary: Dict[str, Any]) -> str:
    memory = summary.get("memory")
    if not memory:
        return "n/a"

    def listed(values) -> str:
        return ", ".join("n/a" if v is None else f"{v:.0f}" for v in values) or "-"

    return f"{listed(memory['server_peak_rss_mb'])} / {listed(memory['trainer_peak_rss_mb'])}"


def _log_loss(evaluation: Dict[str, Any]) -> str:
    if not evaluation:
        return "n/a"
    cell = f"{evaluation['val_logloss']:.4f}"
    base = evaluation.get("base_rate_logloss")
    if base is not None and evaluation["val_logloss"] >= base:
        cell += f" (no better than the base rate's {base:.4f})"
    return cell


def rows(found: List[Tuple[Path, Dict[str, Any]]]) -> List[Dict[str, str]]:
    out = []
    for _, s in found:
        evaluation = s.get("eval") or {}
        mode = s["mode"] + (f" (k={s['geo_k_steps']})" if s.get("geo_k_steps") else "")
        out.append(
            {
                "backend": s["backend"],
                "framework": f"{s['framework']} {s['version']}",
                "mode": mode,
                "servers x trainers": f"{s['servers']} x {s['trainers']}",
                "threads/process": str(s["threads"]),
                "examples/s per trainer": ", ".join(f"{v:.0f}" for v in s["examples_per_s_per_trainer"]),
                "examples/s total": f"{s['examples_per_s']:.0f}",
                "held-out AUC": f"{evaluation['val_auc']:.4f}" if evaluation else "n/a",
                "held-out log loss": _log_loss(evaluation),
                "train loss first -> last": f"{_loss(s['first_loss'])} -> {_loss(s['final_loss'])}",
                "optimizer": s.get("optimizer", "n/a"),
                "table rows": f"{s['tables']['rows']:,}" if s.get("tables") else "n/a",
                "peak RSS MB servers / trainers": _memory(s),
                "traffic": _traffic(s),
            }
        )
    return out


def markdown(found: List[Tuple[Path, Dict[str, Any]]]) -> str:
    from unitrain.report.tables import markdown as table

    return table(rows(found)) + "\n\n" + NOTE


def plot(found: List[Tuple[Path, Dict[str, Any]]], path: Path) -> Path:
    """Training loss against examples seen by trainer 0, and total examples/s beside held-out AUC."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = []
    for run_dir, s in found:
        label = f"{s['backend']} {s['mode']} {s['servers']}x{s['trainers']}"
        labels.append(label)
        metrics = run_dir / "metrics.jsonl"
        records = (
            [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
        )
        steps = [r for r in records if r.get("loss") is not None]
        if len(steps) >= SMOOTH:
            # A moving mean: one batch's loss is too noisy to tell the rows apart.
            losses = np.convolve([r["loss"] for r in steps], np.ones(SMOOTH) / SMOOTH, mode="valid")
            curves.plot([r["step"] * s["batch_size"] for r in steps[SMOOTH - 1 :]], losses, label=label, linewidth=1)
    curves.set(
        xlabel="examples seen by trainer 0", ylabel=f"training loss, mean of {SMOOTH} steps", title="Training loss"
    )
    curves.legend(fontsize=8)
    speeds = [s["examples_per_s"] for _, s in found]
    drawn = bars.barh(range(len(found)), speeds, color="tab:blue")
    bars.set_yticks(range(len(found)), labels, fontsize=8)
    bars.set(xlabel="examples/s, all trainers", title="Throughput (label: held-out AUC)")
    for bar, (_, s) in zip(drawn, found):
        auc = (s.get("eval") or {}).get("val_auc")
        bars.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" AUC {auc:.3f}" if auc is not None else " n/a",
            va="center",
            fontsize=8,
        )
    bars.set_xlim(0, max(speeds) * 1.3 if speeds else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _loss(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4f}"
