"""The numbers of the training comparison table: throughput (median samples/s and its spread, over
repeats or over steps after warm-up), time to a target training loss or held-out top-1, the
held-out and final values, each row's ratio to its reference row (table_rows), and the
environment table. FOOTNOTE says, under every table, how these numbers were taken. The module is
named stats, not statistics, so that it does not read as the standard library's, which it uses.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from unitrain.report.runs import Run, settings_of

FOOTNOTE = (
    "samples/s (tokens/s for a language model): median over steps after warm-up (or over repeats); final "
    "loss/top-1: mean of the last 10 training "
    "steps "
    "(not the last step's value); held-out: the last evaluation on data the model did not train on."
)


def _step_ips(run: Run) -> List[float]:
    own = run.own_steps
    warmup = run.summary["profiler"].get("warmup_steps", 0) if run.summary.get("profiler") else 0
    return [r["ips"] for r in own[warmup:]] or [r["ips"] for r in own]


def throughput(group: List[Run]) -> Dict[str, float]:
    """Median samples/s and its spread: over repeats when there are several, else over steps (p10-p90)."""
    if len(group) > 1:
        medians = [statistics.median(_step_ips(r)) for r in group]
        return {
            "median": statistics.median(medians),
            "low": min(medians),
            "high": max(medians),
            "over": f"{len(group)} repeats",
        }
    values = sorted(_step_ips(group[0]))
    pick = lambda q: values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(values), "low": pick(0.1), "high": pick(0.9), "over": f"{len(values)} steps"}


def time_to_loss(run: Run, target: float) -> Optional[float]:
    """Seconds until the loss first reached ``target``: the held-out measure where it is a loss
    (minimized: a language model's; wall time, training and evaluation, as time to accuracy counts
    it), else the training loss (step times)."""
    measure = run.task.measure
    if measure.direction == "minimize" and run.evals:
        return next((r["elapsed_s"] for r in run.evals if measure.reached(r[measure.key], target)), None)
    elapsed = 0.0
    for record in run.metrics:
        elapsed += record["batch_cost"]
        if record["loss"] <= target:
            return elapsed
    return None


def time_to_accuracy(run: Run, target: float) -> Optional[Dict[str, float]]:
    """Wall time (training and evaluation, as MLPerf counts it) and steps until the held-out
    top-1 first reached ``target``, or None."""
    for record in run.evals:
        if record["val_top1"] >= target:
            return {"seconds": record["elapsed_s"], "step": record["step"]}
    return None


def _time_to_accuracy_cell(group: List[Run], target: float) -> str:
    reached = [time_to_accuracy(r, target) for r in group]
    hits = [r for r in reached if r is not None]
    if not hits:
        return "not reached" if any(r.evals for r in group) else "n/a (no held-out set)"
    seconds, steps = [h["seconds"] for h in hits], [h["step"] for h in hits]
    if len(group) == 1:
        return f"{seconds[0]:.1f} s, step {steps[0]}"
    missed = f"; not reached in {len(group) - len(hits)}" if len(hits) < len(group) else ""
    spread = f"{min(seconds):.1f}-{max(seconds):.1f}"
    step = statistics.median(steps)
    return f"{statistics.median(seconds):.1f} s ({spread}), step {step:g} over {len(hits)} repeats{missed}"


def _held_out(group: List[Run], key: str, fmt: str) -> str:
    values = [(r.summary.get("eval") or {}).get(key) for r in group]
    values = [v for v in values if v is not None]
    return format(statistics.fmean(values), fmt) if values else "n/a"


def _mean_of(finals: List[Dict[str, Any]], key: str, fmt: str) -> str:
    values = [f[key] for f in finals if key in f]
    return format(statistics.fmean(values), fmt) if values else "n/a"


def table_rows(
    groups: List[List[Run]],
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> List[Dict[str, str]]:
    held_out = any(r.summary.get("eval") for g in groups for r in g)
    # A tuned row is never ranked against a same-settings row: each row's ratio refers to the
    # baseline when their settings agree, else to the first row with the row's own settings.
    settings = [settings_of(g[0]) for g in groups]
    rows = []
    for i, group in enumerate(groups):
        ref = baseline if settings[baseline] == settings[i] else settings.index(settings[i])
        row = _measured(
            group, groups[ref], i == ref, settings[i], "baseline" if ref == baseline else f"baseline ({settings[i]})"
        )
        if held_out:
            row.update(_held_out_cells(group))
        if target_loss is not None:
            reached = [time_to_loss(r, target_loss) for r in group]
            row["time to loss"] = ", ".join("not reached" if r is None else f"{r:.1f} s" for r in reached)
        if target_accuracy is not None:
            row[f"time to top-1 {target_accuracy:g}"] = _time_to_accuracy_cell(group, target_accuracy)
        rows.append(row)
    return rows


def _held_out_cells(group: List[Run]) -> Dict[str, str]:
    """The held-out columns the row's task names (a classifier: loss and top-1; a language model:
    loss, perplexity and bits per character or byte)."""
    summary = group[0].summary
    return {name: _held_out(group, key, fmt) for name, (key, fmt) in group[0].task.held_out_columns(summary).items()}


def _rate_cells(run: Run, t: Dict[str, Any]) -> Dict[str, str]:
    """Throughput in the task's unit: samples/s, or tokens/s for a language model (every position
    of a sample is a prediction)."""
    task = run.task
    per = task.summary_rate(run.summary)
    return {
        task.rate_unit: f"{t['median'] * per:.1f}",
        "spread": f"{t['low'] * per:.1f}-{t['high'] * per:.1f} ({t['over']})",
    }


def _measured(
    group: List[Run], reference: List[Run], is_reference: bool, settings: str, reference_name: str
) -> Dict[str, str]:
    """A row's own cells: what ran, its throughput against its reference row's, memory, losses."""
    s, t, base = group[0].summary, throughput(group), throughput(reference)
    finals = [r.summary.get("final") or {} for r in group]
    ratio = t["median"] / base["median"] if base["median"] else float("nan")
    overlap = not is_reference and t["low"] <= base["high"] and base["low"] <= t["high"]
    memory = max((r.summary.get("memory") or {}).get("peak_host_rss_mb", [0]) for r in group)
    p = s["precision"]
    return {
        "backend": s["backend"],
        "model": str((group[0].config.get("model") or {}).get("name", "?")),
        "amp requested": p["requested"],
        "amp effective": p["effective"],
        "world": str(s["world_size"]),
        "global batch": str(s["global_batch_size"]),
        "settings": settings,
        **_rate_cells(group[0], t),
        "vs baseline": reference_name if is_reference else f"x{ratio:.2f}" + (" (within noise)" if overlap else ""),
        "reader ratio": f"{100 * (s.get('profiler') or {}).get('reader_ratio', 0):.1f}%",
        "peak RSS MB": f"{max(memory):.0f}" if memory else "n/a",
        "final loss": _mean_of(finals, "loss", ".4f"),
        "final top-1": _mean_of(finals, "top1", ".3f"),
    }


def environment(runs: List[Run]) -> List[Dict[str, str]]:
    return [
        {
            "run": str(r.dir.name),
            "framework": f"{r.summary['framework']} {r.summary['version']}",
            "device": r.summary["device"],
            "threads": str(r.summary["threads"]),
            "BLAS kernels": r.summary.get("blas", "-"),
            "loader workers": str(r.config.get("data", {}).get("num_workers", "?")),
            "world": str(r.summary["world_size"]),
            "seed": str(r.summary["seed"]),
            "config hash": r.config_hash,
        }
        for r in runs
    ]
