"""The inference table and plot (``python -m unitrain.infer``'s inference.md and inference.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from unitrain.host.machine import describe_cpu
from unitrain.report import style
from unitrain.report.intervals import how_pairs_ran, ratio_text
from unitrain.report.tables import markdown as md_table
from unitrain.tasks.registry import task_of_inputs
from unitrain.tasks.task import Deployed, Task


# --- the report -------------------------------------------------------------------------------
def task_of_result(result: Dict[str, Any]) -> Task:
    """The task of every model timed, from the input kinds the result records (token windows in:
    a language model; a mix, or none recorded: images')."""
    return task_of_inputs(result.get("inputs") or ())


def table_rows(result: Dict[str, Any]) -> List[Dict[str, str]]:
    small, large = min(result["batches"]), max(result["batches"])
    reference = result.get("reference")
    shown = task_of_result(result).deployed
    rows = []
    for r in result["rows"]:
        lat = r.get("latency", {})
        b1, bn = lat.get(str(small)), lat.get(str(large))
        scored = r.get("accuracy")
        row = {
            "runtime": r["runtime"],
            "model file": r["name"],
            "trained with": r["trained_with"],
            f"p50 ms (batch {small})": f"{b1['p50_ms']:.2f}" if b1 else "-",
            f"p90 ms (batch {small})": f"{b1['p90_ms']:.2f}" if b1 else "-",
            f"p99 ms (batch {small})": f"{b1['p99_ms']:.2f}" if b1 else "-",
            f"speed vs {_first(reference)}": _ratio_cell(r, reference),
        }
        row.update(_scored_cells(shown, bn, scored, large))
        row["what ran"] = _what_ran(r)
        rows.append(row)
    return rows


def _scored_cells(
    shown: Deployed, bn: Dict[str, Any] | None, scored: Dict[str, Any] | None, large: int
) -> Dict[str, str]:
    """Throughput at the largest batch and the held-out scores, as the task shows them."""
    if not shown.per_position:
        return {
            f"{shown.rate_unit} (batch {large})": f"{bn[shown.rate_key]:.1f}" if bn else "-",
            shown.top1_label: f"{scored['top1']:.4f}" if scored else "-",
        }
    # A language model's sample is a window of tokens, every position predicted in one run.
    return {
        f"samples/s (batch {large})": f"{bn['throughput_ips']:.1f}" if bn else "-",
        f"{shown.rate_unit} (batch {large})": f"{bn[shown.rate_key]:.0f}" if bn and shown.rate_key in bn else "-",
        shown.top1_label: f"{scored['top1']:.4f}" if scored else "-",
        "held-out loss": f"{scored['loss']:.4f}" if scored and "loss" in scored else "-",
    }


def _first(reference: Dict[str, Any] | None) -> str:
    return "the first row" if reference is None else f"row 1 (batch {reference['batch']}, 95% CI)"


def _ratio_cell(row: Dict[str, Any], reference: Dict[str, Any] | None) -> str:
    """The row's speed against the first row, measured as interleaved pairs (>1: faster)."""
    if reference is None:
        return "-"
    if row["name"] == reference["name"] and row["runtime"] == reference["runtime"]:
        return "reference"
    pair = row.get("vs_reference")
    if not pair:
        return "-"
    return f"FAILED: {pair['error']}" if "error" in pair else ratio_text(pair)


def _what_ran(row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"FAILED: {row['error']}"
    seen = row.get("observed", {})
    return "; ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in seen.items()
        if k not in ("version", "kernels")
    )


def markdown(result: Dict[str, Any]) -> str:
    if task_of_result(result).deployed.per_position:
        tokens = next((r["tokens_per_sample"] for r in result["rows"] if r.get("tokens_per_sample")), "?")
        scored = (
            f"A sample is a window of {tokens} token ids; tokens/s = samples/s x {tokens} (every position's next "
            f"token is predicted in one run). Held-out next-token top-1 and loss (nats per token) over "
            f"{result['eval_samples']} windows"
        )
        data = next((r["eval_data"] for r in result["rows"] if r.get("eval_data")), None)
        scored += f" ({data})." if data else "."
    else:
        scored = f"Held-out top-1 over {result['eval_samples']} samples."
    return (
        md_table(table_rows(result)) + f"\n\nCPU: {describe_cpu(result['cpu'], {})}; "
        f"{result['threads']} thread(s) for every runtime. Timed: {result['timed']}; warm-up excluded; medians over "
        f"at least {result['min_iters']} runs. {scored} Speed against the "
        f"first row: the median, with its 95% interval, of {result.get('pairs', 0)} interleaved pairs of runs "
        "(reference / row time per run; above 1: faster); " + how_pairs_ran()
    )


def plot(result: Dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result["rows"] if "error" not in r]
    small, large = str(min(result["batches"])), str(max(result["batches"]))
    colors = style.colors()
    fig, axes = plt.subplots(1, 2, figsize=(12, max(3, 0.45 * len(ok) + 1.5)))
    labels = [f"{r['runtime']}\n{r['name']}" for r in ok]
    shown = task_of_result(result).deployed
    for ax, batch, key, title in (
        (axes[0], small, "p50_ms", f"latency at batch {small} (ms; p50, bar to p99)"),
        (axes[1], large, shown.rate_key, f"throughput at batch {large} ({shown.rate_axis})"),
    ):
        values = [r["latency"].get(batch, {}).get(key, 0.0) for r in ok]
        err = None
        if key == "p50_ms":
            err = [
                [0.0] * len(ok),
                [max(0.0, r["latency"].get(batch, {}).get("p99_ms", 0.0) - v) for r, v in zip(ok, values)],
            ]
        ax.barh(
            range(len(ok)),
            values,
            xerr=err,
            color=[colors.get(r["framework"], "grey") for r in ok],
            alpha=0.85,
            hatch=[("//" if r["format"] == "onnx" else "") for r in ok],
        )
        ax.set_yticks(range(len(ok)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
    axes[1].set_yticks([])
    fig.suptitle(
        f"inference, {result['threads']} thread(s); colour: framework that wrote the model file "
        f"({style.color_legend()}; ONNX hatched)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
